"""Live runs' leases on a stage store, so that `zhpipe gc` never removes what a run still holds.

A run writes a lease while it lives: `<store>/_cache/leases/<pid>-<random>.json`, the keys it
planned (updated when it plans again) and its start time, with an exclusive `flock` on the file held
until the run ends (a killed run's lock goes with its process, so its lease reads as stale). Leases
are written, and gc reads them and removes what it removes, under the store's gc lock
(`_cache/gc.lock`): a run that starts while gc walks the store waits a moment for it; one that
started before is in the leases gc reads.

On an object store (a team's store, several machines, no shared file system) a run also writes its
lease as an object, `<root>/_cache/leases/<host>-<pid>-<random>.json`, with a heartbeat rewritten
every BEAT_S seconds; it is live while its heartbeat is younger than TTL_S. When the run ends the
object stays as a record of use (`ended`): gc on the object store keeps what any engineer's run used
within the retention period, and what live runs on any machine hold. Neither Prefect nor MLflow."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.plan.store import StageStore, unit_folder

LEASES = "leases"
GC_LOCK = "gc.lock"
GC_WAIT_S = 600  # a run waits this long for a gc that walks the store before it says so and stops
BEAT_S = 60  # a run on an object store rewrites its lease object this often
TTL_S = 600  # a lease object whose heartbeat is older than this belongs to a run that is gone


def _folder(store: StageStore) -> Path:
    folder = store.root / "_cache" / LEASES
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def gc_lock(store: StageStore, wait_s: float = GC_WAIT_S, what: str = "") -> Iterator[None]:
    """The store's gc lock, held exclusively: gc holds it while it reads the leases and removes; a
    run holds it for the moment it writes its lease."""
    from filelock import FileLock, Timeout

    from tasks.errors import ZhpipeError

    lock = FileLock(_folder(store).parent / GC_LOCK)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if what:
            print(what, flush=True)
        try:
            lock.acquire(timeout=wait_s)
        except Timeout:
            raise ZhpipeError(
                f"{store.url}: the store's gc lock ({lock.lock_file}) was held for {wait_s:.0f} s; "
                "is a `zhpipe gc` stuck? Stop it and try again"
            ) from None
    try:
        yield
    finally:
        lock.release()


class Lease:
    """A live run's hold on its keys (see the module's text); `update` after the run plans again."""

    def __init__(self, store: StageStore, keys: dict[str, str]):
        self.store = store
        self.path = _folder(store) / f"{os.getpid()}-{secrets.token_hex(4)}.json"
        self.started = time.time()
        with gc_lock(
            store, what=f"{store.url}: `zhpipe gc` is walking the store; this run waits for it"
        ):
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.pairs: set[tuple[str, str]] = set()
            self._write(keys)
        self._remote = None
        if store.fs is not None:
            import socket
            import threading

            self._remote = f"{store.base}/_cache/{LEASES}/{socket.gethostname()}-{self.path.name}"
            self._beating = threading.Event()
            self._publish()
            threading.Thread(target=self._beat, daemon=True, name="zhpipe-lease").start()

    def __getstate__(self) -> dict:
        """A copy sent to another process (a Dask worker, a spawned trainer, with the run's context)
        holds nothing: no file descriptor, no heartbeat; only the process that made the lease
        releases it."""
        return {
            "store": self.store,
            "path": self.path,
            "started": self.started,
            "pairs": self.pairs,
            "_fd": None,
            "_remote": None,
        }

    def update(self, keys: dict[str, str]) -> None:
        """Hold the keys of a (new) plan too; those of an old plan stay held: their outputs may
        still be read."""
        if self._fd is None:  # a copy in another process, or a released lease
            return
        with gc_lock(self.store):
            self._write(keys)

    def _write(self, keys: dict[str, str]) -> None:
        self.pairs |= {(unit_folder(str(u)), k) for u, k in keys.items()}
        data = json.dumps(
            {"pid": os.getpid(), "started": self.started, "keys": sorted(self.pairs)}
        ).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        if getattr(self, "_remote", None):
            self._publish()

    def _publish(self, ended: float | None = None) -> None:
        """The lease object on the object store (best effort: a store that does not answer fails the
        run elsewhere)."""
        import socket

        doc = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": self.started,
            "beat": time.time(),
            "keys": sorted(self.pairs),
            **({"ended": ended} if ended else {}),
        }
        try:
            self.store.fs.pipe_file(self._remote, json.dumps(doc).encode())
        except Exception:  # noqa: BLE001 - fsspec backends raise their own errors
            pass

    def _beat(self) -> None:
        while not self._beating.wait(BEAT_S):
            self._publish()

    def release(self) -> None:
        if self._fd is None:
            return
        if self._remote:
            self._beating.set()
            self._publish(ended=time.time())  # kept as the record that this run used these keys
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@contextlib.contextmanager
def held(store: StageStore, keys: dict[str, str]) -> Iterator[Lease]:
    lease = Lease(store, keys)
    try:
        yield lease
    finally:
        lease.release()


def live(store: StageStore) -> list[dict[str, Any]]:
    """The leases of live runs (call under `gc_lock`); a stale one (its run is gone: nobody holds
    its lock) is removed."""
    found = []
    for path in sorted(_folder(store).glob("*.json")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its run lives
                doc = read(path)
                if doc is not None:
                    found.append(doc)
                continue
            path.unlink(missing_ok=True)  # ours now, so no run holds it: a killed run's
        finally:
            os.close(fd)
    return found


def store_records(store: StageStore) -> list[dict[str, Any]]:
    """The lease objects of an object store, each with `live` (its heartbeat younger than TTL_S, not
    ended)."""
    folder = f"{store.base}/_cache/{LEASES}"
    if store.fs is None or not store.fs.exists(folder):
        return []
    found, now = [], time.time()
    for path in store.fs.ls(folder, detail=False):
        try:
            doc = json.loads(store.fs.cat_file(path))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            found.append(
                {
                    **doc,
                    "path": path,
                    "live": "ended" not in doc and now - float(doc.get("beat", 0)) < TTL_S,
                }
            )
    return found
