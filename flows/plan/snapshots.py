"""A source replaced each night by a full export (`source.grows: snapshot`: one path rewritten, or a
glob whose newest file is tonight's export): each export's rows not seen in an earlier one are a
partition of their own, kept as a file in the project (`data/_cache/snapshots/<source>/`), so the
partitioned stages clean, segment and augment only the new rows and every old row keeps its split.
Rows are compared by text and label. Neither Prefect nor MLflow."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from flows.plan import project
from tasks.errors import DataError
from tasks.source.schema import Partition, Source
from tasks.util.io import atomic_write_text, file_sha256, text_digests
from tasks.util.private import atomic_path

log = logging.getLogger("zhpipe")


def folder(source: Source) -> Path:
    """Where one snapshot source's versions are kept: in the project, by the source's path."""
    name = hashlib.sha256(f"{project.current().root}|{source.path}".encode()).hexdigest()[:16]
    return project.current().data / "_cache" / "snapshots" / name


def export_file(source: Source) -> Path:
    """Tonight's export: the file, or the newest (last by name) file of the glob."""
    base = Path(source.path).expanduser()
    base = base if base.is_absolute() else project.current().root / base
    if source.path.endswith("/"):
        base = base / "*"
    elif not any(c in source.path for c in "*?["):
        if not base.is_file():
            raise DataError(f"source not found: {base} (no such file)")
        return base
    files = sorted(
        p for p in base.parent.glob(base.name) if p.is_file() and not p.name.startswith(".")
    )
    if not files:
        raise DataError(
            f"source.path {source.path}: no files match (expected a full export per night)"
        )
    return files[-1]


def _versions(where: Path) -> list[dict]:
    try:
        versions = json.loads((where / "versions.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [
        v for v in versions if isinstance(v, dict) and (where / str(v.get("delta", ""))).is_file()
    ]


def _digests(frame: pd.DataFrame) -> np.ndarray:
    key = (
        frame["text"].astype(str)
        + "\x00"
        + (frame["label"].astype(str) if "label" in frame else "")
    )
    return np.stack(
        [text_digests(key, "zhpipe-snapshot1"), text_digests(key, "zhpipe-snapshot2")], axis=1
    )


def _read(path: Path, source: Source) -> pd.DataFrame:
    from tasks.source.readers import read_batches

    frames = [
        df
        for df, _, _ in read_batches(
            path, source.model_copy(update={"grows": "no", "path": str(path)})
        )
    ]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["text"])
    return frame[[c for c in ("text", "label") if c in frame]]


# (export, mtime, size, versions.json mtime) -> its partitions: planned once
_SEEN: dict[tuple, list[Partition]] = {}


def partitions(source: Source) -> list[Partition]:
    """The versions recorded so far, and tonight's export's new rows when it changed (written once
    per export, by its sha256: planning again finds the same file). An export with no new row adds
    no partition."""
    where, export = folder(source), export_file(source)
    record = where / "versions.json"
    stat = export.stat()
    key = (
        str(export),
        stat.st_mtime_ns,
        stat.st_size,
        record.stat().st_mtime_ns if record.is_file() else 0,
    )
    if key not in _SEEN:
        _SEEN.clear()
        _SEEN[key] = _partitions(source, where, export)
    return _SEEN[key]


def _partitions(source: Source, where: Path, export: Path) -> list[Partition]:
    versions = _versions(where)
    digest = file_sha256(export)
    parts = [Partition(v["name"], where / v["delta"], digest=v["delta_sha256"]) for v in versions]
    if any(v["export_sha256"] == digest for v in versions):
        return parts
    delta = where / f"{len(versions):04d}-{digest[:16]}.parquet"
    if not delta.is_file():
        frame = _read(export, source)
        seen = {tuple(d) for v in versions for d in _digests(pd.read_parquet(where / v["delta"]))}
        new = (
            np.array([tuple(d) not in seen for d in _digests(frame)], dtype=bool)
            if len(frame)
            else np.zeros(0, bool)
        )
        gone = len(seen) - int((~new).sum())
        if gone > 0:
            log.warning(
                "source %s: %d rows of earlier exports are not in %s; they stay in the corpus",
                source.path,
                gone,
                export.name,
            )
        if not new.any():
            log.info("source %s: %s brings no new rows", source.path, export.name)
            return parts
        where.mkdir(parents=True, exist_ok=True)
        with atomic_path(delta) as tmp:
            frame[new].reset_index(drop=True).to_parquet(tmp, index=False)
    parts.append(
        Partition(
            f"{export.name}@{len(versions):04d}",
            delta,
            digest=file_sha256(delta),
            export_sha256=digest,
        )
    )
    return parts


def record(source: Source, parts: list[Partition]) -> None:
    """Keep this run's versions: the next run diffs its export against all of them."""
    from filelock import FileLock

    where = folder(source)
    where.mkdir(parents=True, exist_ok=True)
    # read-modify-write: two runs recording at once keep both
    with FileLock(where / ".versions.json.lock"):
        versions = _versions(where)
        known = {v["name"] for v in versions}
        for part in parts:
            if part.name not in known and part.export_sha256:
                versions.append(
                    {
                        "name": part.name,
                        "delta": part.path.name,
                        "delta_sha256": part.fingerprint(),
                        "export_sha256": part.export_sha256,
                    }
                )
        atomic_write_text(where / "versions.json", json.dumps(versions, indent=1))


def partition_source(source: Source, part: Partition, shown: Path) -> Source:
    """A version's new rows as a source: the Parquet file of its rows (`text`, `label`)."""
    return source.model_copy(
        update={
            "path": str(shown),
            "grows": "no",
            "format": "parquet",
            "text_column": "text",
            "label_column": "label" if source.label_column else None,
            "encoding": "auto",
        }
    )
