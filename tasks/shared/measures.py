"""What the data checks measure on texts, each a plain function of a Series of texts: mojibake
(UTF-8 read as Latin-1), the share of CJK letters, of traditional characters, word OOV against a
vocabulary, the keys near-duplicates compare (tasks/shared/checks.py judges a night by them)."""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pandas as pd

# UTF-8 read as Latin-1 or cp1252: a lead byte of a 3-byte character (à..ï) and two continuation
# bytes
_MOJIBAKE = re.compile(
    "[\u00e0-\u00ef][\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192\u02c6\u02dc"
    "\u2013\u2014\u2018-\u201e\u2020-\u2022\u2026\u2030\u2039\u203a\u20ac\u2122]{2}"
)


_LEAD = re.compile("[\u00e0-\u00ef]")


def looks_mojibake(text: str) -> bool:
    """UTF-8 read as Latin-1 or cp1252, raw or after cleaning (NFKC and control-character removal
    break up the continuation bytes, never the lead bytes: one in three characters of a Chinese text
    so read)."""
    if _MOJIBAKE.search(text):
        return True
    leads = len(_LEAD.findall(text))
    return leads >= 3 and leads >= 0.15 * len(text)


def mojibake_share(texts: pd.Series) -> float:
    return float(np.mean([looks_mojibake(t) for t in texts])) if len(texts) else 0.0


def _is_cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf" or "\uf900" <= ch <= "\ufaff"


def cjk_share(texts: pd.Series) -> float:
    """Of the letters (Unicode category L*) in `texts`, the share that are CJK ideographs."""
    letters = cjk = 0
    for text in texts:
        for ch in text:
            if unicodedata.category(ch)[0] == "L":
                letters += 1
                cjk += _is_cjk(ch)
    return cjk / letters if letters else 0.0


def traditional_share(texts: pd.Series) -> float:
    """The share of texts that OpenCC's traditional-to-simplified conversion changes."""
    from tasks.shared.normalise import to_simplified

    convert = to_simplified().convert
    return float(np.mean([convert(t) != t for t in texts])) if len(texts) else 0.0


def words(texts: pd.Series) -> list[list[str]]:
    """Words as jieba cuts them (jieba-rs: jieba's dictionary and algorithm, several times faster),
    punctuation, spaces and symbols left out."""
    from tasks.util.segmenter import default_rs

    cut = default_rs().cut
    return [
        [
            w
            for w in cut(t, True)
            if w.strip() and not unicodedata.category(w[0]).startswith(("P", "Z", "S"))
        ]
        for t in texts
    ]


def oov_rate(tokens: list[list[str]], vocab: set[str]) -> float:
    flat = [w for ws in tokens for w in ws]
    return sum(w not in vocab for w in flat) / len(flat) if flat else 0.0


_NOT_WORD = re.compile(r"[^\w]|_", re.UNICODE)


def near_key(texts: pd.Series) -> pd.Series:
    """Texts as near-duplicates compare: letters and digits only, lower case (punctuation, spaces,
    emoji dropped)."""
    return texts.astype(str).str.lower().str.replace(_NOT_WORD, "", regex=True)
