"""`zhpipe doctor` against real services on loopback, as a team sets them up: an `mlflow server` whose artifacts it
proxies into an object store (moto's S3 server), the session's Prefect server, the stage store on that object store.
Every service is one line; one that is down or misnamed is a FAIL line naming what to fix, and exit 1."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.cli import in_process
from tests.helpers.procs import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def team(tmp_path_factory, prefect_harness):
    """moto's S3 server with a bucket, and an MLflow tracking server (SQLite here; PostgreSQL in docs/team.md) that
    proxies artifacts into it: clients need no bucket credentials for tracking."""
    from moto.server import ThreadedMotoServer

    s3_port, mlflow_port = free_port(), free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    moto.start()
    aws = {"AWS_ACCESS_KEY_ID": "zhpipe-test", "AWS_SECRET_ACCESS_KEY": "zhpipe-test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}", "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
           "MLFLOW_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}"}
    import boto3

    boto3.client("s3", endpoint_url=aws["AWS_ENDPOINT_URL"], aws_access_key_id="zhpipe-test", aws_secret_access_key="zhpipe-test",
                 region_name="us-east-1").create_bucket(Bucket="team")
    folder = tmp_path_factory.mktemp("team")
    log = open(folder / "mlflow.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                               "--artifacts-destination", "s3://team/artifacts", "--host", "127.0.0.1", "--port", str(mlflow_port),
                               "--workers", "1"], env={**os.environ, **aws, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{mlflow_port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    yield {"aws": aws, "tracking": url, "log": folder / "mlflow.log"}
    os.killpg(server.pid, 15)
    server.wait(30)
    moto.stop()


def test_doctor_checks_each_team_service_as_a_run_uses_it(team, monkeypatch, capsys):
    for key, value in team["aws"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", team["tracking"])
    good = in_process(capsys, "doctor", "--storage", "s3://team/store")
    lines = {line.split()[1]: line for line in good.stdout.splitlines() if line.startswith(("ok", "FAIL"))}
    assert good.returncode == 0, good.stdout + team["log"].read_text()[-2000:]
    assert set(lines) == {"config", "disk", "tracking", "prefect", "store"} and all(line.startswith("ok") for line in lines.values())
    assert "a run and an artifact written and deleted" in lines["tracking"] and "s3://team/store: writable" in lines["store"]

    bad = in_process(capsys, "doctor", "--storage", "s3://no-such-bucket/store")
    failed = [line for line in bad.stdout.splitlines() if line.startswith("FAIL")]
    assert bad.returncode == 1 and len(failed) == 1 and "no-such-bucket" in failed[0], bad.stdout

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    down = in_process(capsys, "doctor")
    assert down.returncode == 1 and any(line.startswith("FAIL  tracking") and "does not answer" in line for line in down.stdout.splitlines())
    run = in_process(capsys, "run", "smoke", "--to", "download")  # a run with the tracking server down stops before it builds
    assert run.returncode == 2 and "the tracking server" in run.stderr and "nothing was built" in run.stderr and len(run.stderr.strip().splitlines()) == 1, run


def test_credentials_never_reach_params_tags_artifacts_or_logs(team, tmp_path):
    """An engineer's credentials for the team's servers (MLflow's basic-auth user and password, Prefect's auth string)
    travel in the environment: a run on the team's tracking server records none of them in its params, tags or
    artifacts, and prints none of them."""
    from mlflow.tracking import MlflowClient

    secrets = {"MLFLOW_TRACKING_USERNAME": "alice-user-7f3a", "MLFLOW_TRACKING_PASSWORD": "pw-9c1e-not-for-logs",
               "PREFECT_API_AUTH_STRING": "team:auth-5b2d-not-for-logs"}
    env = {**os.environ, **team["aws"], **secrets, "MLFLOW_TRACKING_URI": team["tracking"], "ZHPIPE_WARM": "off",
           "ZHPIPE_STORAGE": "s3://team/secrets-store"}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", "smoke", "--to", "split"], env=env, capture_output=True, text=True,
                          timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"see it at {team['tracking']}/#/experiments/" in done.stdout  # the team's UI, not `zhpipe ui`
    client = MlflowClient(team["tracking"])
    experiment = client.get_experiment_by_name("zhpipe-smoke")
    recorded = [done.stdout, done.stderr]
    for run in client.search_runs([experiment.experiment_id]):
        recorded += [str(run.data.params), str(run.data.tags)]
        folder = tmp_path / run.info.run_id
        folder.mkdir()
        for artifact in client.list_artifacts(run.info.run_id):
            path = Path(client.download_artifacts(run.info.run_id, artifact.path, str(folder)))
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            recorded += [p.read_bytes().decode("utf-8", errors="replace") for p in files]
    assert len(recorded) > 4
    for name, value in secrets.items():
        assert not any(value in text or value.split(":")[-1] in text for text in recorded), name
