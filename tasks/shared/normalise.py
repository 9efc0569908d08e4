"""Text normalising every kind's cleaning shares: NFKC, HTML and URLs stripped, control characters
removed, traditional to simplified characters (OpenCC), and the length limits."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import pandas as pd
from pydantic import Field

from tasks.core import Section


class Normalise(Section):
    """What cleaning a text reads: every kind's `clean` section starts from it."""

    nfkc: bool = True  # full-width to half-width
    strip_html: bool = True
    strip_urls: bool = True
    traditional_to_simplified: bool = False  # OpenCC t2s
    min_chars: int = Field(2, ge=0)
    max_chars: int = Field(5000, ge=1)
    dedupe: bool = True


_HTML_TAG = re.compile(r"<[^>]{1,200}>")


_URL = re.compile(r"(?:https?://|www\.)[^\s\u4e00-\u9fff，。！？、；：]+", re.IGNORECASE)


CONTROL = re.compile(
    r"[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202f\u2060-\u206f\ufeff]"
)


_SPACE = re.compile(r"\s+")


@lru_cache(maxsize=1)
def to_simplified():
    import opencc

    return opencc.OpenCC("t2s")


def clean_text(text: str, params: Normalise) -> str:
    """One text through the normalisation steps, in order."""
    if params.nfkc:
        # full-width letters, digits and punctuation to half-width
        text = unicodedata.normalize("NFKC", text)
    if params.strip_html:
        text = _HTML_TAG.sub(" ", text)
        text = (
            text.replace("&nbsp;", " ")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
        )
    if params.strip_urls:
        text = _URL.sub(" ", text)
    text = CONTROL.sub("", text)  # BOM, zero-width and control characters
    text = _SPACE.sub(" ", text).strip()
    if params.traditional_to_simplified:
        text = to_simplified().convert(text)
    return text


def length_reasons(text: pd.Series, params: Normalise) -> pd.Series:
    """`empty`, `too_short` or `too_long` per text, else missing."""
    length = text.str.len()
    reason = pd.Series(pd.NA, index=text.index, dtype="string")
    reason[length == 0] = "empty"
    reason[reason.isna() & (length < params.min_chars)] = "too_short"
    reason[reason.isna() & (length > params.max_chars)] = "too_long"
    return reason
