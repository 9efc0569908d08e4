"""Tokens of the two sides of a sentence pair, and back to text. English is split into words and
punctuation, a word that follows white space marked with `▁` (as SentencePiece does), so the tokens
join back into the exact text; Chinese tokens are the segment stage's characters or jieba words and
join without spaces."""

from __future__ import annotations

import re
import unicodedata

import pandas as pd

SPACE_MARK = "\u2581"
_EN_TOKEN = re.compile(r"\s*(?:[^\W_]+|\S)")
_ALNUM = re.compile(r"[\W_]+")


def en_tokens(text: str) -> list[str]:
    """Words, digits runs and single punctuation marks; a token preceded by white space starts with
    `▁`."""
    return [
        (SPACE_MARK + m.lstrip()) if m[0].isspace() or i == 0 else m
        for i, m in enumerate(_EN_TOKEN.findall(text))
    ]


def en_text(tokens: list[str]) -> str:
    """The inverse of `en_tokens`."""
    return "".join(tokens).replace(SPACE_MARK, " ").strip()


def zh_text(tokens: list[str]) -> str:
    return "".join(tokens)


def side_tokens(frame: pd.DataFrame, lang: str, zh_tokens: str) -> list[list[str]]:
    """Each row's tokens of one side: `en` tokenised here, Chinese from the segment stage's
    column."""
    if lang == "en":
        return [en_tokens(t) for t in frame["en"].astype(str)]
    return [line.split() for line in frame[zh_tokens].astype(str)]


def detokenize(tokens: list[str], lang: str) -> str:
    return en_text(tokens) if lang == "en" else zh_text(tokens)


def pair_key(text: str) -> str:
    """What near-identical sentences share: case, punctuation, width and white space removed (`Hi.`
    and `hi!`, `你好。` and `你好！`)."""
    return _ALNUM.sub("", unicodedata.normalize("NFKC", text).casefold())


def sides(direction: str) -> tuple[str, str]:
    """`zh-en` -> ("zh", "en")."""
    src, _, tgt = direction.partition("-")
    return src, tgt
