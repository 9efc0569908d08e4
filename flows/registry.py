"""The MLflow Model Registry: after evaluate, the best classifier is registered as `zhpipe-<pipeline>`, and
it becomes `champion` only when it beats the current champion on a test split with the same content."""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

log = logging.getLogger("zhpipe")
ALIAS = "champion"


def registered_name(pipeline: str) -> str:
    return f"zhpipe-{pipeline}"


def test_sha256(test: pd.DataFrame) -> str:
    """Content hash of a test split: its texts and labels in id order (not the file's bytes)."""
    rows = test.sort_values("id")[["id", "text", "label"] if "label" in test else ["id", "text"]]
    h = hashlib.sha256()
    for row in rows.itertuples(index=False):
        h.update(("\x1f".join(map(str, row)) + "\x1e").encode("utf-8"))
    return h.hexdigest()


@dataclass
class Decision:
    """What registering did: the new version, whether it became champion, and why."""

    name: str
    version: str
    champion: bool
    reason: str


def decide(new_score: float, new_hash: str, champion: dict | None, metric: str) -> tuple[bool, str]:
    """The champion rule on its own: `champion` is the current champion's tags (None when there is none)."""
    if champion is None:
        return True, "first registered model: it becomes champion"
    old_hash = champion.get("zhpipe.test_sha256", "")
    old_version = champion.get("version", "?")
    if old_hash != new_hash:
        return False, (f"not compared: champion version {old_version} was scored on another test split "
                       f"({old_hash[:12] or 'unknown'} vs {new_hash[:12]}); the alias stays")
    old_score = float(champion.get("zhpipe.score", "nan"))
    if new_score > old_score:
        return True, f"test {metric} {new_score:.4f} beats champion version {old_version} ({old_score:.4f})"
    return False, f"test {metric} {new_score:.4f} does not beat champion version {old_version} ({old_score:.4f}); the alias stays"


def register_best(run_id: str, pipeline: str, model: str, folder: Path, labels: list[str], clean: dict, segment: dict,
                  test: pd.DataFrame, metric: str, score: float) -> Decision:
    """Log the best model as a pyfunc in its MLflow run, register it, and apply the champion rule."""
    from mlflow.exceptions import MlflowException

    from flows.serving import log_classifier
    from flows.tracking import client

    name, digest = registered_name(pipeline), test_sha256(test)
    info = log_classifier(run_id, model, folder, labels, clean, segment, registered_name=name)
    c = client()
    version = str(info.registered_model_version)
    for key, value in {"zhpipe.model": model, "zhpipe.test_sha256": digest, "zhpipe.metric": metric, "zhpipe.score": f"{score:.6f}",
                       "zhpipe.run_id": run_id}.items():
        c.set_model_version_tag(name, version, key, value)
    try:
        current = c.get_model_version_by_alias(name, ALIAS)
        champion = {**current.tags, "version": current.version}
    except MlflowException:
        champion = None
    promote, reason = decide(score, digest, champion, metric)
    if promote:
        c.set_registered_model_alias(name, ALIAS, version)
    c.update_model_version(name, version, description=f"{model}, test {metric} {score:.4f}: {reason}")
    log.info("registry: %s version %s (%s): %s", name, version, model, reason)
    return Decision(name, version, promote, reason)
