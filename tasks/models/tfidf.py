"""The `tfidf_lr` baseline: TF-IDF over word and character n-grams with logistic regression (scikit-learn)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import joblib
import numpy as np
import pandas as pd
from pydantic import Field
from sklearn.compose import ColumnTransformer
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline

from tasks.core import Section
from tasks.models.base import ModelSpec


class Params(Section):
    """The `train.tfidf_lr` section: the cheap, strong baseline."""

    word_ngrams: list[int] = [1, 2]  # n-gram range over jieba words
    char_ngrams: list[int] = [1, 3]  # n-gram range over characters
    min_df: int = Field(2, ge=1)
    C: float = Field(4.0, gt=0)  # inverse regularisation strength
    class_weight: Literal["balanced"] | None = None


def make_pipeline(p: Params, seed: int) -> Pipeline:
    """Word n-grams over the segmented `words`, character n-grams over the raw `text`, one classifier."""
    features = ColumnTransformer([
        ("words", TfidfVectorizer(tokenizer=str.split, token_pattern=None, lowercase=False,
                                  ngram_range=tuple(p.word_ngrams), min_df=p.min_df, sublinear_tf=True), "words"),
        ("chars", TfidfVectorizer(analyzer="char", ngram_range=tuple(p.char_ngrams), min_df=p.min_df,
                                  sublinear_tf=True), "text"),
    ])
    classifier = LogisticRegression(C=p.C, max_iter=2000, class_weight=p.class_weight, random_state=seed)
    return Pipeline([("features", features), ("classifier", classifier)])


def train_tfidf_lr(train: pd.DataFrame, labels: list[str], p: Params, seed: int, out: Path) -> dict:
    """Fit and save `tfidf_lr/model.joblib`; return its summary."""
    folder = out / "tfidf_lr"
    folder.mkdir()
    index = {label: i for i, label in enumerate(labels)}
    t0 = time.perf_counter()
    model = make_pipeline(p, seed).fit(train[["words", "text"]], train["label"].map(index).to_numpy())
    seconds = time.perf_counter() - t0
    joblib.dump(model, folder / "model.joblib")
    (folder / "config.json").write_text(json.dumps({"labels": labels, **p.model_dump()}, ensure_ascii=False), encoding="utf-8")
    return {"path": "tfidf_lr", "kind": "tfidf_lr", "seconds": seconds, "history": [], "samples_per_second": len(train) / seconds}


def tfidf_predictor(folder: Path):
    """Probabilities from a saved TF-IDF + LR pipeline, columns in label order."""
    model = joblib.load(folder / "model.joblib")
    n = len(json.loads((folder / "config.json").read_text(encoding="utf-8"))["labels"])

    def predict(df: pd.DataFrame) -> np.ndarray:
        probs = np.zeros((len(df), n), dtype=np.float32)
        probs[:, model.classes_] = model.predict_proba(df[["words", "text"]])  # a class absent in training stays 0
        return probs

    return predict


SPEC = ModelSpec("tfidf_lr", Params, lambda i: train_tfidf_lr(i.train, i.labels, i.section, i.params.seed, i.out), predictor=tfidf_predictor,
                about="TF-IDF over word 1-2-grams and character 1-3-grams, logistic regression: the baseline")
