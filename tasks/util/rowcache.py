"""Per-row work kept by text, shared by every build on one stage store (`_cache/rowcache.sqlite`):
a row whose text was segmented before, by the same segmenter (its settings, its dictionaries'
contents, its code and its libraries: the `namespace`), is not segmented again, whichever file,
pipeline, label column or partition it came from. So a source file replaced by an edited copy
re-segments only the rows whose text changed, as a snapshot source does. The answers are byte for
byte those the segmenter gives (a cache, never a different result). Neither Prefect nor MLflow."""

from __future__ import annotations

import errno
import hashlib
import json
import sqlite3
import time
from pathlib import Path

FILE = "rowcache.sqlite"
OLD_FILES = (
    "rows.sqlite",
    "rows.sqlite-wal",
    "rows.sqlite-shm",
)  # the first layout's file, replaced
_BATCH = 500  # keys per SELECT (SQLite's variable limit is far above)
CACHE_MB = 64  # SQLite's page cache per connection: the key index of a few million rows stays in it


class RowCache:
    """`get(texts)` -> the kept value of each text (None: not kept); `put(texts, values)` keeps
    them. Values are lists of strings (the words and POS columns of one row). Safe for several
    processes at once (WAL, a wait on a lock): the segment stage's workers read, its driver writes.

    The rows are appended to a rowid table and found through an index of their keys. A key is a
    hash, so a table keyed by it (the first layout) took each new row at a random page: a corpus of
    a million rows spent five times as long keeping its words as cutting them. An index of 20-byte
    keys stays in the page cache (CACHE_MB), the rows go to the table's end, and `put` takes its
    rows in key order, in one transaction."""

    def __init__(self, path: Path | str, namespace: str):
        self.path, self.namespace = Path(path), namespace
        self.db = sqlite3.connect(self.path, timeout=120)
        # a first open by several workers at once: switching to WAL is not waited on
        for attempt in range(600):
            try:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.execute(f"PRAGMA cache_size=-{CACHE_MB * 1024}")
                self.db.execute(
                    "CREATE TABLE IF NOT EXISTS kept (key BLOB NOT NULL, value TEXT NOT NULL)"
                )
                self.db.execute("CREATE UNIQUE INDEX IF NOT EXISTS kept_key ON kept (key)")
                self.db.commit()
                break
            except sqlite3.OperationalError as e:
                if "full" in str(e):
                    raise OSError(errno.ENOSPC, "No space left on device", str(self.path)) from None
                if "locked" not in str(e) or attempt == 599:
                    raise
                time.sleep(0.2)

    def _key(self, text: str) -> bytes:
        return hashlib.sha256(f"{self.namespace}\x00{text}".encode()).digest()[:20]

    def get(self, texts: list[str]) -> list[list[str] | None]:
        keys = [self._key(t) for t in texts]
        found: dict[bytes, list[str]] = {}
        for i in range(0, len(keys), _BATCH):
            chunk = keys[i : i + _BATCH]
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(f"SELECT key, value FROM kept WHERE key IN ({marks})", chunk)
            found.update((k, json.loads(v)) for k, v in rows)
        return [found.get(k) for k in keys]

    def put(self, texts: list[str], values: list[list[str]]) -> None:
        rows = sorted(
            (self._key(t), json.dumps(v, ensure_ascii=False)) for t, v in zip(texts, values)
        )
        try:
            with self.db:
                self.db.executemany("INSERT OR IGNORE INTO kept VALUES (?, ?)", rows)
        # a full disk is said as every full disk is (the file, the space left)
        except sqlite3.OperationalError as e:
            if "full" in str(e):
                raise OSError(errno.ENOSPC, "No space left on device", str(self.path)) from None
            raise

    def close(self) -> None:
        self.db.close()


class Keeper:
    """What the segment stage's driver keeps of the rows its workers cut: `add` buffers them, and
    every PUT_ROWS rows (and at `close`) they go to the cache in one transaction."""

    PUT_ROWS = 20_000

    def __init__(self, cache: RowCache):
        self.cache, self.texts, self.values = cache, [], []

    def add(self, texts: list[str], values: list[list[str]]) -> None:
        self.texts += texts
        self.values += values
        if len(self.texts) >= self.PUT_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.texts:
            self.cache.put(self.texts, self.values)
        self.texts, self.values = [], []

    def close(self) -> None:
        self.flush()
        self.cache.close()


def namespace(*parts: object) -> str:
    """A namespace from everything that defines the kept values (settings, file digests, code,
    versions)."""
    return hashlib.sha256(
        json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str).encode()
    ).hexdigest()[:24]
