"""The `tfidf_lr` baseline: TF-IDF over word and character n-grams with logistic regression
(scikit-learn); and `tfidf_wide`, the same model over wider n-grams with weaker regularisation, a
separate entry so that the baseline stays what other models are measured against."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from tasks.core import Section
from tasks.models import racing
from tasks.models.base import ModelSpec, TrainInputs
from tasks.util.io import Rows, batches_of, shuffled, split_mb

log = logging.getLogger("zhpipe.train")

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
    # memory: fit one logistic regression on the whole TF-IDF matrix (exact; the matrix is 20-100x
    # the text), or stream: hashed n-grams (`features` per vectorizer, no vocabulary) and a logistic
    # loss fitted by SGD over `epochs` passes of shuffled batches, memory one batch whatever the
    # corpus (docs/results/scale.md). auto: memory while the train split's text and words are at
    # most `memory_mb` MB, else stream
    fit: Literal["auto", "memory", "stream"] = "auto"
    memory_mb: float = Field(12.0, ge=0)
    features: int = Field(2**20, ge=2**10)  # stream: hashed features per vectorizer (words, chars)
    epochs: int = Field(3, ge=1)  # stream: passes over the train split


class WideParams(Params):
    """The `train.tfidf_wide` section: tfidf_lr over longer phrases and character runs, less
    regularised (the best linear variant on the bundled reviews: docs/results.md)."""

    word_ngrams: list[int] = [1, 3]
    char_ngrams: list[int] = [1, 5]
    C: float = Field(16.0, gt=0)


def _vectorizers(p: Params) -> dict[str, TfidfVectorizer]:
    """Word n-grams over the segmented `words`, character n-grams over the cleaned `text`."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    return {
        "words": TfidfVectorizer(
            tokenizer=str.split,
            token_pattern=None,
            lowercase=False,
            ngram_range=tuple(p.word_ngrams),
            min_df=p.min_df,
            sublinear_tf=True,
        ),
        "chars": TfidfVectorizer(
            analyzer="char", ngram_range=tuple(p.char_ngrams), min_df=p.min_df, sublinear_tf=True
        ),
    }


COLUMNS = {"words": "words", "chars": "text"}  # vectorizer -> the frame column it reads


def make_pipeline(p: Params, seed: int) -> Pipeline:
    """Both vectorizers side by side, one logistic regression over their features."""
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    features = ColumnTransformer(
        [(name, vec, COLUMNS[name]) for name, vec in _vectorizers(p).items()]
    )
    classifier = LogisticRegression(
        C=p.C, max_iter=2000, class_weight=p.class_weight, random_state=seed
    )
    return Pipeline([("features", features), ("classifier", classifier)])


def text_mb(data) -> float:
    """The train split's text and words, in MB."""
    return split_mb(data, ["text", "words"])


def train_tfidf_lr(
    train, labels: list[str], p: Params, seed: int, out: Path, name: str = "tfidf_lr"
) -> dict:
    """Fit, then save what prediction needs as data that loads without pickle (in `out / name`): in
    memory, each vectorizer's vocabulary (`vocabulary.json`) and the idf and classifier weights
    (`weights.npz`); streamed, the hashed features' idf and the weights. `train` is a `Rows`
    (streamed) or a frame."""
    folder = out / name
    folder.mkdir()
    size = text_mb(train) if p.fit == "auto" else None
    mode = p.fit if size is None else ("memory" if size <= p.memory_mb else "stream")
    # a fit that changes method because of the corpus' size says so (the run table shows it beside
    # the model)
    note = (
        f"streamed hashed features: {size:.0f} MB of text is over train.{name}.memory_mb "
        f"({p.memory_mb:g} MB)"
        if size is not None and mode == "stream"
        else ""
    )
    if note:
        log.info("%s: %s", name, note)
    t0 = time.perf_counter()
    rows = (
        _fit_stream(train, labels, p, seed, folder)
        if mode == "stream"
        else _fit_memory(train, labels, p, seed, folder)
    )
    seconds = time.perf_counter() - t0
    (folder / "config.json").write_text(
        json.dumps({"labels": labels, **p.model_dump(), "mode": mode}, ensure_ascii=False),
        encoding="utf-8",
    )
    return {
        "path": name,
        "kind": name,
        "seconds": seconds,
        "history": [],
        "samples_per_second": rows / seconds,
        "fit": mode,
        **({"fit_note": note} if note else {}),
    }


def _fit_memory(train, labels: list[str], p: Params, seed: int, folder: Path) -> int:
    frame = train if isinstance(train, pd.DataFrame) else train.frame(["words", "text", "label"])
    index = {label: i for i, label in enumerate(labels)}
    model = make_pipeline(p, seed).fit(
        frame[["words", "text"]], frame["label"].map(index).to_numpy()
    )
    fitted = model.named_steps["features"].named_transformers_
    classifier = model.named_steps["classifier"]
    vocabulary = {
        name: {term: int(i) for term, i in fitted[name].vocabulary_.items()} for name in COLUMNS
    }
    (folder / "vocabulary.json").write_text(
        json.dumps(vocabulary, ensure_ascii=False), encoding="utf-8"
    )
    np.savez(
        folder / "weights.npz",
        idf_words=fitted["words"].idf_,
        idf_chars=fitted["chars"].idf_,
        coef=classifier.coef_,
        intercept=classifier.intercept_,
        classes=classifier.classes_,
    )
    return len(frame)


# stream: document frequencies from a seeded sample of about this many rows
IDF_SAMPLE_ROWS = 200_000
# stream: rows hashed at once (a batch's n-gram matrix is about 750 entries a review)
STREAM_ROWS = 4096


def _hashers(p: Params) -> dict:
    """Word and character n-grams hashed into `features` columns each (no vocabulary to hold)."""
    from sklearn.feature_extraction.text import HashingVectorizer

    return {
        "words": HashingVectorizer(
            tokenizer=str.split,
            token_pattern=None,
            lowercase=False,
            ngram_range=tuple(p.word_ngrams),
            n_features=p.features,
            alternate_sign=False,
            norm=None,
        ),
        "chars": HashingVectorizer(
            analyzer="char",
            ngram_range=tuple(p.char_ngrams),
            n_features=p.features,
            alternate_sign=False,
            norm=None,
        ),
    }


def hashed_tfidf(hashers: dict, idf: dict, frame: pd.DataFrame):
    """The TF-IDF rows of `frame` over hashed features: sublinear tf, idf, each vectorizer's block
    l2-normed (as TfidfVectorizer does), side by side."""
    from scipy.sparse import hstack
    from sklearn.preprocessing import normalize

    blocks = []
    for name, hasher in hashers.items():
        x = hasher.transform(frame[COLUMNS[name]]).tocsr()
        x.data = 1 + np.log(x.data)  # sublinear tf
        x = x.multiply(idf[name]).tocsr()
        blocks.append(normalize(x))
    return hstack(blocks).tocsr().astype(np.float32)


def _fit_stream(train, labels: list[str], p: Params, seed: int, folder: Path) -> int:
    """Hashed TF-IDF and a logistic loss by SGD (averaged), over `epochs` passes of the shuffled
    split."""
    from sklearn.linear_model import SGDClassifier

    n = len(train)
    hashers = _hashers(p)
    # document frequencies from a sample spread over the whole split (min_df applies to the sample's
    # counts)
    rng = np.random.default_rng(seed)
    keep = min(1.0, IDF_SAMPLE_ROWS / max(n, 1))
    df = {name: np.zeros(p.features, dtype=np.int64) for name in hashers}
    docs = 0
    for batch in batches_of(train, ["words", "text"], STREAM_ROWS):
        batch = batch[rng.random(len(batch)) < keep] if keep < 1 else batch
        docs += len(batch)
        for name, hasher in hashers.items():
            x = hasher.transform(batch[COLUMNS[name]]).tocsc()
            df[name] += np.diff(x.indptr)
    idf = {
        name: np.where(d >= p.min_df, np.log((1 + docs) / (1 + d)) + 1, 0.0).astype(np.float32)
        for name, d in df.items()
    }
    order = shuffled(
        train, folder.parent / f".{folder.name}-shuffle", seed, ["words", "text", "label"]
    )
    index = {label: i for i, label in enumerate(labels)}
    classes = np.arange(len(labels))
    weights = None
    if p.class_weight == "balanced":
        counts = np.zeros(len(labels))
        for batch in batches_of(order, ["label"]):
            counts += np.bincount(batch["label"].map(index).to_numpy(), minlength=len(labels))
        weights = {i: n / (len(labels) * c) for i, c in enumerate(counts) if c}
    # the same objective as LogisticRegression(C): alpha = 1 / (C * n)
    model = SGDClassifier(
        loss="log_loss",
        alpha=1.0 / (p.C * n),
        average=True,
        learning_rate="optimal",
        class_weight=weights,
        random_state=seed,
    )
    race, started, seen, stopped = racing.current(), time.perf_counter(), 0, False
    for epoch in range(p.epochs):
        # under a training budget: another pass only when one fits in what is left
        took = (time.perf_counter() - started) / max(epoch, 1)
        if epoch and race is not None and took > race.left():
            race.cut = (
                f"stopped after epoch {epoch} of {p.epochs}: a pass takes about {took:.0f} s and "
                f"{max(race.left(), 0):.0f} s of the budget were left"
            )
            break
        for batch in batches_of(order, ["words", "text", "label"], STREAM_ROWS):
            # a pass stops where the share runs out, as a network's epoch does: the model of the
            # batches seen is kept (the first model of a stage is always a model)
            stopped = bool(seen) and race is not None and race.left() <= 0
            if stopped:
                race.cut = (
                    f"stopped in epoch {epoch + 1} after {seen - epoch * n:,} of {n:,} rows: its "
                    f"share of the budget ({race.share:.0f} s) ran out"
                )
                break
            model.partial_fit(
                hashed_tfidf(hashers, idf, batch),
                batch["label"].map(index).to_numpy(),
                classes=classes,
            )
            seen += len(batch)
        if stopped:
            break
    if isinstance(order, Rows):
        shutil.rmtree(order.path.parent, ignore_errors=True)
    np.savez(
        folder / "weights.npz",
        idf_words=idf["words"],
        idf_chars=idf["chars"],
        coef=model.coef_.astype(np.float32),
        intercept=model.intercept_,
        classes=model.classes_,
    )
    return seen


def tfidf_predictor(folder: Path):
    """Probabilities from a saved TF-IDF + LR model, columns in label order (rebuilt from its data
    files)."""
    # every setting, as trained
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    n = len(config.pop("labels"))
    mode = config.pop("mode", "memory")
    p = Params(**config)
    with np.load(folder / "weights.npz", allow_pickle=False) as w:
        weights = {k: w[k] for k in w.files}
    if mode == "stream":
        hashers, idf = _hashers(p), {name: weights[f"idf_{name}"] for name in COLUMNS}

        def features(df: pd.DataFrame):
            return hashed_tfidf(hashers, idf, df)
    else:
        from scipy.sparse import hstack

        vocabulary = json.loads((folder / "vocabulary.json").read_text(encoding="utf-8"))
        vectorizers = _vectorizers(p)
        for name, vec in vectorizers.items():
            vec.vocabulary_, vec.idf_ = vocabulary[name], weights[f"idf_{name}"]

        def features(df: pd.DataFrame):
            return hstack(
                [vec.transform(df[COLUMNS[name]]) for name, vec in vectorizers.items()]
            ).tocsr()

    from sklearn.linear_model import LogisticRegression, SGDClassifier

    # the fitted classifier rebuilt from its weights: scikit-learn's own predict_proba (multinomial
    # for the logistic regression, one-vs-rest normalised for SGD's logistic loss)
    classifier = SGDClassifier(loss="log_loss") if mode == "stream" else LogisticRegression()
    classifier.classes_, classifier.coef_, classifier.intercept_ = (
        weights["classes"],
        weights["coef"],
        weights["intercept"],
    )

    def predict(df: pd.DataFrame) -> np.ndarray:
        probs = np.zeros((len(df), n), dtype=np.float32)
        # a class absent in training stays 0
        probs[:, classifier.classes_] = classifier.predict_proba(features(df))
        return probs

    return predict


def _train(i: TrainInputs) -> dict:
    return train_tfidf_lr(i.train, i.labels, i.section, i.params.seed, i.out, i.name)


# the budget is in its key: a streamed fit makes the passes that fit in it
SPEC = ModelSpec(
    "tfidf_lr",
    Params,
    _train,
    load=tfidf_predictor,
    shared=("seed", "budget", "model_budget"),
    streams=True,
    cost=0,
    about="TF-IDF over word 1-2-grams and character 1-3-grams, logistic regression: the baseline",
    libraries=("scikit-learn", "scipy"),
)
WIDE = ModelSpec(
    "tfidf_wide",
    WideParams,
    _train,
    load=tfidf_predictor,
    shared=("seed", "budget", "model_budget"),
    streams=True,
    cost=0,
    about="tfidf_lr over word 1-3-grams and character 1-5-grams, C=16: the strongest linear model "
    "here",
    libraries=("scikit-learn", "scipy"),
)
