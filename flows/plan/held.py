"""What the data checks decided, kept in the project per pipeline
(`data/_cache/checks-<pipeline>.json`): each judged unit's verdicts (by its key: a cached unit is
not judged again), the partitions a blocking check held out of the corpus (their rows stay in the
store) and those a person accepted (`zhpipe accept`). Planning reads it: a held partition is not in
the corpus a run plans. Every change is a read-modify-write under the record's file lock
(`changing`), so an `accept` beside a run that judges a night is kept. Neither Prefect nor
MLflow."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.plan import project
from tasks.errors import ZhpipeError

log = logging.getLogger("zhpipe")

CORPUS = "(corpus)"  # the name a source without partitions is held and accepted under
KEPT_JUDGEMENTS = 500  # judged units remembered (the oldest are judged again if they come back)


def record_path(identity: str) -> Path:
    return project.current().data / "_cache" / f"checks-{identity}.json"


def load(identity: str) -> dict[str, Any]:
    """The record (empty when there is none); an unreadable one is moved aside with a warning line,
    never an error that stops every run: what it held is judged again."""
    path = record_path(identity)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        record = {}
    except (OSError, ValueError) as e:
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        path.replace(aside)
        log.warning(
            "checks: %s is unreadable (%s); moved to %s, its partitions are judged again",
            path,
            e,
            aside.name,
        )
        record = {}
    for part in ("judged", "held", "accepted"):
        record.setdefault(part, {})
    return record


def save(identity: str, record: dict[str, Any]) -> None:
    from tasks.util.io import atomic_write_text

    judged = record["judged"]
    for key in list(judged)[:-KEPT_JUDGEMENTS]:
        del judged[key]
    path = record_path(identity)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, ensure_ascii=False, indent=1))


@contextlib.contextmanager
def changing(identity: str) -> Iterator[dict[str, Any]]:
    """The record, read under its lock and written back when the block ends without an error (the
    lock is held throughout: another process's change in between cannot be lost)."""
    from filelock import FileLock

    path = record_path(identity)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.with_name(f".{path.name}.lock")):
        record = load(identity)
        yield record
        save(identity, record)


# record path -> (its inode, mtime and size, its held partitions)
_HELD: dict[str, tuple[tuple[int, int, int], dict]] = {}


def held(identity: str) -> dict[str, dict[str, Any]]:
    """The partitions held out now: name -> {check, line, digest, at}. Planning asks once per
    partitioned unit: the record is read again only when it changed."""
    path = record_path(identity)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return {}
    # written by rename: a new inode each time
    version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    cached = _HELD.get(str(path))
    if cached is None or cached[0] != version:
        cached = _HELD[str(path)] = (version, load(identity)["held"])
    return dict(cached[1])


def accepted(record: dict[str, Any], name: str, digest: str) -> bool:
    """Whether a person accepted this partition (or corpus) as it is now (an edited file is judged
    afresh)."""
    return record["accepted"].get(name) == digest


def hold(identity: str, digests: dict[str, str], names: list[str]) -> list[str]:
    """Take partitions that passed out of the corpus by hand (`digests`: every partition of the
    source, name -> its digest now); the next run plans without them, their rows stay in the store,
    `accept` puts them back."""
    already = [n for n in names if n in held(identity)]
    if already:
        entry = held(identity)[already[0]]
        raise ZhpipeError(
            f"hold: {already[0]!r} is already held out (since {entry.get('at', '?')}: "
            f"{entry.get('line', entry.get('check', ''))}); `zhpipe accept` puts it back"
        )
    unknown = [n for n in names if n not in digests]
    if unknown or not names:
        raise ZhpipeError(
            f"hold: {unknown[0]!r} is not a partition of pipeline '{identity}'"
            if unknown
            else f"hold: name a partition (partitions: {', '.join(list(digests)[-10:]) or 'none'})"
        )
    with changing(identity) as record:
        for name in names:
            record["accepted"].pop(name, None)
            record["held"][name] = {
                "check": "by hand",
                "line": f"{name} held out by hand (`zhpipe hold`)",
                "digest": digests[name],
                "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
    return names


def accept(identity: str, names: list[str], every: bool = False) -> list[str]:
    """Put held partitions back into the corpus (the next run builds them in, whatever the checks
    say of them as they are now); returns the names accepted. A name not held is one clear error."""
    with changing(identity) as record:
        held_now = record["held"]
        if not held_now:
            raise ZhpipeError(f"accept: nothing of pipeline '{identity}' is held out")
        chosen = list(held_now) if every else names
        unknown = [n for n in chosen if n not in held_now]
        if unknown or not chosen:
            raise ZhpipeError(
                f"accept: {unknown[0]!r} is not held out"
                if unknown
                else f"accept: name a partition, or --all (held: {', '.join(held_now)})"
            )
        for name in chosen:
            record["accepted"][name] = held_now.pop(name)["digest"]
    return chosen
