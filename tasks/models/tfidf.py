"""The `tfidf_lr` baseline: TF-IDF over word and character n-grams with logistic regression (scikit-learn);
and `tfidf_wide`, the same model over wider n-grams with weaker regularisation, a separate entry so that
the baseline stays what other models are measured against."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from tasks.core import Section
from tasks.models.base import ModelSpec, TrainInputs

if TYPE_CHECKING:  # annotations only: the heavy libraries are imported where they are used
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import Pipeline


class Params(Section):
    """The `train.tfidf_lr` section: the cheap, strong baseline."""

    word_ngrams: list[int] = [1, 2]  # n-gram range over jieba words
    char_ngrams: list[int] = [1, 3]  # n-gram range over characters
    min_df: int = Field(2, ge=1)
    C: float = Field(4.0, gt=0)  # inverse regularisation strength
    class_weight: Literal["balanced"] | None = None


class WideParams(Params):
    """The `train.tfidf_wide` section: tfidf_lr over longer phrases and character runs, less regularised (the
    best linear variant on the bundled reviews: docs/results.md)."""

    word_ngrams: list[int] = [1, 3]
    char_ngrams: list[int] = [1, 5]
    C: float = Field(16.0, gt=0)


def _vectorizers(p: Params) -> dict[str, TfidfVectorizer]:
    """Word n-grams over the segmented `words`, character n-grams over the cleaned `text`."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    return {
        "words": TfidfVectorizer(tokenizer=str.split, token_pattern=None, lowercase=False,
                                 ngram_range=tuple(p.word_ngrams), min_df=p.min_df, sublinear_tf=True),
        "chars": TfidfVectorizer(analyzer="char", ngram_range=tuple(p.char_ngrams), min_df=p.min_df, sublinear_tf=True),
    }


COLUMNS = {"words": "words", "chars": "text"}  # vectorizer -> the frame column it reads


def make_pipeline(p: Params, seed: int) -> Pipeline:
    """Both vectorizers side by side, one logistic regression over their features."""
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    features = ColumnTransformer([(name, vec, COLUMNS[name]) for name, vec in _vectorizers(p).items()])
    classifier = LogisticRegression(C=p.C, max_iter=2000, class_weight=p.class_weight, random_state=seed)
    return Pipeline([("features", features), ("classifier", classifier)])


def train_tfidf_lr(train: pd.DataFrame, labels: list[str], p: Params, seed: int, out: Path, name: str = "tfidf_lr") -> dict:
    """Fit, then save what prediction needs as data that loads without pickle (in `out / name`): each
    vectorizer's vocabulary (`vocabulary.json`) and the idf and classifier weights (`weights.npz`)."""
    folder = out / name
    folder.mkdir()
    index = {label: i for i, label in enumerate(labels)}
    t0 = time.perf_counter()
    model = make_pipeline(p, seed).fit(train[["words", "text"]], train["label"].map(index).to_numpy())
    seconds = time.perf_counter() - t0
    fitted = model.named_steps["features"].named_transformers_
    classifier = model.named_steps["classifier"]
    vocabulary = {name: {term: int(i) for term, i in fitted[name].vocabulary_.items()} for name in COLUMNS}
    (folder / "vocabulary.json").write_text(json.dumps(vocabulary, ensure_ascii=False), encoding="utf-8")
    np.savez(folder / "weights.npz", idf_words=fitted["words"].idf_, idf_chars=fitted["chars"].idf_,
             coef=classifier.coef_, intercept=classifier.intercept_, classes=classifier.classes_)
    (folder / "config.json").write_text(json.dumps({"labels": labels, **p.model_dump()}, ensure_ascii=False), encoding="utf-8")
    return {"path": name, "kind": name, "seconds": seconds, "history": [], "samples_per_second": len(train) / seconds}


def tfidf_predictor(folder: Path):
    """Probabilities from a saved TF-IDF + LR model, columns in label order (rebuilt from its data files)."""
    from scipy.sparse import hstack
    from sklearn.linear_model import LogisticRegression

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))  # every setting, as trained
    n = len(config.pop("labels"))
    vocabulary = json.loads((folder / "vocabulary.json").read_text(encoding="utf-8"))
    with np.load(folder / "weights.npz", allow_pickle=False) as w:
        weights = {k: w[k] for k in w.files}
    vectorizers = _vectorizers(Params(**config))
    for name, vec in vectorizers.items():
        vec.vocabulary_, vec.idf_ = vocabulary[name], weights[f"idf_{name}"]
    classifier = LogisticRegression()
    classifier.classes_, classifier.coef_, classifier.intercept_ = weights["classes"], weights["coef"], weights["intercept"]

    def predict(df: pd.DataFrame) -> np.ndarray:
        features = hstack([vec.transform(df[COLUMNS[name]]) for name, vec in vectorizers.items()]).tocsr()
        probs = np.zeros((len(df), n), dtype=np.float32)
        probs[:, classifier.classes_] = classifier.predict_proba(features)  # a class absent in training stays 0
        return probs

    return predict


def _train(i: TrainInputs) -> dict:
    return train_tfidf_lr(i.train, i.labels, i.section, i.params.seed, i.out, i.name)


SPEC = ModelSpec("tfidf_lr", Params, _train, predictor=tfidf_predictor, shared=("seed",),
                about="TF-IDF over word 1-2-grams and character 1-3-grams, logistic regression: the baseline")
WIDE = ModelSpec("tfidf_wide", WideParams, _train, predictor=tfidf_predictor, shared=("seed",),
                 about="tfidf_lr over word 1-3-grams and character 1-5-grams, C=16: the strongest linear model here")
