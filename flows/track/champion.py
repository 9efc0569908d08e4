"""The MLflow Model Registry: after evaluate, the best model (chosen on validation) is registered as
`zhpipe-<pipeline>`, and it becomes `champion` only when it beats the current champion on the same test split.
When the test split changed (a corpus that grows), the champion is scored again on today's split, loaded from
the registry as it is served, and the two scores on that one split decide."""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

log = logging.getLogger("zhpipe")
ALIAS = "champion"


def registered_name(pipeline: str) -> str:
    return f"zhpipe-{pipeline}"


SCORED = ("id", "text", "label", "tags", "en")  # the columns of a test split that its hash and its scoring read


def test_frame(test) -> pd.DataFrame:
    """A test split (a frame, or a `tasks.io.Rows` read now) with only the columns it is scored by."""
    if isinstance(test, pd.DataFrame):
        return test
    import pyarrow.parquet as pq

    names = pq.read_schema(test.path).names
    return test.frame([c for c in SCORED if c in names])


def test_sha256(test) -> str:
    """Content hash of a test split (a frame, or a `tasks.io.Rows` read batch by batch): its texts and labels
    (or tags) in id order (not the file's bytes)."""
    if not isinstance(test, pd.DataFrame):
        import pyarrow.parquet as pq

        names = pq.read_schema(test.path).names
        h, last = hashlib.sha256(), None
        for batch in test.batches([c for c in SCORED if c in names]):
            ids = batch["id"].to_numpy()
            if len(ids) and ((last is not None and ids[0] < last) or (ids[1:] < ids[:-1]).any()):
                return test_sha256(test_frame(test))  # not in id order: sorted whole
            last = ids[-1] if len(ids) else last
            _update(h, batch)
        return h.hexdigest()
    h = hashlib.sha256()
    _update(h, test.sort_values("id"))
    return h.hexdigest()


def _update(h, rows: pd.DataFrame) -> None:
    if "tags" in rows:
        rows = rows.assign(tags=[" ".join(t) for t in rows["tags"]])
    for row in rows[["id", "text"] + [c for c in ("label", "tags", "en") if c in rows]].itertuples(index=False):
        h.update(("\x1f".join(map(str, row)) + "\x1e").encode("utf-8"))


def resolve(uri: str) -> tuple[str, str]:
    """(name, version) of `models:/<name>@<alias>` or `models:/<name>/<version>`; one clear error when the
    registry has no such model."""
    from mlflow.exceptions import MlflowException

    from flows.track.tracker import client
    from tasks.errors import ConfigError

    name, sep, alias = uri.removeprefix("models:/").partition("@")
    if not sep:
        name, _, alias = name.partition("/")
    try:
        version = client().get_model_version(name, alias).version if alias.isdigit() else client().get_model_version_by_alias(name, alias).version
    except MlflowException:
        raise ConfigError(f"{uri}: no such registered model version (run the pipeline that registers {name} first; "
                          f"`zhpipe models` lists what is registered)") from None
    return name, str(version)


def revision(uri: str) -> str:
    """What a stage key sees of a registered model (`flows.plan.keys.Registry`): `<name>/<version>`; a model the registry
    does not have, or a registry that cannot be read, is one clear error."""
    from tasks.errors import ConfigError

    try:
        return "/".join(resolve(uri))
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the store unreadable, say: said in one line, never a key built on it
        raise ConfigError(f"{uri}: the model registry could not be read ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def download(uri: str, cache: Path) -> tuple[str, Path]:
    """A registered model's files in `cache/<name>/<version>` (downloaded once, atomically): (models:/<name>/<version>, folder)."""
    import shutil
    import tempfile

    import mlflow

    name, version = resolve(uri)
    folder = cache / name / version
    if not (folder / "MLmodel").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{version}-"))
        mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}", dst_path=str(tmp))
        try:
            tmp.rename(folder)
        except OSError:  # another run put it there first
            shutil.rmtree(tmp, ignore_errors=True)
    return f"models:/{name}/{version}", folder


@dataclass
class Decision:
    """What registering did: the new version, whether it became champion, and why."""

    name: str
    version: str
    champion: bool
    reason: str
    score: float | None = None  # the new version's test score
    champion_score: float | None = None  # the champion's score on the same test split (stored, or scored again)
    test_sha256: str = ""
    holds: bool = False  # whether this version is the champion after the decision (promoted now, or already was)


Rescore = Callable[[str], float]  # a model version -> its score on today's test split, as served


def decide(new_score: float, new_hash: str, champion: dict | None, metric: str,
           rescore: Rescore | None = None) -> tuple[bool, str, float | None]:
    """The champion rule on its own: `champion` is the current champion's tags (None when there is none).
    Returns (promote, reason, the champion's score on today's test split)."""
    if champion is None:
        return True, "first registered model: it becomes champion", None
    old_hash = champion.get("zhpipe.test_sha256", "")
    old_version = champion.get("version", "?")
    where = "on the same test split"
    if old_hash == new_hash:
        old_score = float(champion.get("zhpipe.score", "nan"))
    elif rescore is None:
        return False, (f"not compared: champion version {old_version} was scored on another test split "
                       f"({old_hash[:12] or 'unknown'} vs {new_hash[:12]}); the alias stays"), None
    else:
        try:
            old_score = round(float(rescore(str(old_version))), 6)
        except Exception as e:  # noqa: BLE001 - any failure to load or score is reported, never a silent replacement
            text = " ".join(str(e).split())[:200]
            return False, (f"champion version {old_version} could not be scored on today's test split {new_hash[:12]} "
                           f"({type(e).__name__}: {text}); the alias stays"), None
        where = f"both scored on today's test split {new_hash[:12]} (the champion again, as served)"
    if round(new_score, 6) > old_score:  # scores are stored with 6 decimals
        return True, f"test {metric} {new_score:.4f} beats champion version {old_version} ({old_score:.4f}), {where}", old_score
    return False, (f"test {metric} {new_score:.4f} does not beat champion version {old_version} ({old_score:.4f}), {where}; "
                   "the alias stays"), old_score


def registered_version(name: str, model_key: str):
    """The model version registered for a trained model's key (its `train.<model>` unit), or None."""
    from mlflow.exceptions import MlflowException

    from flows.track.tracker import client

    try:
        found = client().search_model_versions(f"name = '{name}' and tags.`zhpipe.model_key` = '{model_key}'")
    except MlflowException:
        return None
    return min(found, key=lambda v: int(v.version)) if found else None


def _champion(c, name: str) -> dict | None:
    from mlflow.exceptions import MlflowException

    try:
        current = c.get_model_version_by_alias(name, ALIAS)
    except MlflowException:
        return None
    return {**current.tags, "version": current.version}


@contextlib.contextmanager
def _registry_lock(name: str):
    """One champion decision at a time per registered model: a file lock beside a SQLite tracking store (and
    a Prefect global concurrency limit when a Prefect server is configured, which spans machines)."""
    import os

    from filelock import FileLock

    from flows.plan.project import current

    folder = current().prefect_home
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / f"registry-{name}.lock"):
        if os.environ.get("PREFECT_API_URL"):
            from flows.orchestrate.workers import global_slot

            with global_slot(f"zhpipe-registry-{name}", f"registry: another run is deciding the {name} champion; waiting"):
                yield
        else:
            yield


def register_best(model_uri: str, run_id: str, pipeline: str, model: str, test, metric: str, score: float,
                  model_key: str, rescore: Callable[[str, pd.DataFrame], float] | None = None) -> Decision:
    """Register the best model (the classifier pyfunc logged with its training, `model_uri`) unless its key is
    registered already, then apply the champion rule: the alias moves only if, re-read under the registry
    lock, the champion it was compared with is still the champion (compare-and-set). `rescore(model_uri, test)`
    scores a registered version on `test` as it is served, for a champion that was scored on another split."""
    import mlflow

    from flows.track.tracker import client, tracking_uri

    name, digest, c = registered_name(pipeline), test_sha256(test), client()
    existing = registered_version(name, model_key)
    if existing is None:
        mlflow.set_tracking_uri(tracking_uri())
        with contextlib.redirect_stderr(io.StringIO()):  # MLflow's "Successfully registered model ..." print: the run says it
            version = str(mlflow.register_model(model_uri, name).version)
        for key, value in {"zhpipe.model": model, "zhpipe.test_sha256": digest, "zhpipe.metric": metric, "zhpipe.score": f"{score:.6f}",
                           "zhpipe.run_id": run_id, "zhpipe.model_key": model_key}.items():
            c.set_model_version_tag(name, version, key, value)
    else:
        version = str(existing.version)
        champion = _champion(c, name)
        if champion is not None and str(champion["version"]) == version:  # nothing to decide or write: no lock to wait for
            reason = f"already registered as version {version} (key {model_key}); it is the champion"
            log.info("registry: %s version %s (%s): %s", name, version, model, reason)
            return Decision(name, version, False, reason, score, None, digest, holds=True)
    again_scored = (lambda v: rescore(f"models:/{name}/{v}", test_frame(test))) if rescore else None  # read only if asked
    champion_score, already = None, False
    with _registry_lock(name):
        for _ in range(5):
            champion = _champion(c, name)
            if champion is not None and str(champion["version"]) == version:
                promote, reason, already = False, f"version {version} ({model}, key {model_key}) is already the champion", True
                break
            promote, reason, champion_score = decide(score, digest, champion, metric, again_scored)
            if not promote:
                break
            again = _champion(c, name)  # compare-and-set: the champion we compared with must still be the one
            if str((again or {}).get("version")) == str((champion or {}).get("version")):
                c.set_registered_model_alias(name, ALIAS, version)
                break
        else:
            promote, reason = False, "the champion kept changing under concurrent runs; the alias stays"
    if existing is not None:
        reason = f"already registered as version {version} (key {model_key}); {reason}"
    if champion_score is not None:  # what the decision compared, on the version it decided about
        c.set_model_version_tag(name, version, "zhpipe.champion_score", f"{champion_score:.6f}")
        c.set_model_version_tag(name, version, "zhpipe.compared_on_test_sha256", digest)
    c.update_model_version(name, version, description=f"{model}, test {metric} {score:.4f}: {reason}")
    log.info("registry: %s version %s (%s): %s", name, version, model, reason)
    return Decision(name, version, promote, reason, score, champion_score, digest, holds=promote or already)
