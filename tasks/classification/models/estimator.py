"""A team's scikit-learn estimator as a model of its own (`train.<name>: {estimator:
module:function, ...}`): any name that is not a built-in model, trained, tracked, compared,
selected, registered and served like the built-in ones (docs/extending.md).

- Fit: `function(**params)` returns an unfitted estimator (a `Pipeline` of a vectorizer and a
  classifier, say); it is fitted on the train split's `text` (the cleaned text) or `words` (jieba's
  words joined by spaces, segmented as the served model segments), with the labels as strings.
- Scores: `predict_proba` where the fitted estimator has it; else `decision_function`, turned into
  probabilities by a softmax of the margins (two classes: the logistic sigmoid of the margin); else
  `predict` alone, as a probability of 1 for the predicted class (such a model ranks nothing and
  cannot join a soft-voting ensemble).
- Saved without pickle: skops (`model.skops`), with the types it holds recorded in `estimator.json`
  at save time; at load, a file holding any type not recorded there is refused, and only the
  recorded types are trusted. A text vectorizer's vocabulary is kept beside it as a JSON list of
  terms (`vocabularies.json`). The files of the team's code (the module and the project modules it
  imports) are copied into `code/`, so that the logged model carries them under the digest trust.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from tasks.core import Section
from tasks.errors import ConfigError, DataError
from tasks.models.base import ModelSpec, TrainInputs
from tasks.util.usercode import CodeRef, code_files, last_line, load

SAVED = "estimator.json"  # the file that marks a saved folder as this family's
FILE = "model.skops"


class Params(Section):
    """A `train.<name>` section that names a team's estimator."""

    estimator: str  # module:function(**params) -> an unfitted scikit-learn estimator
    # text: the cleaned text; words: jieba's words joined by spaces
    input: Literal["text", "words"] = "text"
    params: dict[str, Any] = {}  # passed to the function
    # its place in the cost order selection prefers among models within the noise: 0 linear (the
    # default), 1 fastText-like, 2 neural networks, 3 pretrained and ensembles
    cost: int = Field(0, ge=0, le=3)

    @field_validator("estimator")
    @classmethod
    def _reference(cls, value: str) -> str:
        return str(CodeRef.parse(value, "train.<model>.estimator"))

    def user_code(self) -> list[CodeRef]:
        return [CodeRef.parse(self.estimator, "estimator")]


def make(name: str, p: Params, root: Path) -> Any:
    """The unfitted estimator `p` names; one line for a function that raises or returns something
    that cannot fit."""
    function = load(
        CodeRef.parse(p.estimator, f"train.{name}.estimator"), root, f"train.{name}.estimator"
    )
    try:
        estimator = function(**p.params)
    except Exception as e:  # noqa: BLE001 - the team's code may raise anything
        raise DataError(
            f"train.{name}: {p.estimator}(**{p.params}) raised {last_line(e)}"
        ) from None
    if not (hasattr(estimator, "fit") and hasattr(estimator, "predict")):
        raise ConfigError(
            f"train.{name}: {p.estimator} returned {type(estimator).__name__}, not an unfitted "
            f"scikit-learn estimator (with fit and predict)"
        )
    return estimator


def scoring(estimator: Any) -> str:
    """How the fitted `estimator` answers: proba, decision, or predict (see the module's
    docstring)."""
    if hasattr(estimator, "predict_proba"):
        return "proba"
    return "decision" if hasattr(estimator, "decision_function") else "predict"


VOCABULARIES = "vocabularies.json"


def _vocabularies(obj: Any, path: tuple = (), depth: int = 0):
    """(path, owner) of every fitted text vectorizer's `vocabulary_` (term -> column) in the
    estimator's object graph (a Pipeline's steps, a ColumnTransformer's or FeatureUnion's parts, a
    wrapper's estimator)."""
    if depth > 8:
        return
    if isinstance(getattr(obj, "vocabulary_", None), dict):
        yield path, obj
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _vocabularies(item, (*path, i), depth + 1)
    elif hasattr(obj, "get_params") and hasattr(obj, "__dict__"):
        for name, value in vars(obj).items():
            if isinstance(value, (list, tuple)) or hasattr(value, "get_params"):
                yield from _vocabularies(value, (*path, name), depth + 1)


def _at(obj: Any, path: list) -> Any:
    for step in path:
        obj = obj[step] if isinstance(step, int) else getattr(obj, step)
    return obj


def _terms(vocabulary: dict) -> dict:
    """`{"terms": [...]}` in column order when the columns are 0..n-1, as scikit-learn's vectorizers
    number them (one pass, no sort: a million-term vocabulary in a tenth of a second); else the
    terms and their columns."""
    terms = [None] * len(vocabulary)
    try:
        for term, column in vocabulary.items():
            if column < 0:
                raise IndexError(column)
            terms[column] = term
    except (IndexError, TypeError):
        terms = [None]
    if None not in terms:
        return {"terms": terms}
    terms = sorted(vocabulary, key=vocabulary.__getitem__)
    return {"terms": terms, "index": [int(vocabulary[t]) for t in terms]}


def _dump(estimator: Any, folder: Path) -> None:
    """skops for the estimator, and each text vectorizer's vocabulary beside it as JSON: skops
    writes a dictionary an entry at a time (a 50,000-term vocabulary took seconds to save and to
    load; its JSON list, milliseconds)."""
    import skops.io as sio

    taken = []
    for path, owner in _vocabularies(estimator):
        vocabulary = owner.vocabulary_
        taken.append((owner, vocabulary, {"path": list(path), **_terms(vocabulary)}))
        owner.vocabulary_ = {}
    try:
        sio.dump(estimator, folder / FILE)
    finally:
        for owner, vocabulary, _ in taken:
            owner.vocabulary_ = vocabulary
    (folder / VOCABULARIES).write_text(
        json.dumps([t[2] for t in taken], ensure_ascii=False), encoding="utf-8"
    )


def _restore(estimator: Any, folder: Path) -> Any:
    """The vocabularies `_dump` kept aside, put back."""
    if (folder / VOCABULARIES).is_file():
        for kept in json.loads((folder / VOCABULARIES).read_text(encoding="utf-8")):
            index = kept.get("index") or range(len(kept["terms"]))
            _at(estimator, kept["path"]).vocabulary_ = dict(zip(kept["terms"], index))
    return estimator


def train(i: TrainInputs) -> dict:
    """Fit on the train split, save as skops with its trusted types and the team's code beside
    it."""
    import skops.io as sio

    p: Params = i.section
    root = i.root
    estimator = make(i.name, p, root)
    frame = i.train if isinstance(i.train, pd.DataFrame) else i.train.frame([p.input, "label"])
    t0 = time.perf_counter()
    try:
        estimator.fit(frame[p.input].astype(str).tolist(), frame["label"].astype(str).to_numpy())
    except Exception as e:  # noqa: BLE001 - the team's estimator may raise anything
        raise DataError(f"train.{i.name}: fitting {p.estimator} raised {last_line(e)}") from None
    seconds = time.perf_counter() - t0
    folder = i.out / i.name
    folder.mkdir()
    _dump(estimator, folder)
    code = folder / "code"
    for shown, (file, _) in code_files(
        CodeRef.parse(p.estimator, "estimator"), root, f"train.{i.name}"
    ).items():
        target = code / shown
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, target)
    classes = [str(c) for c in getattr(estimator, "classes_", [])]
    unknown = sorted(set(classes) - set(i.labels))
    if unknown:
        raise DataError(
            f"train.{i.name}: the estimator learned classes the corpus does not have: {unknown[:3]}"
        )
    saved = {
        "estimator": p.estimator,
        "input": p.input,
        "params": p.params,
        "labels": i.labels,
        "classes": classes,
        "scores": scoring(estimator),
        "trusted": sorted(sio.get_untrusted_types(file=folder / FILE)),
    }
    (folder / SAVED).write_text(json.dumps(saved, ensure_ascii=False, indent=1), encoding="utf-8")
    return {
        "path": i.name,
        "kind": "estimator",
        "estimator": p.estimator,
        "scores": saved["scores"],
        "seconds": seconds,
        "history": [],
        "samples_per_second": len(frame) / max(seconds, 1e-9),
    }


def _softmax(margins: np.ndarray) -> np.ndarray:
    if margins.ndim == 1:  # two classes: the margin of the second
        positive = 1 / (1 + np.exp(-margins))
        return np.stack([1 - positive, positive], axis=1)
    shifted = np.exp(margins - margins.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def predictor(folder: Path):
    """Probabilities from a saved estimator, columns in the corpus's label order. Its file is loaded
    only when every type it holds was recorded at save time, and only those are trusted; its `code/`
    is importable while it loads and answers."""
    import skops.io as sio

    saved = json.loads((folder / SAVED).read_text(encoding="utf-8"))
    found = set(sio.get_untrusted_types(file=folder / FILE))
    extra = sorted(found - set(saved["trusted"]))
    if extra:
        raise ConfigError(
            f"{folder / FILE}: holds types its save did not record ({', '.join(extra[:3])}); not "
            f"loaded"
        )
    code = str(folder / "code")
    if (folder / "code").is_dir() and code not in sys.path:
        # the team's classes (a transformer of theirs), from the model's own copy
        sys.path.insert(0, code)
    estimator = _restore(sio.load(folder / FILE, trusted=sorted(found)), folder)
    labels, column = saved["labels"], saved["input"]
    order = [labels.index(c) for c in saved["classes"]]
    how = saved["scores"]

    def predict(df: pd.DataFrame) -> np.ndarray:
        x = df[column].astype(str).tolist()
        probs = np.zeros((len(df), len(labels)), dtype=np.float32)
        if how == "proba":
            probs[:, order] = estimator.predict_proba(x)
        elif how == "decision":
            probs[:, order] = _softmax(np.asarray(estimator.decision_function(x), dtype=np.float64))
        else:
            predicted = [labels.index(str(c)) for c in estimator.predict(x)]
            probs[np.arange(len(df)), predicted] = 1.0
        return probs

    predict.scores = how
    return predict


def spec(name: str, p: Params) -> ModelSpec:
    """The registry entry of the team's model `name` (made when a pipeline that declares it is
    read)."""
    return ModelSpec(
        name,
        Params,
        train,
        load=predictor,
        shared=(),
        cost=p.cost,
        own=True,
        about=f"{p.estimator} over {p.input} (a scikit-learn estimator of your own)",
        libraries=("scikit-learn", "skops", "scipy"),
    )


OWN: dict[str, ModelSpec] = {}  # the team's models by name, as the pipelines read declare them


def register(name: str, section: Params) -> None:
    """Register the team's model `name` (called as a pipeline that declares it is read; a built-in
    model's name is that model's section, never this family's)."""
    OWN[name] = spec(name, section)
