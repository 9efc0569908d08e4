"""MLflow's SQLite store: write-ahead-log mode for a run's many small writes, a new store
filled with MLflow's schema from this user's cached copy, and one line naming a database that
cannot be read (a crash, a full disk, a copy cut short) instead of pages of tracebacks."""

from __future__ import annotations

import os
import time
from functools import lru_cache
from pathlib import Path

from tasks.errors import ZhpipeError


@lru_cache(maxsize=1)
def sqlite_pragmas() -> None:
    """MLflow's SQLite store in write-ahead-log mode with commits synced at checkpoints: a run
    writes a few hundred small transactions, each of which otherwise waits for the disk, and the UI
    reads while a run writes. A crash of the process loses nothing; a power cut may lose the last
    writes, never the database."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _on_connect(dbapi_connection, _record):
        if isinstance(dbapi_connection, sqlite3.Connection):
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
            finally:
                cursor.close()


# a database up to this size gets SQLite's quick_check (a few ms per MB) on first use; a larger one
# its schema read
QUICK_CHECK_BYTES = 32 << 20


def check_sqlite(path: Path) -> None:
    """One line naming MLflow's SQLite database, and how to move it aside, when it is not a readable
    database (a crash, a full disk, a copy cut short); otherwise MLflow fails later with pages of
    tracebacks."""
    import sqlite3

    if not path.is_file():
        return
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            verdict = (
                con.execute("PRAGMA quick_check(1)").fetchone()[0]
                if path.stat().st_size <= QUICK_CHECK_BYTES
                else "ok"
            )
        finally:
            con.close()
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):  # another run is writing: it is readable
            return
        verdict = str(e)
    except sqlite3.DatabaseError as e:
        verdict = str(e)
    if verdict != "ok":
        raise ZhpipeError(
            f"MLflow's database {path} is unreadable ({verdict.splitlines()[0][:100]}); move it "
            "aside "
            f"(mv {path} {path}.corrupt) and run again: a new one is made, and the stage store's "
            "outputs "
            f"are reused (their earlier runs stay in the old file)"
        )


# the columns that hold where a SQLite store keeps artifacts: (table, column)
ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "storage_location"),
    ("model_versions", "source"),
)


def reroot(path: Path) -> str | None:
    """Point a copied (or moved) project's store at its own artifacts. MLflow records artifact
    locations as absolute paths, so after `cp -a p1 p2` every run of p2 would write its artifacts
    into p1 (and read p1's files as its own). The store's zhpipe experiments were made with
    `artifacts/` beside the database as their location; one that names another folder's `artifacts/`
    was copied from there: every location under that folder is rewritten to this one. Returns the
    folder it was copied from, or None when nothing was rewritten."""
    import sqlite3
    from urllib.parse import unquote, urlparse

    own = (path.parent / "artifacts").resolve().as_uri()
    con = sqlite3.connect(path, timeout=30)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "experiments" not in tables:
            return None
        olds = {
            loc
            for name, loc in con.execute("SELECT name, artifact_location FROM experiments")
            if isinstance(loc, str)
            and name.startswith("zhpipe-")
            and loc.startswith("file://")
            and loc.rstrip("/").endswith("/artifacts")
            and loc.rstrip("/") != own
        }
        if not olds:
            return None
        with con:
            for old in olds:
                old = old.rstrip("/")
                for table, column in ARTIFACT_COLUMNS:
                    if table not in tables:
                        continue
                    for prefix, new in (
                        (old, own),
                        (unquote(urlparse(old).path), unquote(urlparse(own).path)),
                    ):
                        # table and column names from ARTIFACT_COLUMNS above, never from input
                        con.execute(
                            f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                            f"WHERE {column} = ? OR {column} LIKE ? ESCAPE '\\'",
                            (new, len(prefix) + 1, prefix, _like(prefix) + "/%"),
                        )
    finally:
        con.close()
    return ", ".join(sorted(unquote(urlparse(o).path).removesuffix("/artifacts") for o in olds))


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def seed(path: Path) -> bool:
    """Fill a new, empty store with MLflow's schema as MLflow makes it, from this user's cached
    copy: MLflow migrates a new database through its whole history (about 2 s of the first run
    in a new project). The copy is made once per MLflow version, from a throwaway store MLflow
    migrates itself. Under an exclusive lock, and only while the file has no tables: a
    concurrent run's store is never overwritten. False when not seeded (MLflow then makes it)."""
    import sqlite3

    statements = _schema()
    if not statements:
        return False
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        con.execute("BEGIN EXCLUSIVE")
        if con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            con.execute("ROLLBACK")
            return False
        for statement in statements:
            con.execute(statement)
        # MLflow's Default experiment, as MLflow would have made it here and now
        now = int(time.time() * 1000)
        con.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ?"
            " WHERE experiment_id = 0",
            (os.path.abspath("mlruns") + "/0", now, now),
        )
        con.execute("COMMIT")
    finally:
        con.close()
    return True


def _schema() -> list[str] | None:
    """MLflow's schema and initial rows for the installed MLflow, as SQL statements: from the
    cache when it is this user's, else dumped from a store MLflow migrates itself, and cached
    when the cache takes it. None when the cache folder is not private."""
    from importlib.metadata import version

    from flows.plan.private import read_state, user_cache, write_state

    mlflow = version("mlflow")
    folder = user_cache()
    if folder is None:
        return None
    cached = folder / f"mlflow-{mlflow}-schema.json"
    state = read_state(cached)
    if state and state.get("mlflow") == mlflow and isinstance(state.get("statements"), list):
        return state["statements"]
    statements = _migrated_schema(folder)
    try:
        write_state(cached, {"mlflow": mlflow, "statements": statements})
    except OSError:  # a full or read-only home: this store is still seeded
        pass
    return statements


def _migrated_schema(folder: Path) -> list[str]:
    """The SQL of a store MLflow makes and migrates itself, in a throwaway folder under `folder`."""
    import sqlite3
    import tempfile

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        store = SqlAlchemyStore(uri, f"{tmp}/artifacts")
        store.engine.dispose()
        SqlAlchemyStore._engine_map.pop(uri, None)
        con = sqlite3.connect(f"{tmp}/mlflow.db")
        try:
            return [s for s in con.iterdump() if s not in ("BEGIN TRANSACTION;", "COMMIT;")]
        finally:
            con.close()
