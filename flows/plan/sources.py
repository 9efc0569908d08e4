"""A pipeline's source as planning sees it: its partitions (files of a folder or glob, or an
appended file's runs), fixed for the length of a run; what earlier runs held (kept in the project,
so a missing partition is named); runs on other corpora kept from `gc`; the source's fingerprint.
Neither Prefect nor MLflow."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from flows.plan import project
from flows.plan.config import PipelineConfig
from tasks.errors import ZhpipeError
from tasks.source.origin import Origin
from tasks.util.io import file_sha256, resolve_path

log = logging.getLogger("zhpipe")

# (file, mtime_ns, size) -> sha256: each file version hashed once
_FILE_DIGESTS: dict[tuple[str, int, int], str] = {}
# (file, mtime_ns, size, record) -> its partitions: an append source checked once
_APPENDED: dict[tuple, list] = {}
# id(config) -> the partitions a run planned with: fixed from planning to its end
_FROZEN: dict[int, list] = {}


def _owner_only(parts: list) -> list:
    """The partition files inside the project (a night dropped into data/raw/ by an export, with its
    mode) made the owner's only, as every copy of a corpus zhpipe makes."""
    from tasks.util.private import tighten

    root = project.current().root
    for part in parts:
        path = getattr(part, "path", None)
        if isinstance(path, Path) and path.is_relative_to(root) and not path.is_symlink():
            tighten(path)
    return parts


def partitions(config: PipelineConfig) -> list:
    """The partitions of a partitioned source (one per file in file-name order, or one per run's
    appended lines); [] for a single-file source. Planning asks for them once per unit: a file (or
    an appended file's ranges) is hashed once per version in this process, not on every call."""
    if not config.source.partitioned:
        return []
    if id(config) in _FROZEN:
        return _FROZEN[id(config)]
    return _kept(config, _listed(config))


def _listed(config: PipelineConfig) -> list:
    root = project.current().root
    if config.source.grows == "snapshot":
        from flows.plan import snapshots

        return snapshots.partitions(config.source)
    if config.source.grows == "append":
        record, file = _append_record(config), resolve_local(config.source.path)
        text = record.read_text(encoding="utf-8") if record.is_file() else None
        stat = file.stat() if file is not None and file.is_file() else None
        key = (str(file), stat.st_mtime_ns if stat else 0, stat.st_size if stat else -1, text)
        if key not in _APPENDED:
            _APPENDED.clear()  # only the latest version is asked for again
            _APPENDED[key] = config.source.partitions(root, json.loads(text) if text else None)
        return _APPENDED[key]
    parts = config.source.partitions(root)
    for part in parts:
        stat = part.path.stat()
        key = (str(part.path), stat.st_mtime_ns, stat.st_size)
        if key not in _FILE_DIGESTS:
            _FILE_DIGESTS[key] = file_sha256(part.path)
        part.digest = _FILE_DIGESTS[key]
    return parts


def _kept(config: PipelineConfig, parts: list) -> list:
    """The partitions less those a blocking check holds out (flows/plan/held.py) as they are now: an
    edited held file is judged afresh."""
    from flows.plan import held

    out = held.held(config.identity)
    return [p for p in parts if p.name not in out or out[p.name].get("digest") != p.fingerprint()]


def hold_out(config: PipelineConfig, name: str) -> None:
    """Take a partition out of the list a running run planned with (a blocking check held it
    out)."""
    if id(config) in _FROZEN:
        _FROZEN[id(config)] = [p for p in _FROZEN[id(config)] if p.name != name]


@contextlib.contextmanager
def fixed_partitions(config: PipelineConfig):
    """Within the block, `partitions(config)` is the list found on entry: a file appended to, added
    or removed while a run plans or builds changes nothing in that run (the next run finds it). A
    partition the last run had and the source no longer has is a warning line naming it, or an error
    with `source.missing_partitions: error`."""
    if not config.source.partitioned or id(config) in _FROZEN:
        yield
        return
    parts = _owner_only(partitions(config))
    from flows.plan import held

    # a held partition is not gone
    accounted = {p.name for p in parts} | set(held.held(config.identity))
    gone = [name for name in _recorded(config) if name not in accounted]
    if gone:
        listed = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
        message = (
            f"source {config.source.path}: {len(gone)} partition(s) of the last run are gone "
            f"({listed}); "
            "their rows are not in this run's corpus"
        )
        if config.source.missing_partitions == "error":
            raise ZhpipeError(
                message
                + " (source.missing_partitions: error; put the files back or set it to warn)"
            )
        log.warning("%s", message)
    _FROZEN[id(config)] = parts
    try:
        yield
    finally:
        _FROZEN.pop(id(config), None)


def _record(config: PipelineConfig, kind: str) -> Path:
    """Where what a partitioned source held at earlier runs is kept: in the project (whatever store
    a run uses), by the source's path."""
    import hashlib

    where = (
        str(resolve_local(config.source.path))
        if kind == "appends"
        else f"{project.current().root}|{config.source.path}"
    )
    name = hashlib.sha256(where.encode()).hexdigest()[:16]
    return project.current().data / "_cache" / f"{kind}-{name}.json"


def _append_record(config: PipelineConfig) -> Path:
    return _record(config, "appends")


def _recorded(config: PipelineConfig) -> list[str]:
    """The partitions the last run of a file or glob source had (an appended file's never go: not
    recorded)."""
    if config.source.grows == "append":
        return []
    try:
        names = json.loads(_record(config, "partitions").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def record_appends(config: PipelineConfig) -> None:
    """Keep this run's partitions of a partitioned source, so that the next run finds them (and
    checks them): an appended file's byte ranges and sha256, a folder's or glob's file names."""
    from tasks.util.io import atomic_write_text

    if not config.source.partitioned:
        return
    parts = partitions(config)
    if config.source.grows == "snapshot":
        from flows.plan import snapshots

        snapshots.record(config.source, parts)
        return
    if config.source.grows != "append":
        record = _record(config, "partitions")
        record.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record, json.dumps([p.name for p in parts], ensure_ascii=False, indent=1))
        return
    record = _append_record(config)
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        record,
        json.dumps([{"end": p.byte_range[1], "sha256": p.fingerprint()} for p in parts], indent=1),
    )


def record_source_run(config: PipelineConfig, keys: dict[str, str]) -> None:
    """A run on another corpus (`--source`) is in no pipeline of pipelines.yaml: what it built is
    kept from `zhpipe gc` by this record of its keys and source (in the project), until `zhpipe gc
    --forget <its name>`."""
    from tasks.util.io import atomic_write_text

    if not config.tracked_as:
        return
    record = source_run_record(config.identity)
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        record,
        json.dumps(
            {"pipeline": config.name, "source": config.source.path, "keys": keys},
            ensure_ascii=False,
            indent=1,
        ),
    )


def source_run_record(identity: str) -> Path:
    return project.current().data / "_cache" / f"source-run-{identity}.json"


def source_run_records() -> dict[str, dict[str, Any]]:
    """The records of runs on other corpora, by name; an unreadable one is named in a warning and
    kept nothing for."""
    found = {}
    for path in sorted((project.current().data / "_cache").glob("source-run-*.json")):
        try:
            found[path.stem.removeprefix("source-run-")] = json.loads(
                path.read_text(encoding="utf-8")
            )
        except (OSError, ValueError) as e:
            log.warning("gc: %s is unreadable (%s); the outputs it names are not kept", path, e)
    return found


def partition_source(config: PipelineConfig, name: str):
    """The source of one partition: its file, relative to the project folder where it is inside it
    (so that a moved project keeps its keys), and for an append its byte range."""
    root = project.current().root
    part = next(p for p in partitions(config) if p.name == name)
    shown = part.path.relative_to(root) if part.path.is_relative_to(root) else part.path
    if config.source.grows == "snapshot":
        from flows.plan import snapshots

        return snapshots.partition_source(config.source, part, shown)
    return config.source.partition(part, shown)


def source_fingerprint(config: PipelineConfig, origin: Origin | None = None) -> str:
    """What identifies the raw bytes (`tasks.source.origin.Origin`: the local file's sha256, else
    the declared sha256, else the server's validators). A source with given splits: each file's, by
    split; a partitioned source: the digest of its partitions' list."""
    if config.source.partitioned:
        import hashlib

        listing = " ".join(f"{p.name}={p.fingerprint()}" for p in partitions(config))
        return f"partitions {hashlib.sha256(listing.encode()).hexdigest()}"
    origin = origin or origin_of(config)
    parts = config.source.given()
    if len(parts) > 1:
        return " ".join(f"{name}={origin.fingerprint(src)}" for name, src in parts.items())
    return origin.fingerprint()


def origin_of(config: PipelineConfig) -> Origin:
    """The pipeline's source as its key plan and download ask about it (one per run)."""
    return Origin(config.source, project.current().root, config.stages.download)


def resolve_local(location: str) -> Path | None:
    """A local path for `location` (plain path or file:// URL; relative paths from the project
    folder)."""
    return resolve_path(location, project.current().root)
