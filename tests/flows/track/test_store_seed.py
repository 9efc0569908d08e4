"""A project's new MLflow store gets MLflow's schema from the user's cached copy instead of
MLflow's migrations (flows/track/sqlite.py): the same tables, indexes and rows as MLflow makes,
private, never over a store in use."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest


def schema(db: Path) -> dict:
    """Each table, index and trigger of `db`, its SQL as a set of lines (MLflow's own migrations
    write a table's constraints in varying order), the alembic revision and the Default
    experiment's location."""
    con = sqlite3.connect(db)
    try:
        objects = {
            (kind, name): frozenset(line.strip().rstrip(",") for line in (sql or "").splitlines())
            for kind, name, sql in con.execute("SELECT type, name, sql FROM sqlite_master")
        }
        revision = con.execute("SELECT version_num FROM alembic_version").fetchall()
        default = con.execute(
            "SELECT name, artifact_location, lifecycle_stage FROM experiments"
        ).fetchall()
    finally:
        con.close()
    return {"objects": objects, "revision": revision, "default": default}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZHPIPE_USER_CACHE", str(tmp_path / "cache"))
    # MLflow puts its Default experiment's artifacts under the working folder
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache"


def test_a_new_store_is_seeded_with_the_schema_mlflow_makes(tmp_path, cache, monkeypatch):
    from mlflow.tracking import MlflowClient

    from flows.track import tracker
    from flows.track.sqlite import seed

    made = tmp_path / "made.db"
    MlflowClient(f"sqlite:///{made}").search_experiments()  # migrated by MLflow itself
    new = tmp_path / "project" / "mlruns" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{new}")
    client = tracker.client()  # a new project's store: seeded on first use
    assert schema(new) == schema(made) and len(schema(new)["objects"]) > 100

    (cached,) = cache.iterdir()
    assert cached.name.startswith("mlflow-") and cached.stat().st_mode & 0o777 == 0o600
    assert cache.stat().st_mode & 0o777 == 0o700 and new.stat().st_mode & 0o777 == 0o600

    experiment = client.create_experiment("zhpipe-seeded")  # MLflow accepts the store as its own
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "accuracy", 0.5)
    assert client.get_run(run.info.run_id).data.metrics == {"accuracy": 0.5}
    assert seed(new) is False  # a store with tables is never filled again
    assert client.get_run(run.info.run_id).data.metrics == {"accuracy": 0.5}


def test_two_runs_seeding_one_new_store_at_once_fill_it_once(tmp_path, cache):
    from flows.track.sqlite import seed

    new = tmp_path / "mlflow.db"
    new.touch(mode=0o600)
    seed(tmp_path / "warm-the-cache.db")
    results = []
    threads = [threading.Thread(target=lambda: results.append(seed(new))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]
    assert len(schema(new)["revision"]) == 1 and len(schema(new)["default"]) == 1


def test_a_cache_open_to_others_or_unreadable_is_not_used(tmp_path, cache):
    from flows.track.sqlite import seed

    assert seed(tmp_path / "first.db")
    (cached,) = cache.iterdir()
    cached.write_text("{not json")  # cut short: made again from MLflow's migrations
    assert seed(tmp_path / "second.db") and schema(tmp_path / "second.db") == schema(
        tmp_path / "first.db"
    )

    cache.chmod(0o755)  # open to other users: nothing is read from it or written to it
    cached.write_text(
        '{"mlflow": "%s", "statements": ["CREATE TABLE planted (x)"]}' % cached.name.split("-")[1]
    )
    assert seed(tmp_path / "third.db") is False and not (tmp_path / "third.db").exists()
