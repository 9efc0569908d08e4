"""MLflow as its users see it, read through MLflow's REST API on loopback (as the UI reads it): the
experiment's kind, the parent run's source tags and dataset inputs, system metrics of a training,
run names; and a store that does not grow: two all-cached runs in a row add no artifact bytes."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flows.orchestrate.pipeline import pipeline_flow
from flows.track.tracker import tracking_uri
from tests.helpers.procs import zhpipe_argv
from tests.helpers.runs import without_profile

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[3]
SETS = ["train.models=[tfidf_lr, textcnn]", "split.seed=3"]
# what the UI shows of a training run; the profile's pictures are test_pipeline's
STAGES = without_profile()


def owner() -> tuple[str, str]:
    """The project's credentials, which `zhpipe ui` asks every request for (`zhpipe server status`
    prints them)."""
    from flows.plan.private import credentials

    user, password = credentials().split(":", 1)
    return user, password


def artifact_bytes() -> int:
    root = Path(tracking_uri().removeprefix("sqlite:///")).parent / "artifacts"
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def runs(prefect_harness, tmp_path_factory):
    store = tmp_path_factory.mktemp("tracking-store")
    first = pipeline_flow("smoke", overrides=SETS, storage=str(store), stages=STAGES)
    after_first = artifact_bytes()
    cached = [
        pipeline_flow("smoke", overrides=SETS, storage=str(store), stages=STAGES) for _ in range(2)
    ]
    return {"first": first, "cached": cached, "bytes": (after_first, artifact_bytes())}


@pytest.fixture(scope="module")
def ui(runs, tmp_path_factory):
    """`zhpipe ui` on a free loopback port over the tests' tracking store: MLflow's server as users
    start it, read through its REST API as the UI reads it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path_factory.mktemp("mlflow-ui") / "ui.log"
    with open(out, "w") as log:
        proc = subprocess.Popen(
            zhpipe_argv("ui", "--port", str(port)),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while (
            "/zhpipe/open?to=" not in out.read_text()
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        [opener] = [w for w in out.read_text().split() if "/zhpipe/open?to=" in w] or [
            out.read_text()[-2000:]
        ]
        yield {"port": port, "opener": opener, "rest": f"http://127.0.0.1:{port}/api/2.0/mlflow"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


@pytest.fixture(scope="module")
def rest(ui):
    return ui["rest"]


def test_two_all_cached_runs_add_no_artifacts(runs):
    for out in runs["cached"]:
        assert {s["cache"] for s in out["stages"]} == {"hit"} and {
            u["cache"] for u in out["units"]
        } == {"hit"}
    before, after = runs["bytes"]
    assert before > 0 and after == before


def _run(rest, run_id):
    return httpx.get(
        f"{rest}/runs/get", params={"run_id": run_id}, auth=owner(), timeout=30
    ).json()["run"]


def test_the_ui_sees_a_training_experiment_with_sources_datasets_and_system_metrics(runs, rest):
    experiment = httpx.get(
        f"{rest}/experiments/get-by-name",
        params={"experiment_name": "zhpipe-smoke"},
        auth=owner(),
        timeout=30,
    ).json()["experiment"]
    assert {"key": "mlflow.experimentKind", "value": "custom_model_development"} in experiment[
        "tags"
    ]
    parent = _run(rest, runs["first"]["parent_run_id"])
    tags = {t["key"]: t["value"] for t in parent["data"]["tags"]}
    assert (
        tags["mlflow.source.name"].startswith("zhpipe")
        and tags["mlflow.user"]
        and tags["mlflow.source.type"] == "LOCAL"
    )
    assert tags["mlflow.runName"].startswith("smoke train.models=[tfidf_lr,textcnn] split.seed=3 ")
    if tags["zhpipe.git_commit"] != "unknown":
        assert tags["mlflow.source.git.commit"] == tags["zhpipe.git_commit"]
    contexts = {
        d["dataset"]["name"]: [t["value"] for t in d["tags"] if t["key"] == "mlflow.data.context"]
        for d in parent["inputs"]["dataset_inputs"]
    }
    assert contexts == {
        "smoke-train": ["training"],
        "smoke-validation": ["validation"],
        "smoke-test": ["testing"],
    }
    textcnn = next(u for u in runs["first"]["units"] if u["stage"] == "train.textcnn")
    metrics = {m["key"] for m in _run(rest, textcnn["run_id"])["data"]["metrics"]}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= metrics
    assert {"test_accuracy", "val_macro_f1_best", "train_loss"} <= metrics


def test_an_all_cached_run_links_to_the_runs_that_built_its_outputs(runs, rest):
    """What the UI shows for a run that built nothing: its parent run, whose note and tags lead to
    the model run (and its logged model) of the run that trained it."""
    cached = _run(rest, runs["cached"][-1]["parent_run_id"])
    tags = {t["key"]: t["value"] for t in cached["data"]["tags"]}
    source = next(u for u in runs["first"]["units"] if u["stage"] == "train.textcnn")["run_id"]
    assert tags["zhpipe.reused"] == "all" and tags["zhpipe.reused.train.textcnn"] == source
    assert f"train.textcnn [{source[:8]}](#/experiments/" in tags["mlflow.note.content"]
    built = {t["key"]: t["value"] for t in _run(rest, source)["data"]["tags"]}
    assert built["zhpipe.model_uri"].startswith("models:/")


def test_runs_left_running_by_a_killed_process_are_marked_killed(tmp_path):
    """A run whose process was SIGKILLed stays RUNNING in MLflow; the next run of the pipeline
    closes it."""
    import os
    import signal
    import subprocess

    from flows.track.tracker import Tracker, client

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys; sys.path.insert(0, %r)\n"
                "from flows.track.tracker import Tracker\n"
                "r = Tracker.start('zhpipe-orphans', 'killed run')\n"
                "print(r.run_id, flush=True)\n"
                "import time; time.sleep(60)\n"
            )
            % str(Path(__file__).resolve().parents[3]),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ,
    )
    run_id = child.stdout.readline().strip()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert client().get_run(run_id).info.status == "RUNNING"
    # this process's own running run is left alone
    mine = Tracker.start("zhpipe-orphans", "alive run")
    assert Tracker.close_orphans("zhpipe-orphans") == [run_id]
    assert (
        client().get_run(run_id).info.status == "KILLED"
        and client().get_run(mine.run_id).info.status == "RUNNING"
    )
    mine.finish()


def test_mlflow_links_open_the_machine_learning_view(monkeypatch):
    """MLflow 3 opens in its GenAI view unless told otherwise: every link zhpipe prints selects the
    runs view."""
    from flows.track.tracker import ML_VIEW, home_url, ui_url

    monkeypatch.setenv("ZHPIPE_MLFLOW_UI", "http://127.0.0.1:5000")
    assert ML_VIEW == "workflowType=machine_learning"
    assert ui_url("zhpipe-links", "abc").endswith("/runs/abc?workflowType=machine_learning")
    home = home_url("http://127.0.0.1:5000")
    assert home.startswith("http://127.0.0.1:5000/#/experiments") and home.endswith(
        "?workflowType=machine_learning"
    )


def test_zhpipe_ui_opens_mlflow_in_its_runs_view_through_its_own_page(ui):
    """`zhpipe ui` serves MLflow with one page of its own that sets the browser's view to model
    training (MLflow 3 keeps that toggle in localStorage and starts in GenAI), then opens the newest
    experiment; MLflow is served as before, and the page opens nothing but a route of the UI."""
    port = ui["port"]
    page = httpx.get(ui["opener"], auth=owner(), timeout=30).text
    assert 'localStorage.setItem("mlflow.workflowType_v1", "\\"machine_learning\\"")' in page
    assert (
        'location.replace("/" + "#/experiments' in page and "workflowType=machine_learning" in page
    )
    hostile = httpx.get(
        f"http://127.0.0.1:{port}/zhpipe/open",
        params={"to": '#/x"</script><script>alert(1)//'},
        auth=owner(),
        timeout=30,
    ).text
    assert "alert" not in hostile and 'location.replace("/" + "#/experiments")' in hostile
    # MLflow itself, as before
    assert httpx.get(f"http://127.0.0.1:{port}/health", auth=owner(), timeout=30).status_code == 200
    assert (
        httpx.get(
            f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/search",
            params={"max_results": 5},
            auth=owner(),
            timeout=30,
        ).status_code
        == 200
    )


def test_zhpipe_ui_answers_only_its_owner_and_only_reads(ui, runs):
    """The review's attack: another local user, with no credentials, wrote an experiment, a run, a
    model version and the `champion` alias through the UI's REST API, and the owner's next `zhpipe
    predict` ran their code. Now every request needs the project's credentials, and even the owner's
    writes are refused: the UI only reads."""
    base = f"http://127.0.0.1:{ui['port']}"
    api = f"{base}/api/2.0/mlflow"
    for auth in (None, ("zhpipe", "guess"), ("nobody", owner()[1])):
        refused = httpx.get(f"{base}/health", auth=auth, timeout=30)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith(
            "Basic"
        )
        assert (
            httpx.post(
                f"{api}/experiments/create", json={"name": "evil"}, auth=auth, timeout=30
            ).status_code
            == 401
        )
    writes = [
        ("POST", f"{api}/experiments/create", {"name": "evil", "artifact_location": "/tmp/evil"}),
        ("POST", f"{api}/runs/create", {"experiment_id": "0"}),
        ("POST", f"{api}/registered-models/create", {"name": "evil"}),
        (
            "POST",
            f"{api}/model-versions/create",
            {"name": "zhpipe-smoke", "source": "/tmp/evil/model"},
        ),
        (
            "POST",
            f"{api}/registered-models/alias",
            {"name": "zhpipe-smoke", "alias": "champion", "version": "1"},
        ),
        ("DELETE", f"{api}/registered-models/alias", {"name": "zhpipe-smoke", "alias": "champion"}),
        ("POST", f"{api}/runs/delete", {"run_id": runs["first"]["parent_run_id"]}),
        ("PUT", f"{base}/api/2.0/mlflow-artifacts/artifacts/evil/pyfunc_model.py", None),
        (
            "POST",
            f"{base}/graphql",
            {"query": 'mutation { testMutation(input: {inputString: "x"}) { output } }'},
        ),
        # what passed the old deny-list: a write whose name holds "get", a mutation spelt with a
        # JSON escape
        ("POST", f"{base}/api/3.0/mlflow/review-queues/get-or-create-user", {"name": "evil"}),
        ("POST", f"{base}/ajax-api/3.0/mlflow/review-queues/get-or-create-user", {"name": "evil"}),
        ("POST", f"{base}/graphql", None),
        # a mutation sent as a GET with a body (MLflow's GraphQL route takes GET too): refused for
        # its body
        (
            "GET",
            f"{base}/graphql",
            {"query": 'mutation { testMutation(input: {inputString: "x"}) { output } }'},
        ),
    ]
    escaped = (
        b'{"query": "\\u006dutation { testMutation(input: {inputString: \\"x\\"}) { output } }"}'
    )
    for method, url, body in writes:
        answer = (
            httpx.request(method, url, json=body, auth=owner(), timeout=30)
            if body is not None or method != "POST"
            else httpx.post(
                url,
                content=escaped,
                auth=owner(),
                timeout=30,
                headers={"content-type": "application/json"},
            )
        )
        assert answer.status_code == 403 and "read-only" in answer.text, (
            method,
            url,
            answer.status_code,
            answer.text[:200],
        )
    # a body over the limit is refused before it is read: a 300 MB upload never reaches MLflow
    big = httpx.post(
        f"{base}/ajax-api/2.0/mlflow/runs/search",
        content=b"x" * (2 << 20),
        auth=owner(),
        timeout=30,
    )
    assert big.status_code == 413
    # a websocket, with or without credentials, is refused before MLflow sees it
    for auth in (None, owner()):
        handshake = httpx.get(
            f"{base}/ws",
            auth=auth,
            timeout=30,
            headers={
                "connection": "Upgrade",
                "upgrade": "websocket",
                "sec-websocket-version": "13",
                "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
            },
        )
        assert handshake.status_code in (401, 403) and handshake.status_code != 101
    queries = httpx.post(
        f"{base}/graphql", json={"query": "query { __typename }"}, auth=owner(), timeout=30
    )
    assert queries.status_code == 200, queries.text[:300]
    reads = httpx.post(
        f"{base}/ajax-api/2.0/mlflow/runs/search",
        json={"experiment_ids": ["0"], "max_results": 1},
        auth=owner(),
        timeout=30,
    )
    assert reads.status_code == 200
    from flows.track.tracker import client

    assert (
        client().get_experiment_by_name("evil") is None
        and client().get_run(runs["first"]["parent_run_id"]).info.lifecycle_stage == "active"
    )


def test_console_lines_of_prefect_name_their_task():
    import logging

    from flows.cli import _ConsoleFormatter

    record = logging.LogRecord(
        "prefect.task_runs", logging.INFO, __file__, 1, "Finished in state Completed()", None, None
    )
    record.task_name = "segment"
    assert (
        _ConsoleFormatter("%(name)s %(message)s").format(record)
        == "prefect.task_runs [segment] Finished in state Completed()"
    )


def test_a_new_tracking_store_over_a_built_stage_store_records_and_registers(
    runs, tmp_path, monkeypatch
):
    """MLflow's database moved aside (what the corrupt-database error advises): the next run reuses
    every output, records its runs in the new database the long way (the runs that built them are in
    the old one) and registers its best model there."""
    from flows.track.tracker import client

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'new.db'}")
    store = str(runs["first"]["stages"][0]["path"]).split("/download/")[0]
    out = pipeline_flow("smoke", overrides=SETS, storage=store, stages=STAGES)
    assert {s["cache"] for s in out["stages"]} == {"hit"}
    parent = client().get_run(out["parent_run_id"])
    assert (
        parent.data.tags["zhpipe.champion"] == "yes"
        and parent.data.tags["zhpipe.registered"] == "zhpipe-smoke/1"
    )
    # the builders are elsewhere: not named as if they were here
    assert "zhpipe.reused" not in parent.data.tags


def test_the_ui_answers_the_gateway_endpoints_its_pages_ask_for_without_forwarding(ui):
    """Every MLflow page asks for the AI gateway's endpoints: refused, it showed a PERMISSION_DENIED
    box on each page. zhpipe ui answers as MLflow does with no gateway (none), itself, and only its
    owner."""
    url = f"http://127.0.0.1:{ui['port']}/ajax-api/2.0/mlflow/gateway-proxy"
    got = httpx.get(url, params={"gateway_path": "api/2.0/endpoints/"}, auth=owner(), timeout=30)
    assert got.status_code == 200 and got.json() == {"endpoints": []}
    assert httpx.get(url, timeout=30).status_code == 401
    assert (
        httpx.post(
            url, json={"gateway_path": "api/2.0/endpoints/"}, auth=owner(), timeout=30
        ).status_code
        == 403
    )
