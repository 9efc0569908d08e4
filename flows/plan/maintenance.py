"""Keeping a stage store sound and small: `zhpipe verify` checks every output against its manifest,
`zhpipe gc` removes outputs that no pipeline references and what killed builds left behind."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from flows.plan.store import MANIFEST, CorruptManifest, Manifest, StageStore
from tasks.util.procs import alive

SHARED = {"_downloads", "_cache", "_records", ".remote"}  # shared by all keys: never collected


def _outputs(store: StageStore):
    """(stage, key) of every finished output in the store's local folder."""
    if store.root.is_symlink() or not store.root.is_dir():
        return
    for stage_dir in _stage_folders(store.root):
        for out in sorted(p for p in stage_dir.iterdir() if not p.name.startswith(".")):
            if _is_output(stage_dir.name, out):
                yield stage_dir.name, out.name


def verify_store(store: StageStore) -> list[dict[str, Any]]:
    """Every finished output with the problems a full check finds (sizes and sha256 of every file).
    A store on an object store is checked there, in the bucket every machine reads, not in this
    machine's mirror."""
    if store.fs is not None:
        return [
            {"stage": stage, "key": key, "problems": _verify_remote(store, stage, key)}
            for stage, key in _remote_outputs(store)
        ]
    return [
        {"stage": stage, "key": key, "problems": store.verify(stage, key, full=True)}
        for stage, key in _outputs(store)
    ]


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _remote_outputs(store: StageStore):
    """(stage, key) of every output published in an object store: a key folder of a stage folder
    with a manifest."""
    fs = store.fs
    if not fs.exists(store.base):
        return
    for stage_path in sorted(fs.ls(store.base, detail=False)):
        stage = _name(stage_path)
        if (
            stage in SHARED
            or stage in PROTECTED
            or not _UNIT.fullmatch(stage)
            or not fs.isdir(stage_path)
        ):
            continue
        for out in sorted(fs.ls(stage_path, detail=False)):
            if _KEY.fullmatch(_name(out)) and fs.exists(f"{out.rstrip('/')}/{MANIFEST}"):
                yield stage, _name(out)


def _verify_remote(store: StageStore, stage: str, key: str) -> list[str]:
    """Problems of an output in the object store against its manifest: files missing, not listed, of
    another size, or of another sha256 (each file read as a stream)."""
    import hashlib

    try:
        manifest = store.manifest(stage, key)
    except CorruptManifest as e:
        return [str(e)]
    base = store._remote(stage, key)
    found = {
        p[len(base) + 1 :] if p.startswith(base) else p.split(f"/{key}/", 1)[-1]: info
        for p, info in store.fs.find(base, detail=True).items()
    }
    problems = [
        f"{rel}: not in the manifest"
        for rel in sorted(found)
        if rel != MANIFEST and rel not in manifest.files
    ]
    for rel, facts in manifest.files.items():
        info = found.get(rel)
        if info is None:
            problems.append(f"{rel}: missing")
            continue
        if int(info.get("size") or 0) != facts["size"]:
            problems.append(f"{rel}: {info.get('size')} bytes, manifest says {facts['size']}")
            continue
        digest = hashlib.sha256()
        with store.fs.open(f"{base}/{rel}", "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != facts["sha256"]:
            problems.append(f"{rel}: sha256 differs from the manifest")
    return problems


def _size_mb(path: Path) -> float:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size / 2**20
    return (
        sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
        / 2**20
    )


# what the store itself names: a unit folder (`train` or `train.textcnn`), a 16-hex key, and its
# dot-entries
_UNIT = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)?")
_KEY = re.compile(r"[0-9a-f]{16}")
_BUILD_LEFTOVER = re.compile(r"\.(tmp|old|get)-([0-9a-f]{16})-(\d+)")
_KEYED_LEFTOVER = re.compile(r"\.(scratch|lock)-([0-9a-f]{16})")
PROTECTED = {"raw"}  # the project's corpora: never a stage folder, whatever it holds


def _is_output(stage: str, entry: Path) -> bool:
    """Whether `entry` is an output the store published: a real folder named by a key whose manifest
    (a regular file) names this stage and this key. Anything else under a stage folder is left
    alone."""
    manifest = entry / MANIFEST
    if not _KEY.fullmatch(entry.name) or entry.is_symlink() or not entry.is_dir():
        return False
    if manifest.is_symlink() or not manifest.is_file():
        return False
    try:
        doc = Manifest.read(entry)
    except CorruptManifest:
        # a published output whose manifest was damaged since: `verify` counts it as corrupt
        return True
    except OSError:
        return False
    return doc.stage.split(":", 1)[0] == stage and doc.key == entry.name


def _leftover(
    name: str, keep_keys: set[str], held_keys: set[str], runs_live: bool
) -> tuple[str | None, str | None]:
    """(why a dot-entry of a stage folder can go, why it is kept): both None for names the store
    never makes."""
    build = _BUILD_LEFTOVER.fullmatch(name)
    if build:
        if alive(int(build.group(3))):
            return None, None  # a build in progress
        return "left by a killed build", None
    keyed = _KEYED_LEFTOVER.fullmatch(name)
    if not keyed or keyed.group(2) in keep_keys:
        return None, None
    what = "checkpoints" if keyed.group(1) == "scratch" else "lock"
    if keyed.group(2) in held_keys:
        return None, f"{what} of an output a live run holds"
    # a live run may be building that key (or waiting on its lock): removing either would break it
    if runs_live:
        return None, f"{what} of an output no pipeline uses, kept while a run is live"
    return f"{what} of an output no pipeline uses", None


def _lock_held(stage_dir: Path, key: str) -> bool:
    """Whether a run holds the key's lock now (the file lock `StageStore.lock` takes: flock); a
    missing lock file is not made."""
    import fcntl
    import os

    try:
        fd = os.open(stage_dir / f".lock-{key}", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False


def _published(entry: Path) -> float:
    """When an output was published (its manifest's time; its folder's when the manifest cannot
    say)."""
    try:
        return float(Manifest.read(entry).created)
    except (CorruptManifest, OSError, TypeError, ValueError):
        return entry.stat().st_mtime


def _stage_folders(root: Path):
    """The store's stage folders under `root`: real folders (never a symlink) with a unit's name,
    not `raw`."""
    for p in sorted(root.iterdir()):
        if (
            p.name in SHARED
            or p.name in PROTECTED
            or p.is_symlink()
            or not p.is_dir()
            or not _UNIT.fullmatch(p.name)
        ):
            continue
        yield p


def collect_garbage(
    store: StageStore,
    keep: set[tuple[str, str]],
    dry_run: bool = False,
    protect: tuple[Path, ...] = (),
    live: list[dict[str, Any]] = (),
    since: float | None = None,
    kept: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Remove (or with `dry_run` only list) what the store made and no pipeline uses: published
    outputs whose (stage, key) is not in `keep`, and leftovers of killed builds. Nothing else is
    touched: no file or folder the store did not name and publish, nothing through a symlink,
    nothing outside the store root, nothing under `data/raw`, nothing that holds a path in `protect`
    (the pipelines' source files). Nothing a live run holds either (`live`: the leases of
    `flows.plan.leases`, read under the store's gc lock): its keys, the outputs published since
    `since` (when gc began planning) or since the oldest live run began, scratch folders and locks
    while a run is live, a lock a run holds. What is kept for a run goes into `kept`, with the
    reason."""
    found: list[dict[str, Any]] = []
    if store.root.is_symlink() or not store.root.is_dir():
        return found
    root = store.root.resolve()
    guarded = [p.resolve() for p in protect]
    held = {(folder, key): doc.get("pid") for doc in live for folder, key in doc.get("keys", [])}
    keep_keys = {key for _, key in keep}
    since = min([since or float("inf"), *(float(doc.get("started", 0)) for doc in live)])
    kept = [] if kept is None else kept
    for stage_dir in _stage_folders(store.root):
        for entry in sorted(stage_dir.iterdir()):
            why = spared = None
            if entry.name.startswith("."):
                why, spared = _leftover(entry.name, keep_keys, {key for _, key in held}, bool(live))
                keyed = _KEYED_LEFTOVER.fullmatch(entry.name)
                if why and keyed and _lock_held(stage_dir, keyed.group(2)):
                    why, spared = None, "its lock is held by a run"
            elif (stage_dir.name, entry.name) not in keep and _is_output(stage_dir.name, entry):
                if (stage_dir.name, entry.name) in held:
                    spared = f"held by a live run (pid {held[stage_dir.name, entry.name]})"
                elif _published(entry) >= since:
                    spared = "published after gc began, or by a run that is still live"
                else:
                    why = "not used by any pipeline in pipelines.yaml or kept run on another corpus"
            if spared:
                kept.append({"path": str(entry), "why": spared})
            if not why:
                continue
            real = entry.parent.resolve() / entry.name
            if not real.is_relative_to(root) or any(
                g == real or g.is_relative_to(real) for g in guarded
            ):
                continue
            found.append({"path": str(entry), "mb": _size_mb(entry), "why": why})
            if not dry_run:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
    return found


def collect_remote(
    store: StageStore,
    keep: set[tuple[str, str]],
    dry_run: bool,
    retention_s: float,
    began: float,
    kept: list[dict[str, Any]],
    records: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """gc on an object store (a team's shared store), from any machine: remove published outputs
    that no pipeline in `keep` plans, that no live run on any machine holds, that no run used within
    `retention_s` (the store's lease records, `flows.plan.leases`) and that were published before
    that and before gc began. A manifest goes first, so a reader elsewhere sees the output gone,
    never half there; the local mirror's copy goes too. `records`: the store's lease objects when
    the caller has read them already."""
    import time

    from flows.plan import leases

    now = time.time()
    records = leases.store_records(store) if records is None else records
    live = [r for r in records if r["live"]]
    held = {(f, k): r for r in live for f, k in r.get("keys", [])}
    used = {
        (f, k)
        for r in records
        if not r["live"] and now - float(r.get("ended") or r.get("beat") or 0) < retention_s
        for f, k in r.get("keys", [])
    }
    since = min([began, *(float(r.get("started", now)) for r in live)])
    found = []
    for stage, key in list(_remote_outputs(store)):
        if (stage, key) in keep:
            continue
        where = store.fs.unstrip_protocol(store._remote(stage, key))
        manifest = store.manifest(stage, key)
        spared = (
            f"held by a live run on {held[stage, key].get('host')} (pid "
            f"{held[stage, key].get('pid')})"
            if (stage, key) in held
            else "used by a run within the retention period"
            if (stage, key) in used
            else "published after gc began, or by a run that is still live"
            if manifest.created >= since
            else "published within the retention period"
            if now - manifest.created < retention_s
            else None
        )
        if spared:
            kept.append({"path": where, "why": spared})
            continue
        found.append(
            {
                "path": where,
                "mb": sum(f.get("size", 0) for f in manifest.files.values()) / 2**20,
                "why": f"not used by any pipeline in pipelines.yaml, nor by any run within "
                f"{retention_s / 86400:g} days",
            }
        )
        if not dry_run:
            store.fs.rm_file(store._remote(stage, key, MANIFEST))
            store.fs.rm(store._remote(stage, key), recursive=True)
            shutil.rmtree(store.path(stage, key), ignore_errors=True)
    # records of use older than the retention period, and leases of runs that are gone
    if not dry_run:
        for r in records:
            if not r["live"] and (r.get("ended") is None or now - float(r["ended"]) >= retention_s):
                store.fs.rm_file(r["path"])
    return found
