"""The word segmenter: jieba (Python) or jieba-rs (its Rust port, `rjieba`, the same dictionary and
HMM), with the same modes, user dictionaries, stopwords and POS tags, and its parameters. Used by
the segment stage, the augmenters (new texts are cut the same way) and served models."""

from __future__ import annotations

import logging
import os
import re
import stat
import tempfile
from functools import cache, lru_cache
from pathlib import Path
from typing import Literal

from tasks.core import Section
from tasks.errors import DataError

_SPACE = re.compile(r"\s+")


@lru_cache(maxsize=1)
def jieba_cache_dir() -> str:
    """A folder of this user's own for jieba's dictionary cache. jieba's default is `jieba.cache` in
    the shared temporary folder, which anyone on the machine could plant to change how every text is
    cut (without changing a key); this one is `zhpipe-jieba-<uid>` there, created mode 700. When
    someone else holds that name (a link, another user's folder, one open to others), which the user
    cannot remove in a sticky /tmp, a fresh folder is made instead (mkdtemp), with one warning
    line."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    path = Path(tempfile.gettempdir()) / f"zhpipe-jieba-{uid if uid is not None else 'user'}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
        ours = (
            not stat.S_ISLNK(info.st_mode)
            and stat.S_ISDIR(info.st_mode)
            and (uid is None or (info.st_uid == uid and not info.st_mode & 0o077))
        )
    except OSError:
        ours = False
    if ours:
        return str(path)
    fresh = tempfile.mkdtemp(prefix=f"zhpipe-jieba-{uid}-")
    logging.getLogger("zhpipe").warning(
        "%s is not a private folder of yours (a link, another user's, or open to "
        "others): jieba's cache goes to %s instead",
        path,
        fresh,
    )
    return fresh


@cache
def _jieba():
    """jieba, imported when text is first cut (not when a config is read), its cache in a folder of
    our own; set up once per process (jieba's `setLogLevel` alone walks every logger of the process:
    a millisecond per call, and taggers ask for jieba's words once per text)."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.dt.tmp_dir = jieba_cache_dir()
    return jieba


def jieba_tokenizer():
    """A new jieba Tokenizer whose cache is in `jieba_cache_dir()`."""
    tokenizer = _jieba().Tokenizer()
    tokenizer.tmp_dir = jieba_cache_dir()
    return tokenizer


class SegmenterParams(Section):
    """How text is cut into words (the segment stage's section, and what a served model segments
    with)."""

    # jieba-rs: the Rust port of jieba (package rjieba), about 25x faster on one core with jieba's
    # dictionary; it agrees with jieba on most texts and differs in runs of digits, Latin letters
    # and punctuation (docs/segmentation.md has the measured agreement)
    backend: Literal["jieba", "jieba-rs"] = "jieba-rs"
    mode: Literal["precise", "search", "full"] = "precise"
    hmm: bool = True  # HMM discovers words missing from the dictionary
    user_dict: str | None = None  # jieba user dictionary: "word [freq] [pos]" per line
    stopwords: str | None = None  # one word per line; dropped from word tokens only
    pos: bool = False  # also store jieba.posseg tags (slower)


@lru_cache(maxsize=1)
def default_tokenizer():
    """jieba's dictionary, loaded once per process (once in all for forked workers: see
    tasks.shared.segment)."""
    tokenizer = jieba_tokenizer()
    tokenizer.initialize()
    return tokenizer


@lru_cache(maxsize=1)
def default_rs():
    """jieba-rs with jieba's dictionary, loaded once per process."""
    import rjieba

    return rjieba.Jieba()


class RustTokenizer:
    """jieba-rs behind the calls the Segmenter makes of a jieba Tokenizer (cut, cut_for_search, POS
    tags)."""

    def __init__(self, user_dict: Path | None):
        import rjieba

        self.rs = rjieba.Jieba() if user_dict else default_rs()
        if user_dict:  # jieba's format: "word [freq] [pos]" per line
            for line in user_dict.read_text(encoding="utf-8").splitlines():
                parts = line.strip().split()
                if not parts:
                    continue
                freq = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
                tag = parts[-1] if len(parts) > 1 and not parts[-1].isdigit() else None
                self.rs.add_word(parts[0], freq, tag)

    # jieba's name
    def cut(self, text: str, cut_all: bool = False, HMM: bool = True) -> list[str]:  # noqa: N803
        return self.rs.cut_all(text) if cut_all else self.rs.cut(text, HMM)

    def cut_for_search(self, text: str, HMM: bool = True) -> list[str]:  # noqa: N803
        return self.rs.cut_for_search(text, HMM)

    def tag(self, text: str, HMM: bool = True) -> list[tuple[str, str]]:  # noqa: N803
        return [(w, f or "x") for w, f in self.rs.tag(text, HMM)]


class Segmenter:
    """A configured tokenizer (own dictionary state, so user dictionaries never leak between
    configs)."""

    def __init__(self, params: SegmenterParams, root: Path | None = None):
        self.params = params
        root = root or Path.cwd()  # relative dictionary paths start in the project folder
        self.stopwords = set()
        if params.stopwords:
            path = _project_path(params.stopwords, "segment.stopwords", root)
            self.stopwords = {
                w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip()
            }
        if params.backend == "jieba-rs":
            self.tokenizer = RustTokenizer(
                _project_path(params.user_dict, "segment.user_dict", root)
                if params.user_dict
                else None
            )
            self.pos_tokenizer = self.tokenizer if params.pos else None
            return
        # a user dictionary gets a tokenizer of its own, so it never leaks into other configs
        jieba = _jieba()
        self.tokenizer = jieba_tokenizer() if params.user_dict else default_tokenizer()
        if params.user_dict:
            self.tokenizer.load_userdict(
                str(_project_path(params.user_dict, "segment.user_dict", root))
            )
        if params.pos:
            import jieba.posseg

            self.pos_tokenizer = jieba.posseg.POSTokenizer(self.tokenizer)
        else:
            self.pos_tokenizer = None

    def words(self, text: str) -> list[str]:
        """Word tokens in the configured mode, whitespace and stopwords removed."""
        p = self.params
        if p.mode == "search":
            tokens = self.tokenizer.cut_for_search(text, HMM=p.hmm)
        else:
            tokens = self.tokenizer.cut(text, cut_all=p.mode == "full", HMM=p.hmm)
        return [t for t in tokens if t.strip() and t not in self.stopwords]

    @staticmethod
    def chars(texts: list[str]) -> list[str]:
        """Space-joined character tokens (whitespace dropped) of each text."""
        # re's \s is str.isspace (both Py_UNICODE_ISSPACE): the same tokens as a per-character test,
        # in C
        return [" ".join(_SPACE.sub("", t)) for t in texts]

    def pos(self, text: str) -> list[str]:
        """`word/flag` pairs from jieba.posseg or jieba-rs's tagger (precise mode)."""
        if isinstance(self.pos_tokenizer, RustTokenizer):
            return [
                f"{w}/{f}"
                for w, f in self.pos_tokenizer.tag(text, HMM=self.params.hmm)
                if w.strip()
            ]
        return [
            f"{w}/{f}" for w, f in self.pos_tokenizer.cut(text, HMM=self.params.hmm) if w.strip()
        ]

    def rows(self, texts: list[str]) -> dict[str, list[str]]:
        """Space-joined word, char (and POS) token strings for a list of texts."""
        out = {"words": [" ".join(self.words(t)) for t in texts], "chars": self.chars(texts)}
        if self.pos_tokenizer is not None:
            out["pos"] = [" ".join(self.pos(t)) for t in texts]
        return out


def _project_path(value: str, key: str, root: Path) -> Path:
    path = Path(value) if Path(value).is_absolute() else root / value
    if not path.is_file():
        raise DataError(f"{key}: file not found: {path}")
    return path
