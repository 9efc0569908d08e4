"""n-gram language models: fixed-weight back-off (normalised) or interpolated Kneser-Ney, and the
language-model classifier (one LM per class)."""

from __future__ import annotations

import gzip
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from tasks.core import Section
from tasks.models.base import ModelSpec
from tasks.shared.as_is import original_rows
from tasks.util.io import batches_of, columns_of

BOS, EOS, UNK = "<s>", "</s>", "<unk>"


class Params(Section):
    """The `train.ngram_lm` and `train.lm_classifier` sections."""

    n: int = Field(3, ge=1, le=6)
    # backoff = fixed weight, as in the course notes
    method: Literal["backoff", "kneser_ney"] = "kneser_ney"
    # weight of the lower order for an unseen n-gram (backoff)
    backoff: float = Field(0.4, gt=0, lt=1)
    discount: float = Field(0.75, gt=0, lt=1)  # absolute discount (kneser_ney)
    tokens: Literal["words", "chars"] = "words"


class NgramLM:
    """P(w | previous n-1 tokens) over a closed vocabulary plus <unk> and </s>; sums to 1 for any
    context."""

    def __init__(self, config: Params):
        if config.n < 1 or config.method not in ("backoff", "kneser_ney"):
            raise ValueError(f"ngram: n >= 1 and method backoff|kneser_ney expected, got {config}")
        self.config = config
        self._z: dict[tuple, float] = {}

    def fit(self, sentences: Iterable[list[str]]) -> NgramLM:
        """Count n-grams of every order ending at each predicted token (the real tokens and </s>),
        in one pass over `sentences` (a generator reading a split in batches will do)."""
        n = self.config.n
        self.vocab = {UNK, EOS}
        raw = [Counter() for _ in range(n + 1)]  # raw[k][k-gram]
        for s in sentences:
            self.vocab.update(s)
            padded = [BOS] * (n - 1) + s + [EOS]
            for j in range(n - 1, len(padded)):
                for k in range(1, n + 1):
                    raw[k][tuple(padded[j - k + 1 : j + 1])] += 1
        # 1. the counts each order's distribution uses: raw for the highest order (and for
        #    back-off);
        #    for Kneser-Ney's lower orders, continuation counts N1+(. h w) = distinct left
        #    extensions
        self.counts = raw
        if self.config.method == "kneser_ney":
            self.counts = [Counter() for _ in range(n + 1)]
            self.counts[n] = raw[n]
            for k in range(1, n):
                for gram in raw[k + 1]:
                    self.counts[k][gram[1:]] += 1
        return self._index()

    def _index(self) -> NgramLM:
        """Per-context totals, numbers of distinct continuations and the continuations themselves,
        from counts."""
        n = self.config.n
        self.total = [defaultdict(int) for _ in range(n + 1)]
        self.types = [defaultdict(int) for _ in range(n + 1)]
        self.followers = [defaultdict(list) for _ in range(n + 1)]
        for k in range(1, n + 1):
            for gram, c in self.counts[k].items():
                self.total[k][gram[:-1]] += c
                self.types[k][gram[:-1]] += 1
                self.followers[k][gram[:-1]].append(gram[-1])
        self._z.clear()
        return self

    def prob(self, word: str, context: list[str] | tuple) -> float:
        """P(word | the last n-1 tokens of context); unknown tokens count as <unk>."""
        word = word if word in self.vocab else UNK
        h = (
            tuple(t if t in self.vocab or t == BOS else UNK for t in context)[
                -(self.config.n - 1) :
            ]
            if self.config.n > 1
            else ()
        )
        return self._kn(word, h) if self.config.method == "kneser_ney" else self._backoff(word, h)

    def _kn(self, w: str, h: tuple) -> float:
        k, d = len(h) + 1, self.config.discount
        total = self.total[k].get(h, 0)
        if total == 0:
            return self._kn(w, h[1:]) if h else 1 / len(self.vocab)
        lower = self._kn(w, h[1:]) if h else 1 / len(self.vocab)
        return (
            max(self.counts[k].get(h + (w,), 0) - d, 0) / total
            + d * self.types[k][h] / total * lower
        )

    def _backoff(self, w: str, h: tuple) -> float:
        if not h:  # add-one unigram, so <unk> and unseen words keep some mass
            return (self.counts[1].get((w,), 0) + 1) / (self.total[1][()] + len(self.vocab))
        total = self.total[len(h) + 1].get(h, 0)
        if total == 0:
            return self._backoff(w, h[1:])
        c = self.counts[len(h) + 1].get(h + (w,), 0)
        score = c / total if c else self.config.backoff * self._backoff(w, h[1:])
        return score / self._normaliser(h)

    def _normaliser(self, h: tuple) -> float:
        """Z(h) = 1 + alpha * (1 - sum of lower-order P over h's seen continuations): makes back-off
        sum to 1."""
        if h not in self._z:
            seen = sum(self._backoff(w, h[1:]) for w in self.followers[len(h) + 1][h])
            self._z[h] = 1 + self.config.backoff * (1 - seen)
        return self._z[h]

    def log_prob(self, sentence: list[str]) -> tuple[float, int]:
        """Natural-log probability of a sentence (with </s>) and the number of predicted tokens."""
        padded = [BOS] * (self.config.n - 1) + sentence + [EOS]
        start = self.config.n - 1
        return sum(
            math.log(self.prob(padded[j], padded[j - start : j])) for j in range(start, len(padded))
        ), len(padded) - start

    def perplexity(self, sentences: Iterable[list[str]]) -> float:
        """exp of the mean negative log-probability per predicted token."""
        total, count = 0.0, 0
        for s in sentences:
            lp, c = self.log_prob(s)
            total, count = total + lp, count + c
        return math.exp(-total / count)

    def to_json(self) -> dict:
        """The model as plain data: its config, vocabulary and n-gram counts (what `from_json`
        rebuilds from)."""
        return {
            "config": self.config.model_dump(),
            "vocab": sorted(self.vocab),
            "counts": [[[list(gram), c] for gram, c in order.items()] for order in self.counts],
        }

    @classmethod
    def from_json(cls, doc: dict) -> NgramLM:
        lm = cls(Params(**doc["config"]))
        lm.vocab = set(doc["vocab"])
        lm.counts = [Counter({tuple(gram): c for gram, c in order}) for order in doc["counts"]]
        return lm._index()


def _save(doc: dict, path: Path) -> None:
    """Gzipped JSON (no timestamp inside, so the same model gives the same bytes)."""
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(doc, ensure_ascii=False).encode("utf-8"))


def _load(path: Path) -> dict:
    with gzip.open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def sentences(
    data, tokens: str, label: str | None = None, originals: bool = False, seen: list | None = None
) -> Iterator[list[str]]:
    """Each text's tokens, read a batch at a time from a split (a `Rows` or a frame): only the
    original rows (`original_rows`) and one class's when asked; `seen` (a one-item list) counts the
    texts given."""
    wanted = [
        tokens,
        *(["label"] if label is not None else []),
        *(["aug_method"] if originals else []),
    ]
    for batch in batches_of(data, [c for c in wanted if c in columns_of(data)]):
        if originals:
            batch = original_rows(batch)
        if label is not None:
            batch = batch[batch["label"] == label]
        if seen is not None:
            seen[0] += len(batch)
        for text in batch[tokens]:
            yield text.split()


def train_ngram_lm(train, validation, section, out: Path) -> dict:
    """Fit on the original (not augmented) train rows; save `ngram_lm/model.json.gz`; report
    validation perplexity."""
    folder = out / "ngram_lm"
    folder.mkdir()
    t0, seen = time.perf_counter(), [0]
    lm = NgramLM(section).fit(sentences(train, section.tokens, originals=True, seen=seen))
    seconds = time.perf_counter() - t0
    _save({"model": lm.to_json(), "tokens": section.tokens}, folder / "model.json.gz")
    return {
        "path": "ngram_lm",
        "kind": "lm",
        "seconds": seconds,
        "history": [],
        "samples_per_second": seen[0] / seconds,
        "val_perplexity": lm.perplexity(sentences(validation, section.tokens)),
    }


def lm_perplexity(folder: Path, df) -> float:
    """Perplexity of a split's texts (a frame or a `Rows`) under a saved n-gram LM."""
    saved = _load(folder / "model.json.gz")
    return NgramLM.from_json(saved["model"]).perplexity(sentences(df, saved["tokens"]))


def train_lm_classifier(train, labels: list[str], section, out: Path) -> dict:
    """One n-gram LM per class on the original train rows; save `lm_classifier/model.json.gz`."""
    folder = out / "lm_classifier"
    folder.mkdir()
    t0, seen = time.perf_counter(), [0]
    models = [
        NgramLM(section).fit(sentences(train, section.tokens, label, originals=True, seen=seen))
        for label in labels
    ]
    seconds = time.perf_counter() - t0
    _save(
        {"models": [m.to_json() for m in models], "labels": labels, "tokens": section.tokens},
        folder / "model.json.gz",
    )
    return {
        "path": "lm_classifier",
        "kind": "lm_classifier",
        "seconds": seconds,
        "history": [],
        "samples_per_second": seen[0] / seconds,
    }


def lm_classifier_predictor(folder: Path):
    """Class probabilities: softmax over each class LM's log-probability of the text (argmax =
    lowest perplexity)."""
    saved = _load(folder / "model.json.gz")
    models = [NgramLM.from_json(doc) for doc in saved["models"]]

    def predict(df) -> np.ndarray:
        scores = np.array([[m.log_prob(s.split())[0] for m in models] for s in df[saved["tokens"]]])
        scores -= scores.max(axis=1, keepdims=True)
        probs = np.exp(scores)
        return (probs / probs.sum(axis=1, keepdims=True)).astype(np.float32)

    return predict


NGRAM_LM = ModelSpec(
    "ngram_lm",
    Params,
    lambda i: train_ngram_lm(i.train, i.validation, i.section, i.out),
    perplexity=lm_perplexity,
    shared=(),
    streams=True,
    about="an n-gram language model (Kneser-Ney or fixed back-off); scored by test perplexity",
    libraries=(),
)
LM_CLASSIFIER = ModelSpec(
    "lm_classifier",
    Params,
    lambda i: train_lm_classifier(i.train, i.labels, i.section, i.out),
    cost=0,
    load=lm_classifier_predictor,
    shared=(),
    streams=True,
    about="one n-gram LM per class; the lowest perplexity wins",
    libraries=(),
)
