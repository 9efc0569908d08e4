"""The `ensemble` classifier: other trained classifiers of the same run combined by soft voting
(class probabilities averaged with weights fit on the validation split) or stacking (a logistic
regression over the members' validation probabilities). The members' saved models travel inside the
ensemble's folder, so it is registered and served like any classifier."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field

from tasks.core import Section
from tasks.errors import ConfigError
from tasks.models.base import ModelSpec, Predictor, TrainInputs, label_ids


class Params(Section):
    """The `train.ensemble` section."""

    # classifiers of train.models, trained first
    members: list[str] = ["tfidf_lr", "fasttext", "textcnn"]
    method: Literal["soft_vote", "stacking"] = "soft_vote"
    # soft_vote: the weights' search grid per member (weights are fit on validation log-loss);
    # stacking: the logistic regression's inverse regularisation strength
    grid: int = Field(10, ge=1)
    C: float = Field(1.0, gt=0)


def _log_loss(probs: np.ndarray, y: np.ndarray) -> float:
    return float(-np.log(np.clip(probs[np.arange(len(y)), y], 1e-9, 1)).mean())


def fit_weights(member_probs: list[np.ndarray], y: np.ndarray, grid: int) -> list[float]:
    """Weights on the simplex (steps of 1/grid) with the lowest validation log-loss; ties to the
    most even."""
    import itertools

    best, best_loss = None, np.inf
    for combo in itertools.product(range(grid + 1), repeat=len(member_probs)):
        if sum(combo) != grid:
            continue
        w = np.array(combo, dtype=float) / grid
        loss = _log_loss(sum(wi * p for wi, p in zip(w, member_probs)), y)
        if loss < best_loss - 1e-12 or (
            abs(loss - best_loss) <= 1e-12 and np.std(w) < np.std(best)
        ):
            best, best_loss = w, loss
    return best.tolist()


def _stack_features(member_probs: list[np.ndarray]) -> np.ndarray:
    return np.log(np.clip(np.hstack(member_probs), 1e-9, 1))


def train_ensemble(inputs: TrainInputs, registry: dict[str, ModelSpec]) -> dict:
    """Fit the combination on the members' validation probabilities; copy the members into
    `ensemble/members/`."""
    MODELS = registry
    p: Params = inputs.section
    for m in p.members:
        if MODELS[m].load is None or MODELS[m].task != "classification" or MODELS[m].members:
            raise ConfigError(f"train.{inputs.name}.members: {m} is not a classifier")
    t0 = time.perf_counter()
    folder = inputs.out / inputs.name
    y = label_ids(inputs.validation, inputs.labels)
    probs = []
    for m in p.members:
        shutil.copytree(inputs.members[m], folder / "members" / m)
        member = _member(registry, m, folder / "members" / m)
        if getattr(member, "scores", None) == "predict":
            raise ConfigError(
                f"train.{inputs.name}.members: {m} answers with predict alone (its estimator has "
                "no "
                f"predict_proba or decision_function), so it cannot join a soft-voting ensemble"
            )
        probs.append(member(inputs.validation))
    config = {"kind": "ensemble", "members": p.members, "method": p.method, "labels": inputs.labels}
    summary = {
        "path": inputs.name,
        "kind": "ensemble",
        "members": p.members,
        "method": p.method,
        "member_val_accuracy": {
            m: float((pr.argmax(1) == y).mean()) for m, pr in zip(p.members, probs)
        },
    }
    if p.method == "soft_vote":
        config["weights"] = summary["weights"] = fit_weights(probs, y, p.grid)
    else:
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import cross_val_predict

        x = _stack_features(probs)
        model = LogisticRegression(C=p.C, max_iter=1000)
        # the validation score of a stacker fit on validation: each row predicted by a model that
        # did not see it
        held_out = cross_val_predict(
            model,
            x,
            y,
            cv=min(5, int(np.bincount(y).min())) if len(set(y)) > 1 else 2,
            method="predict_proba",
        )
        summary["stacking_cv_val_accuracy"] = float((held_out.argmax(1) == y).mean())
        model.fit(x, y)
        config["coef"], config["intercept"] = model.coef_.tolist(), model.intercept_.tolist()
        config["classes"] = model.classes_.tolist()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    summary["seconds"] = time.perf_counter() - t0
    return summary


def _member(registry: Mapping[str, ModelSpec], name: str, folder: Path) -> Predictor:
    """A member's predictor: a team's estimator by its saved files (a served ensemble's process has
    read no pipeline that declares it), a built-in model by its name."""
    from tasks.classification.models.estimator import SAVED, predictor

    if (folder / SAVED).is_file():
        return predictor(folder)
    return registry[name].load(folder)


def ensemble_predictor(folder: Path, registry: dict[str, ModelSpec]) -> Predictor:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    members = [_member(registry, m, folder / "members" / m) for m in config["members"]]

    def predict(df: pd.DataFrame) -> np.ndarray:
        probs = [member(df) for member in members]
        if config["method"] == "soft_vote":
            return sum(w * p for w, p in zip(config["weights"], probs))
        logits = _stack_features(probs) @ np.array(config["coef"]).T + np.array(config["intercept"])
        if logits.shape[1] == 1:  # binary: scikit-learn keeps one row of coefficients
            logits = np.hstack([-logits, logits]) / 2
        exp = np.exp(logits - logits.max(1, keepdims=True))
        out = np.zeros((len(df), len(config["labels"])))
        out[:, config["classes"]] = exp / exp.sum(1, keepdims=True)
        return out

    return predict


def spec(registry: Mapping[str, ModelSpec]) -> ModelSpec:
    """The registry entry; it is handed the registry it belongs to (to load its members)."""
    return ModelSpec(
        "ensemble",
        Params,
        lambda inputs: train_ensemble(inputs, registry),
        cost=3,
        load=lambda folder: ensemble_predictor(folder, registry),
        members=lambda section: section.members,
        shared=(),
        about="other classifiers of the run by soft voting (weights fit on validation) or stacking",
        libraries=("scikit-learn",),
    )
