"""The jieba segmenter and its chunk function; light imports (no Prefect, no MLflow), so pool workers start fast."""
from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

import jieba
import jieba.posseg
import pandas as pd

from flows.chunks import Chunk, read_chunk
from flows.config import PROJECT_ROOT, SegmentConfig
from flows.errors import DataError

jieba.setLogLevel(logging.WARNING)


@lru_cache(maxsize=1)
def default_tokenizer() -> jieba.Tokenizer:
    """jieba's dictionary, loaded once per process (once in all for forked workers: see tasks.segment)."""
    tokenizer = jieba.Tokenizer()
    tokenizer.initialize()
    return tokenizer


class Segmenter:
    """A configured jieba tokenizer (own dictionary state, so user dictionaries never leak between configs)."""

    def __init__(self, params: SegmentConfig):
        self.params = params
        # a user dictionary gets a tokenizer of its own, so it never leaks into other configs
        self.tokenizer = jieba.Tokenizer() if params.user_dict else default_tokenizer()
        if params.user_dict:
            self.tokenizer.load_userdict(str(_project_path(params.user_dict, "segment.user_dict")))
        self.stopwords = set()
        if params.stopwords:
            path = _project_path(params.stopwords, "segment.stopwords")
            self.stopwords = {w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip()}
        self.pos_tokenizer = jieba.posseg.POSTokenizer(self.tokenizer) if params.pos else None

    def words(self, text: str) -> list[str]:
        """Word tokens in the configured mode, whitespace and stopwords removed."""
        p = self.params
        if p.mode == "search":
            tokens = self.tokenizer.cut_for_search(text, HMM=p.hmm)
        else:
            tokens = self.tokenizer.cut(text, cut_all=p.mode == "full", HMM=p.hmm)
        return [t for t in tokens if t.strip() and t not in self.stopwords]

    def pos(self, text: str) -> list[str]:
        """`word/flag` pairs from jieba.posseg (precise mode)."""
        return [f"{w}/{f}" for w, f in self.pos_tokenizer.cut(text, HMM=self.params.hmm) if w.strip()]

    def rows(self, texts: list[str]) -> dict[str, list[str]]:
        """Space-joined word, char (and POS) token strings for a list of texts."""
        out = {
            "words": [" ".join(self.words(t)) for t in texts],
            "chars": [" ".join(c for c in t if not c.isspace()) for t in texts],
        }
        if self.pos_tokenizer is not None:
            out["pos"] = [" ".join(self.pos(t)) for t in texts]
        return out


def _project_path(value: str, key: str) -> Path:
    path = Path(value) if Path(value).is_absolute() else PROJECT_ROOT / value
    if not path.is_file():
        raise DataError(f"{key}: file not found: {path}")
    return path


@lru_cache(maxsize=4)
def _segmenter(params_json: str) -> Segmenter:
    """One Segmenter per process and config (a chunk worker keeps it across chunks)."""
    return Segmenter(SegmentConfig.model_validate_json(params_json))


def segment_chunk(chunk: Chunk, params_json: str) -> pd.DataFrame:
    """Chunk function: a chunk of a split with its `words`, `chars` (and `pos`) columns added."""
    df = read_chunk(chunk)
    for col, values in _segmenter(params_json).rows(df["text"].tolist()).items():
        df[col] = values
    return df
