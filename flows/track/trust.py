"""Which registered models zhpipe loads: only what a zhpipe run of this project's store logged, with
its files under the store's own artifact root and exactly the files that run recorded. Loading a
model runs its code as the user who loads it (`zhpipe predict`, the champion gate's re-scoring), so
a version someone else put in the registry must never be loaded.

Tags are never proof: anyone who can write to the registry can write them. The proof is a record in
the stage store (`vouch`: owner-only on a local store, the team's bucket on an object store),
written by the run that logged the model, holding the digest of every file MLflow keeps for it;
`verified` downloads a version's files and loads nothing whose digest differs from that record."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from flows.plan.records import read_record, write_record
from tasks.util.io import file_sha256

# written into a model's folder by each registration (the registered name and version it was given):
# not the model's
REGISTRATION_FILES = {"registered_model_meta"}


def files_digest(folder: Path) -> str:
    """One sha256 over every file under `folder` (its path and its bytes' sha256), in path order; a
    link counts as its target's path, so a model folder that links elsewhere never matches a record
    of real files."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if rel in REGISTRATION_FILES:
            continue
        if path.is_symlink():
            h.update(f"link {rel} -> {os.readlink(path)}\n".encode())
        elif path.is_file():
            h.update(f"file {rel} {file_sha256(path)}\n".encode())
    return h.hexdigest()


def _record_name(source: str) -> str:
    return f"models/{hashlib.sha256(source.encode()).hexdigest()[:32]}.json"


def default_store():
    """The stage store whose records vouch for models when no run names one: ZHPIPE_STORAGE (a
    team's bucket), else ZHPIPE_DATA, else the project's data/."""
    from flows.plan.project import current
    from flows.plan.store import StageStore

    return StageStore(
        os.environ.get("ZHPIPE_STORAGE") or os.environ.get("ZHPIPE_DATA") or current().data
    )


def _stores(explicit):
    """Where a record may be: the store given, the default one, and the `storage:` each pipeline of
    the project's own pipelines.yaml names (a file only its owner writes)."""
    from flows.plan.project import current
    from flows.plan.store import StageStore

    if explicit is not None:
        yield explicit
    yield default_store()
    try:
        import yaml

        raw = yaml.safe_load(current().config_file.read_text(encoding="utf-8")) or {}
        roots = [
            p.get("storage") for p in (raw.get("pipelines") or {}).values() if isinstance(p, dict)
        ]
    # an unreadable file names no more stores (the run that reads it says why)
    except Exception:  # noqa: BLE001
        roots = []
    for root in dict.fromkeys(r for r in roots if isinstance(r, str) and r):
        yield StageStore(root)


def vouch(model_uri: str, run_id: str, store=None) -> str:
    """Record in the stage store the digest of the files MLflow keeps for `model_uri`, which run
    `run_id` has just logged: what `verified` later loads only when it matches. Returns the
    digest."""
    import mlflow

    store = store if store is not None else default_store()
    with tempfile.TemporaryDirectory(prefix="zhpipe-vouch-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp))
        digest = files_digest(local)
    write_record(
        store,
        _record_name(model_uri),
        json.dumps({"source": model_uri, "run_id": run_id, "digest": digest}),
    )
    return digest


def _record(mv, store=None) -> tuple[dict | None, object]:
    """The record of registered version `mv`'s files that the run that logged it kept (None when no
    store holds one for that run and source), and the store it was found in (else the last one
    looked in)."""
    name = _record_name(mv.source or "")
    text, where = None, None
    for where in _stores(store):
        if (text := read_record(where, name)) is not None:
            break
    try:
        record = json.loads(text) if text else None
    except ValueError:
        record = None
    if (
        not isinstance(record, dict)
        or record.get("source") != mv.source
        or mv.run_id != record.get("run_id")
    ):
        return None, where
    return record, where


def vouched(mv, store=None) -> bool:
    """Whether the project's stage stores (`store` first) vouch for registered version `mv`: one
    holds the record its logging run kept. A version they do not vouch for is never loaded from this
    project (`verified`)."""
    return _record(mv, store)[0] is not None


def verified(uri: str, dst: Path, store=None) -> tuple[str, Path]:
    """A registered version's files in `dst`, once `trusted` passes it and their digest matches the
    record its logging run kept in the stage store: (the pinned URI, the local folder). Anything
    else is one line, nothing loaded."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from tasks.errors import ZhpipeError

    pinned = trusted(uri)
    if not pinned.startswith("models:/"):
        return pinned, Path(pinned)
    mv = version_of(pinned)
    record, where = _record(mv, store)

    def refuse(why: str) -> ZhpipeError:
        return ZhpipeError(
            f"{uri}: version {mv.version} of {mv.name} is not loaded: {why}; a model is loaded "
            "only "
            "when a run of this project logged exactly these files (`zhpipe run --force train` "
            "logs "
            f"and registers it again)"
        )

    if record is None:
        raise refuse(
            f"the stage store ({where.url if where else 'none'}) holds no record of its files from "
            "the run "
            f"that logged it"
        )
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=pinned, dst_path=str(dst)))
    except (MlflowException, OSError) as e:
        raise refuse(
            "its files could not be read "
            f"({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})"
        ) from None
    if files_digest(local) != record.get("digest"):
        raise refuse("its files differ from those its run logged (changed or replaced since)")
    return pinned, local


def trusted(uri: str) -> str:
    """The version `uri` names, pinned (`models:/<name>/<version>`: an alias moved after the check
    cannot swap in another), when it is a model this project logged: a registered version whose run
    is in this store and was made by zhpipe, and whose files lie under the store's own artifact root
    (a SQLite store: `artifacts/` beside its database; a tracking server: the artifact location of
    the logging run's experiment). Anything else is refused in one line before a byte of it is
    loaded: loading a model runs its code as you, so a version whose files someone else put
    somewhere else must never be loaded. Other URIs (a logged model's folder given on purpose with
    --model) are returned as they are."""
    from urllib.parse import unquote, urlparse

    from mlflow.exceptions import MlflowException

    from flows.plan import project
    from flows.track.tracker import client
    from tasks.errors import ZhpipeError

    if not uri.startswith("models:/"):
        return uri
    mv = version_of(uri)
    name, version = mv.name, str(mv.version)
    c = client()

    def refuse(why: str) -> ZhpipeError:
        return ZhpipeError(
            f"{uri}: version {version} of {name} is not loaded: {why}; register a model with "
            "`zhpipe "
            f"run`, or remove that version (it may have been put there by someone else)"
        )

    try:
        run = c.get_run(mv.run_id) if mv.run_id else None
    except MlflowException:
        run = None
    if run is None:
        raise refuse("no run of this project's store logged it")
    location = c.get_model_version_download_uri(name, version)
    own = project.current().artifact_root()
    if own is not None:
        parsed, root = urlparse(location), unquote(urlparse(own).path)
        if parsed.scheme not in ("", "file"):
            raise refuse(f"its files are at {location}, not in this store's artifact root")
        where = Path(unquote(parsed.path)).resolve()
        if not where.is_relative_to(Path(root).resolve()):
            raise refuse(f"its files are at {where}, outside this store's artifact root {root}")
    else:
        root = c.get_experiment(run.info.experiment_id).artifact_location
        if not location.startswith(root.rstrip("/") + "/"):
            raise refuse(
                f"its files are at {location}, outside its experiment's artifact location {root}"
            )
    return f"models:/{name}/{version}"


def version_of(uri: str):
    """The registry's ModelVersion of `models:/<name>@<alias>` or `models:/<name>/<version>`; one
    clear error when the registry has no such model."""
    from mlflow.exceptions import MlflowException

    from flows.track.tracker import client
    from tasks.errors import ConfigError

    name, sep, alias = uri.removeprefix("models:/").partition("@")
    if not sep:
        name, _, alias = name.partition("/")
    try:
        return (
            client().get_model_version(name, alias)
            if alias.isdigit()
            else client().get_model_version_by_alias(name, alias)
        )
    except MlflowException:
        raise ConfigError(
            f"{uri}: no such registered model version (run the pipeline that registers {name} "
            "first; "
            f"`zhpipe models` lists what is registered)"
        ) from None
