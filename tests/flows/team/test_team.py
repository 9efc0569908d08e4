"""A team on one registry, as docs/team.md sets it up, every part real and on loopback: PostgreSQL
behind an `mlflow server` (MLflow's basic-auth app, artifacts proxied into moto's S3 server) and
behind a `prefect server` with an auth string; the stage store in the bucket. Two engineers are two
machines: a folder each with its own HOME and project folder (pipelines.yaml and the smoke corpus,
as a clone has them), reaching each other only through the servers."""

from __future__ import annotations

import os
import re
import time
from collections import Counter

import pytest

from tests.helpers.procs import start, zhpipe
from tests.helpers.team import STORE, machine

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def machines(team, tmp_path_factory):
    return {user: machine(team, tmp_path_factory.mktemp(user), user) for user in ("alice", "bob")}


def printed(done) -> str:
    return done.stdout + done.stderr


def ok(done) -> str:
    assert done.returncode == 0, printed(done)[-4000:]
    # the team's UI is the tracking server, never the engineer's empty local store
    assert "zhpipe ui" not in printed(done)
    return printed(done)


def bucket(team):
    import fsspec

    return fsspec.filesystem(
        "s3", endpoint_url=team.s3["AWS_ENDPOINT_URL"], key="zhpipe-test", secret="zhpipe-test"
    )


def test_two_engineers_on_two_machines_share_one_registry_and_store(team, machines):
    (alice, a_dir), (bob, b_dir) = machines["alice"], machines["bob"]
    first = ok(zhpipe(alice, "run", "smoke", cwd=a_dir))
    assert f"see it at {team.tracking}/#/experiments/" in first and "│ miss" in first
    # bob's machine has nothing of alice's: every stage a hit from the bucket
    second = ok(zhpipe(bob, "run", "smoke", cwd=b_dir))
    assert (
        "│ miss" not in second
        and second.count("│ hit") >= 10
        and f"see it at {team.tracking}/#/experiments/" in second
    )
    # MLflow's own per-run link lines: the run prints one link, at its end
    assert "🏃 View run" not in first + second

    assert "missing" not in ok(zhpipe(bob, "status", "smoke", cwd=b_dir)) and "stale" not in ok(
        zhpipe(bob, "status", "smoke", cwd=b_dir)
    )
    runs = ok(zhpipe(bob, "runs", "smoke", cwd=b_dir))
    ids = [re.search(r"parent run ([0-9a-f]{12})", done).group(1) for done in (first, second)]
    # both engineers' runs in the one experiment
    assert all(re.search(rf"^│ {i} │", runs, re.M) for i in ids), runs
    assert "test_accuracy" in ok(zhpipe(alice, "compare", *ids, "--all", cwd=a_dir))
    assert "pred_label" in ok(
        zhpipe(alice, "predict", "--pipeline", "smoke", "房间很干净，早餐也好", cwd=a_dir)
    )
    for who, folder in machines.values():
        assert re.search(
            r"\d+ outputs checked in s3://team/zhpipe: \d+ sound, 0 corrupt",
            ok(zhpipe(who, "verify", cwd=folder)),
        )
    assert "0 items" in ok(zhpipe(bob, "gc", "--dry-run", cwd=b_dir))
    # the outputs live in the bucket (each machine mirrors)
    assert bucket(team).exists(f"{STORE.removeprefix('s3://')}/train")


def test_gc_from_another_machine_keeps_what_a_live_run_holds_and_recent_use(
    team, machines, tmp_path
):
    """bob's pipelines.yaml plans none of alice's outputs: gc from his machine keeps what alice used
    within the retention period, and with no retention still keeps what her live run holds; it says
    why for each."""
    alice, a_dir = machines["alice"]
    bob, b_dir = machine(team, tmp_path / "bobs-other-project", "bob")
    text = (b_dir / "pipelines.yaml").read_text()
    # the pipelines before smoke: none was run
    (b_dir / "pipelines.yaml").write_text(text.split("\n  smoke:", 1)[0] + "\n")
    recent = ok(zhpipe(bob, "gc", "--dry-run", cwd=b_dir))
    assert re.search(r"^0 items", recent, re.M) and "kept " in recent, recent
    assert "would remove" in ok(zhpipe(bob, "gc", "--dry-run", "--keep-days", "0", cwd=b_dir))

    # new from split on
    live = start(alice, a_dir, "run", "smoke", "--set", "split.seed=3", log=tmp_path / "alice.log")
    fs, leases = bucket(team), f"{STORE.removeprefix('s3://')}/_cache/leases"
    deadline = time.monotonic() + 300
    while "segment: building" not in (tmp_path / "alice.log").read_text():
        assert live.poll() is None and time.monotonic() < deadline, (
            tmp_path / "alice.log"
        ).read_text()[-3000:]
        time.sleep(0.3)
    swept = ok(zhpipe(bob, "gc", "--keep-days", "0", cwd=b_dir))
    assert live.wait(600) == 0, (tmp_path / "alice.log").read_text()[-3000:]
    assert re.search(r"kept for 1 live run", swept) and "removed " in swept, swept
    assert any(p.endswith(".json") for p in fs.ls(leases, detail=False))
    verified = ok(zhpipe(alice, "verify", cwd=a_dir))
    assert " 0 corrupt" in verified
    # what the live run used is all still there
    again = ok(zhpipe(alice, "run", "smoke", "--set", "split.seed=3", cwd=a_dir))
    assert "│ miss" not in again, again


def test_eight_overlapping_runs_build_each_unit_once_and_decide_once(team, machines, tmp_path):
    from mlflow.tracking import MlflowClient

    # every stage from split on is new to the store
    argv = ("run", "smoke", "--set", "split.seed=7")
    procs = []
    for i in range(8):
        env, folder = machines["alice" if i % 2 else "bob"]
        procs.append(
            (start(env, folder, *argv, log=tmp_path / f"run-{i}.log"), tmp_path / f"run-{i}.log")
        )
    logs = []
    for proc, log in procs:
        code = proc.wait(900)
        logs.append(log.read_text())
        assert code == 0, logs[-1][-4000:]
    built = Counter(
        key
        for text in logs
        for key in re.findall(r"zhpipe [\w.]+: building \(([0-9a-f]{16})\)", text)
    )
    # every unit built by exactly one of the eight
    assert len(built) >= 10 and set(built.values()) == {1}, built
    waited = [line for text in logs for line in text.splitlines() if "waiting for it" in line]
    assert waited, "no run waited for another"
    decisions = [
        re.findall(r"registry: zhpipe-smoke version (\d+) \((\w+)\): (.*)", text) for text in logs
    ]
    assert all(len(d) == 1 for d in decisions), decisions  # one champion decision each
    versions = {d[0][0] for d in decisions}
    # all eight about one version: no two versions from one key
    assert len(versions) == 1, decisions

    client = MlflowClient(team.tracking)
    os.environ.update(
        {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "alice-password-1"}
    )
    try:
        registered = client.search_model_versions("name='zhpipe-smoke'")
        keys = Counter(v.tags.get("zhpipe.model_key") or v.run_id for v in registered)
        assert set(keys.values()) == {1}, keys
        champion = client.get_model_version_by_alias("zhpipe-smoke", "champion").version
    finally:
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            os.environ.pop(key)
    (version,) = versions
    promoted = [
        d for d in decisions if "becomes champion" in d[0][2] or "it is the champion" in d[0][2]
    ]
    assert (str(champion) == version) == bool(promoted), (champion, decisions)


WORKER_PIPELINE = """
  smoke-gpu:
    description: the smoke corpus, its training on the team's GPU pool
    work_pool: team-cpu
    source: {path: tests/fixtures/smoke.csv, format: csv, text_column: review, label_column: label}
    stages:
      train: {work_pool: team-gpu, models: [tfidf_lr, fasttext]}
"""


def test_a_worker_with_no_corpus_and_another_path_trains_for_an_engineer(team, tmp_path):
    """A third machine runs the team's GPU pool (here a CPU): a checkout of the repository's
    pipelines.yaml at a path of its own, no corpus, the team's servers in its environment. alice's
    run sends its training there: the worker plans the same keys without the corpus, trains from the
    bucket and logs under alice's parent run."""
    from mlflow.tracking import MlflowClient

    alice, a_dir = machine(team, tmp_path / "alice", "alice")
    worker_env, w_dir = machine(team, tmp_path / "gpu-box", "bob", corpora=())
    for project in (a_dir, w_dir):
        with open(project / "pipelines.yaml", "a") as f:
            f.write(WORKER_PIPELINE)
    worker_env = {**worker_env, "ZHPIPE_PROJECT": str(w_dir), "PREFECT_WORKER_QUERY_SECONDS": "2"}
    assert not (w_dir / "tests").exists()
    ok(zhpipe(alice, "deploy", "smoke-gpu", cwd=a_dir))
    worker = start(
        worker_env,
        tmp_path / "gpu-box",
        "worker",
        "--pool",
        "team-gpu",
        log=tmp_path / "worker.log",
    )
    try:
        done = ok(zhpipe(alice, "run", "smoke-gpu", timeout=900, cwd=a_dir))
    finally:
        from tests.helpers.procs import stop

        stop(worker, grace=10)
    assert "train: submitting to work pool 'team-gpu'" in done, done[-3000:]
    trained = (tmp_path / "worker.log").read_text()
    assert (
        re.search(r"train\.tfidf_lr: building", trained) and "train.tfidf_lr: building" not in done
    ), trained[-3000:]
    parent = re.search(r"parent run ([0-9a-f]{32})", done).group(1)
    os.environ.update(
        {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "alice-password-1"}
    )
    try:
        client = MlflowClient(team.tracking)
        runs = client.search_runs([client.get_experiment_by_name("zhpipe-smoke-gpu").experiment_id])
    finally:
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            os.environ.pop(key)
    train_runs = [r for r in runs if r.info.run_name == "train"]
    assert train_runs and all(
        r.data.tags.get("mlflow.parentRunId") == parent for r in train_runs
    ), [r.data.tags for r in runs]
