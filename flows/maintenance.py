"""Keeping a stage store sound and small: `zhpipe verify` checks every output against its manifest, `zhpipe gc`
removes outputs that no pipeline references and what killed builds left behind."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from flows.store import MANIFEST, StageStore, _alive

SHARED = {"_downloads", "_cache", ".remote"}  # shared by all keys: never collected


def _outputs(store: StageStore):
    """(stage, key) of every finished output in the store's local folder."""
    if not store.root.is_dir():
        return
    for stage_dir in sorted(p for p in store.root.iterdir() if p.is_dir() and p.name not in SHARED):
        for out in sorted(p for p in stage_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if (out / MANIFEST).is_file():
                yield stage_dir.name, out.name


def verify_store(store: StageStore) -> list[dict[str, Any]]:
    """Every finished output with the problems a full check finds (sizes and sha256 of every file)."""
    return [{"stage": stage, "key": key, "problems": store.verify(stage, key, full=True)} for stage, key in _outputs(store)]


def _size_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def _leftover(name: str, keep_keys: set[str]) -> str | None:
    """Why a dot-entry of a stage folder can go, or None to keep it."""
    if name.startswith((".tmp-", ".old-", ".get-")):
        pid = name.rsplit("-", 1)[-1]
        if pid.isdigit() and _alive(int(pid)):
            return None  # a build in progress
        return "left by a killed build"
    for prefix, what in ((".scratch-", "checkpoints"), (".lock-", "lock")):
        if name.startswith(prefix) and name.removeprefix(prefix) not in keep_keys:
            return f"{what} of an output no pipeline uses"
    return None


def collect_garbage(store: StageStore, keep: set[tuple[str, str]], dry_run: bool = False) -> list[dict[str, Any]]:
    """Remove (or with `dry_run` only list) outputs whose (stage, key) is not in `keep`, and leftovers."""
    found = []
    if not store.root.is_dir():
        return found
    keep_keys = {key for _, key in keep}
    for stage_dir in sorted(p for p in store.root.iterdir() if p.is_dir() and p.name not in SHARED):
        for entry in sorted(stage_dir.iterdir()):
            if entry.name.startswith("."):
                why = _leftover(entry.name, keep_keys)
            elif (stage_dir.name, entry.name) not in keep:
                why = "not used by any pipeline in pipelines.yaml"
            else:
                why = None
            if why:
                found.append({"path": str(entry), "mb": _size_mb(entry), "why": why})
                if not dry_run:
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
    return found
