"""Per-row work kept by text, shared by every build on one stage store (`_cache/rows.sqlite`): a row
whose text was segmented before, by the same segmenter (its settings, its dictionaries' contents,
its code and its libraries: the `namespace`), is not segmented again, whichever file, pipeline,
label column or partition it came from. So a source file replaced by an edited copy re-segments only
the rows whose text changed, as a snapshot source does. The answers are byte for byte those the
segmenter gives (a cache, never a different result). Neither Prefect nor MLflow."""

from __future__ import annotations

import errno
import hashlib
import json
import sqlite3
import time
from pathlib import Path

FILE = "rows.sqlite"
_BATCH = 500  # keys per SELECT (SQLite's variable limit is far above)


class RowCache:
    """`get(texts)` -> the kept value of each text (None: not kept); `put(texts, values)` keeps
    them. Values are lists of strings (the words and POS columns of one row). Safe for several
    processes at once (WAL, a wait on a lock)."""

    def __init__(self, path: Path | str, namespace: str):
        self.path, self.namespace = Path(path), namespace
        self.db = sqlite3.connect(self.path, timeout=120)
        # a first open by several workers at once: switching to WAL is not waited on
        for attempt in range(600):
            try:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.execute(
                    "CREATE TABLE IF NOT EXISTS rows (key BLOB PRIMARY KEY, value TEXT NOT NULL) "
                    "WITHOUT ROWID"
                )
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
            rows = self.db.execute(
                f"SELECT key, value FROM rows WHERE key IN ({','.join('?' * len(chunk))})", chunk
            )
            found.update((k, json.loads(v)) for k, v in rows)
        return [found.get(k) for k in keys]

    def put(self, texts: list[str], values: list[list[str]]) -> None:
        try:
            with self.db:
                self.db.executemany(
                    "INSERT OR IGNORE INTO rows VALUES (?, ?)",
                    [
                        (self._key(t), json.dumps(v, ensure_ascii=False))
                        for t, v in zip(texts, values)
                    ],
                )
        # a full disk is said as every full disk is (the file, the space left)
        except sqlite3.OperationalError as e:
            if "full" in str(e):
                raise OSError(errno.ENOSPC, "No space left on device", str(self.path)) from None
            raise

    def close(self) -> None:
        self.db.close()


def namespace(*parts: object) -> str:
    """A namespace from everything that defines the kept values (settings, file digests, code,
    versions)."""
    return hashlib.sha256(
        json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str).encode()
    ).hexdigest()[:24]
