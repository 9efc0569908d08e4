"""Deployments against a real `prefect server` on loopback, with real process workers on two work
pools: the pipeline runs on its schedule, its train stage is routed to the second pool, MLflow nests
the train run under the pipeline's parent run, and `zhpipe deploy` keeps the deployments in step
with the file."""

import os
import socket
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers.procs import stop, zhpipe, zhpipe_argv
from tests.helpers.runs import without_profile

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def server(tmp_path_factory, seed_prefect_home):
    """`prefect server start` on a free loopback port, with its own home and database."""
    home = seed_prefect_home(tmp_path_factory.mktemp("prefect-server"))
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": "",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        # a deployment's schedule has its runs within seconds
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
    }
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"

    def healthy():
        assert proc.poll() is None, (home / "server.log").read_text()[-3000:]
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, 180, "prefect server to start")
    yield {"url": url, "home": home}
    proc.terminate()
    proc.wait(30)
    log.close()


@pytest.fixture(scope="module")
def env(server, tmp_path_factory, seed_mlflow):
    """Environment of every process in this module: the server, one store, one MLflow database."""
    tmp = tmp_path_factory.mktemp("deploy")
    return {
        **os.environ,
        "PREFECT_API_URL": server["url"],
        "PREFECT_HOME": str(server["home"]),
        "ZHPIPE_STORAGE": str(tmp / "store"),
        "MLFLOW_TRACKING_URI": seed_mlflow(tmp / "mlflow.db"),
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }


def write_pipelines(path: Path, schedule: dict | None, train_pool: str | None) -> Path:
    """The smoke pipeline, cut down to a quick classifier, with a schedule and a train work pool."""
    doc = yaml.safe_load((ROOT / "pipelines.yaml").read_text(encoding="utf-8"))
    tiny = doc["pipelines"]["smoke"]
    tiny["source"]["path"] = str(ROOT / "tests" / "fixtures" / "smoke.csv")
    tiny["stages"]["train"].update({"models": ["tfidf_lr"], "work_pool": train_pool})
    tiny["work_pool"] = "cpu-test"
    tiny["parameters"] = {
        # a path outside the project is refused even so
        "allow_overrides": ["split.seed", "segment.*"],
        "stages": without_profile(),
    }  # its pictures are not what is tested here
    if schedule:
        tiny["schedule"] = schedule
    path.write_text(
        yaml.safe_dump({"pipelines": {"tiny": tiny}}, allow_unicode=True), encoding="utf-8"
    )
    return path


@pytest.fixture
def workers(env, tmp_path):
    """One process worker per pool, started the way the README says."""
    procs = []
    for pool in ("cpu-test", "gpu-test"):
        log = open(tmp_path / f"worker-{pool}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    zhpipe_argv("worker", "--pool", pool),
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                ),
                log,
            )
        )
    yield tmp_path
    stop(*(proc for proc, _ in procs))
    for _, log in procs:
        log.close()


NIGHTLY = {
    "cron": "0 3 * * *",
    "timezone": "Asia/Shanghai",
}  # never due while a test runs: the test starts one run itself


def run_the_next_scheduled(c, deployment_id):
    """The schedule triggered instead of waited for: the first run Prefect's scheduler made for the
    deployment (an auto-scheduled run, days ahead) is moved to now; its other runs stay days ahead.
    No test waits on a cron minute."""
    from datetime import datetime

    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.states import Scheduled

    def scheduled():
        return c.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=["SCHEDULED"]))
            ),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        )

    first = wait_for(scheduled, 120, "the scheduler to make the deployment's runs")[0]
    assert first.auto_scheduled and first.expected_start_time > datetime.now(UTC)
    c.set_flow_run_state(first.id, Scheduled(scheduled_time=datetime.now(UTC)), force=True)
    return first.id


def client(env):
    from prefect.client.orchestration import SyncPrefectClient

    return SyncPrefectClient(env["PREFECT_API_URL"])


def test_scheduled_pipeline_trains_on_the_second_pool(env, workers, tmp_path):
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )

    config = write_pipelines(tmp_path / "pipelines.yaml", NIGHTLY, "gpu-test")
    proc = zhpipe(env, "deploy", "--config", str(config))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "zhpipe/tiny" in proc.stdout and "gpu-test" in proc.stdout

    with client(env) as c:
        main = c.read_deployment_by_name("zhpipe/tiny")
        train = c.read_deployment_by_name("zhpipe-train/tiny")
        assert main.work_pool_name == "cpu-test" and train.work_pool_name == "gpu-test"
        assert [s.schedule.cron for s in main.schedules] == ["0 3 * * *"]
        assert main.schedules[0].schedule.timezone == "Asia/Shanghai"

        def completed(deployment_id):
            runs = c.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=["COMPLETED", "FAILED", "CRASHED"])
                    )
                ),
            )
            return runs

        def finished(run_id):
            run = c.read_flow_run(run_id)
            return run if run.state.is_final() else None

        # the scheduler's next run, moved to now; the cpu worker picks it up
        triggered = run_the_next_scheduled(c, main.id)
        # while it runs, a run started through the API that sets what the file does not allow fails
        # in one line naming it (which names come first, and the refused overrides, is test_guard's)
        bad = c.create_flow_run_from_deployment(
            main.id,
            parameters={
                "storage": "/tmp/elsewhere",
                "dask": "tcp://10.0.0.9:8786",
                "source": {"path": "/etc/passwd"},
                "overrides": ["segment.stopwords=/etc/passwd", "train.epochs=3"],
            },
        )
        run = wait_for(lambda: finished(triggered), 900, "a scheduled run of zhpipe/tiny to finish")
        logs = "".join(p.read_text() for p in workers.glob("worker-*.log"))
        assert run.state.type.value == "COMPLETED", logs[-4000:]
        assert run.auto_scheduled
        train_runs = completed(train.id)
        assert [r.state.type.value for r in train_runs] == ["COMPLETED"], logs[-4000:]
        assert train_runs[0].work_pool_name == "gpu-test"
        assert train_runs[0].parent_task_run_id is not None  # a subflow of the pipeline run

        refused = wait_for(lambda: finished(bad.id), 600, "the refused run").state
        assert (
            refused.type.value == "FAILED"
            and "deployment run refused: it may not set source, storage, dask" in refused.message
        ), refused
        # and of the schedule's runs only the one moved to now ran: the others stay days ahead
        assert {r.id for r in completed(main.id)} == {triggered, bad.id}

    # MLflow: one parent run; the train stage run (logged by the gpu worker) and its model runs sit
    # under it
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = mlflow.get_experiment_by_name("zhpipe-tiny")
    all_runs = mlflow.search_runs([exp.experiment_id])
    parents = [r for r in all_runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    by_name = {r.info.run_name: r for r in all_runs}
    assert by_name["train"].data.tags["mlflow.parentRunId"] == parent
    assert by_name["train"].data.tags["zhpipe.cache"] == "miss"
    model_run = next(r for r in all_runs if r.data.tags.get("zhpipe.model") == "tfidf_lr")
    assert (
        model_run.info.run_name.startswith("tfidf_lr · tiny ")
        and model_run.data.tags["mlflow.parentRunId"] == parent
    )
    assert parents[0].data.metrics["best_test_accuracy"] > 0.5

    # the file is the truth: without a schedule and a train pool, redeploying removes both
    config = write_pipelines(tmp_path / "pipelines.yaml", None, None)
    proc = zhpipe(env, "deploy", "--config", str(config))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with client(env) as c:
        assert c.read_deployment_by_name("zhpipe/tiny").schedules == []
        from prefect.exceptions import ObjectNotFound

        with pytest.raises(ObjectNotFound):
            c.read_deployment_by_name("zhpipe-train/tiny")


def test_deploy_without_a_server_is_one_error_line(tmp_path):
    env = {**os.environ, "PREFECT_API_URL": ""}
    proc = zhpipe(env, "deploy", "smoke")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("zhpipe: error: no Prefect server")


def test_routing_to_a_pool_without_its_deployment_fails_clearly(tmp_path, capsys):
    from tests.helpers.cli import in_process

    config = write_pipelines(tmp_path / "pipelines.yaml", None, "nowhere")
    # on the suite's server: no such deployment either
    proc = in_process(capsys, "run", "tiny", "--config", config, "--force", "train")
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "deployment 'zhpipe-train/tiny' does not exist" in last and "zhpipe deploy tiny" in last
    # said before any stage ran, not after the data stages
    assert "building" not in proc.stdout + proc.stderr


def test_another_corpus_cannot_train_on_a_pool_and_is_told_before_any_stage(tmp_path, capsys):
    from tests.helpers.cli import in_process

    config = write_pipelines(tmp_path / "pipelines.yaml", None, "gpu-test")
    proc = in_process(
        capsys,
        "run",
        "tiny",
        "--config",
        config,
        "--source",
        ROOT / "tests" / "fixtures" / "smoke.csv",
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        "a run with --source cannot train on another work pool"
        in proc.stderr.strip().splitlines()[-1]
    )
    assert "building" not in proc.stdout + proc.stderr


HOLD = """
import json, sys, time
from flows.orchestrate.workers import gpu_slot
with gpu_slot("zhpipe-gpu-test-host"):
    start = time.time(); time.sleep(2); end = time.time()
print(json.dumps([start, end]))
"""


def test_gpu_slot_lets_one_training_at_a_time(env):
    import json

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLD],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    spans = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
        spans.append(json.loads(out.strip().splitlines()[-1]))
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0, f"the two holders overlapped: {spans}"
    with client(env) as c:
        assert c.read_global_concurrency_limit_by_name("zhpipe-gpu-test-host").limit == 1


def test_serve_runs_the_schedule_without_a_worker(env, tmp_path):
    """`zhpipe serve`: the scheduled pipeline runs from the serving process, with the file's default
    parameters."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )

    doc = yaml.safe_load(
        write_pipelines(tmp_path / "p.yaml", NIGHTLY, None).read_text(encoding="utf-8")
    )
    served = doc["pipelines"].pop("tiny")
    served["parameters"] = {"stages": ["download", "clean", "split"]}
    (tmp_path / "p.yaml").write_text(
        yaml.safe_dump({"pipelines": {"served": served}}, allow_unicode=True), encoding="utf-8"
    )
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        zhpipe_argv("serve", "--config", str(tmp_path / "p.yaml")),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with client(env) as c:
            from prefect.exceptions import ObjectNotFound

            def deployment():
                try:
                    return c.read_deployment_by_name("zhpipe/served")
                except ObjectNotFound:
                    return None

            d = wait_for(deployment, 120, "zhpipe serve to register its deployment")
            assert d.work_pool_name is None and d.parameters["stages"] == [
                "download",
                "clean",
                "split",
            ]
            triggered = run_the_next_scheduled(c, d.id)
            done = FlowRunFilter(
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=["COMPLETED", "FAILED", "CRASHED"])
                )
            )
            runs = wait_for(
                lambda: c.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[d.id])),
                    flow_run_filter=done,
                ),
                600,
                "a served run to finish",
            )
            assert [r.id for r in runs] == [triggered]
            assert runs[0].state.type.value == "COMPLETED", (tmp_path / "serve.log").read_text()[
                -4000:
            ]
            assert runs[0].auto_scheduled
    finally:
        stop(proc)
        log.close()
    from flows.plan.config import load_pipeline
    from flows.plan.keys import plan_keys
    from flows.plan.store import StageStore

    keys = plan_keys(load_pipeline("served", tmp_path / "p.yaml"))
    store = StageStore(env["ZHPIPE_STORAGE"])
    assert all(store.is_done(s, keys[s]) for s in ("download", "clean", "split"))
