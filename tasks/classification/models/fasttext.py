"""The `fasttext` model: fastText's supervised classifier over words and characters with word
n-grams."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import field_validator

from tasks.core import Section
from tasks.models.base import ModelSpec, Predictor, label_ids
from tasks.util.io import batches_of, shuffled
from tasks.util.vectors import FASTTEXT_MIN_THREADS, fasttext_call, fasttext_dim


class Params(Section):
    """The `train.fasttext` section: fastText's supervised classifier."""

    epoch: int = 25
    lr: float = 0.5
    word_ngrams: int = 2
    dim: int = 60
    minn: int = 0
    maxn: int = 0
    bucket: int = 100000  # the model file is about bucket * dim * 4 bytes
    tokens: Literal["words", "chars", "both"] = "both"

    _dim = field_validator("dim")(fasttext_dim)


def _fasttext_line(row, tokens: str) -> str:
    if tokens == "words":
        return row.words
    if tokens == "chars":
        return row.chars
    # words and characters together: robust to segmentation errors
    return f"{row.words} {row.chars}"


def train_fasttext(train, labels: list[str], params, out: Path) -> dict:
    """Train and save `fasttext/model.bin` from the train split (a `Rows`, streamed, or a frame);
    return its summary."""
    import fasttext

    p = params.fasttext
    folder = out / "fasttext"
    folder.mkdir()
    # fastText reads its file in order and does not shuffle: the corpus is sorted by label, so
    # without this the last class seen dominates (test accuracy fell to 0.55-0.79)
    train_file, rows = folder / "train.txt", 0
    with open(train_file, "w", encoding="utf-8") as f:
        for batch in batches_of(
            shuffled(train, folder / "shuffle", params.seed, ["label", "words", "chars"])
        ):
            f.writelines(
                f"__label__{i} {_fasttext_line(r, p.tokens)}\n"
                for i, r in zip(label_ids(batch, labels), batch.itertuples())
            )
            rows += len(batch)
    shutil.rmtree(folder / "shuffle", ignore_errors=True)  # a large split's shuffled copy
    t0 = time.perf_counter()
    model = fasttext_call(
        lambda: fasttext.train_supervised(
            str(train_file),
            epoch=p.epoch,
            lr=p.lr,
            wordNgrams=p.word_ngrams,
            dim=p.dim,
            minn=p.minn,
            maxn=p.maxn,
            bucket=p.bucket,
            thread=FASTTEXT_MIN_THREADS,
            verbose=0,
        ),
        "train.fasttext",
        f"lower train.fasttext.lr (now {p.lr}) or raise bucket (now {p.bucket})",
    )
    seconds = time.perf_counter() - t0
    train_file.unlink()
    model.save_model(str(folder / "model.bin"))
    (folder / "config.json").write_text(
        json.dumps({"labels": labels, **p.model_dump()}, ensure_ascii=False), encoding="utf-8"
    )
    return {
        "path": "fasttext",
        "kind": "fasttext",
        "seconds": seconds,
        "history": [],
        "samples_per_second": rows * p.epoch / seconds,
    }


def fasttext_predictor(folder: Path) -> Predictor:
    """Probabilities from a saved fastText classifier, columns in label order."""
    import fasttext

    model = fasttext.load_model(str(folder / "model.bin"))
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    n = len(cfg["labels"])

    def predict(df: pd.DataFrame) -> np.ndarray:
        lines = [_fasttext_line(r, cfg["tokens"]) for r in df.itertuples()]
        got_labels, got_probs = model.predict(lines, k=n)
        probs = np.zeros((len(lines), n), dtype=np.float32)
        for i, (ls, ps) in enumerate(zip(got_labels, got_probs)):
            for label, prob in zip(ls, ps):
                probs[i, int(label.removeprefix("__label__"))] = prob
        return probs

    return predict


SPEC = ModelSpec(
    "fasttext",
    Params,
    lambda i: train_fasttext(i.train, i.labels, i.params, i.out),
    load=fasttext_predictor,
    shared=("seed",),
    cost=1,
    streams=True,
    about="fastText's supervised classifier on words + characters with word bigrams",
    libraries=("fasttext",),
)
