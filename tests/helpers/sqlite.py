"""Copies of SQLite databases that are open elsewhere in the test process."""

import sqlite3
from pathlib import Path


def copy_sqlite(src: Path, dst: Path) -> Path:
    """A consistent copy made through SQLite's backup API, also of a database that is being written.
    Never read such a file with open(): closing it drops the POSIX locks this process's own SQLite
    connections hold on it (locks belong to the process, and any close of the file releases them
    all), so the next process to close the database takes itself for the last user, deletes its
    write-ahead log under those connections, and leaves them reading a stale database."""
    source, target = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    return dst
