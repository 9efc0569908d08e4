"""A new Prefect home starts from a copy of a database Prefect has migrated. A server's first start
in a new home runs Prefect's migrations and registers its block types (9 s until it answers,
against 4 to 4.6 s on a migrated database, 2-core CPU). The first server that starts in a new home
leaves its database, as it stood when it first answered (before any run), in this user's cache
(flows.plan.private.user_cache), one per Prefect version; every later new home gets a copy before
its server starts. A server on another database (PREFECT_API_DATABASE_CONNECTION_URL) is left
alone."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from flows.plan.private import user_cache

DATABASE = "prefect.db"
MEMO = "memo_store.toml"  # Prefect's record that its block types are registered


def _cached() -> Path | None:
    from importlib.metadata import version

    folder = user_cache()
    return None if folder is None else folder / f"prefect-{version('prefect')}.db"


def new(home: Path) -> bool:
    """Whether a server started now in `home` would make its database (Prefect's SQLite default)."""
    own = not os.environ.get("PREFECT_API_DATABASE_CONNECTION_URL")
    return own and not (home / DATABASE).exists()


def prepare(home: Path) -> bool:
    """Before a server starts in `home`: a new home gets the cached database. True when the server
    will make its database there (then `keep` it once the server answers)."""
    return new(home) and not seed(home)


def seed(home: Path) -> bool:
    """Before a server starts in a new `home`: the cached database (and Prefect's memo of its
    block types) copied there, 0600. False when there is none to copy or the home has one."""
    cached = _cached() if new(home) else None
    if cached is None or not cached.is_file() or cached.is_symlink():
        return False
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / f".{DATABASE}.{os.getpid()}.tmp"
    try:
        shutil.copyfile(cached, tmp)
        tmp.chmod(0o600)
        os.link(tmp, home / DATABASE)  # never over a database another command made meanwhile
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    memo = cached.with_suffix(".memo.toml")
    if memo.is_file() and not (home / MEMO).exists():
        shutil.copyfile(memo, home / MEMO)
    return True


def keep(home: Path) -> None:
    """Once a server that made its database in `home` answers, before any run: that database into
    the cache, without Prefect's telemetry session (each server makes its own). Skipped when the
    cache has one or cannot take it."""
    cached = _cached()
    if cached is None or cached.exists():
        return
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    try:
        source = sqlite3.connect(f"file:{home / DATABASE}?mode=ro", uri=True, timeout=10)
        target = sqlite3.connect(tmp)
        try:
            source.backup(target)
            tables = {r[0] for r in target.execute("SELECT name FROM sqlite_master")}
            if "configuration" in tables:
                target.execute("DELETE FROM configuration WHERE key = 'TELEMETRY_SESSION'")
                target.commit()
        finally:
            source.close()
            target.close()
        tmp.chmod(0o600)
        if (home / MEMO).is_file():
            shutil.copyfile(home / MEMO, cached.with_suffix(".memo.toml"))
        os.replace(tmp, cached)
    except (OSError, sqlite3.Error):
        pass  # the next new home makes its own, as before
    finally:
        tmp.unlink(missing_ok=True)
