"""Small records a stage store keeps beside its outputs, under `_records/` (never collected by gc):
on a local store a folder only its owner reaches, on an object store the team's bucket, which only
its engineers' machines write. The digest of a logged model's files is one (flows.track.trust)."""

from __future__ import annotations

from flows.plan.store import StageStore
from tasks.util.io import atomic_write_text

FOLDER = "_records"


def write_record(store: StageStore, name: str, text: str) -> None:
    """`text` as the record `name` of `store` (written atomically; uploaded to an object store)."""
    local = store.root / FOLDER / name
    local.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(local, text)
    if store.fs is not None:
        store.fs.makedirs(f"{store.base}/{FOLDER}", exist_ok=True)
        store.fs.put_file(str(local), f"{store.base}/{FOLDER}/{name}")


def read_record(store: StageStore, name: str) -> str | None:
    """The record `name` of `store`; None when there is none (an object store's copy, not the local
    mirror's)."""
    if store.fs is not None:
        try:
            return store.fs.cat_file(f"{store.base}/{FOLDER}/{name}").decode("utf-8")
        except FileNotFoundError:
            return None
    local = store.root / FOLDER / name
    return local.read_text(encoding="utf-8") if local.is_file() else None
