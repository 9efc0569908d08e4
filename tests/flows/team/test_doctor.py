"""`zhpipe doctor` against a team's real services on loopback (tests/helpers/team.py: PostgreSQL
behind an `mlflow server` with MLflow's basic-auth app and behind a `prefect server` with an auth
string, the store in moto's S3 server). Every service is one line; each misconfiguration a team
meets is a FAIL line naming what to fix, and exit 1."""

from __future__ import annotations

import pytest

from tests.helpers.procs import free_port, zhpipe

pytestmark = pytest.mark.e2e


def lines(done) -> dict[str, str]:
    return {
        line.split()[1]: line
        for line in done.stdout.splitlines()
        if line.startswith(("ok ", "FAIL "))
    }


def test_doctor_checks_each_team_service_as_a_run_uses_it(team, alice):
    env, project = alice
    good = zhpipe(env, "doctor", cwd=project)
    assert good.returncode == 0, good.stdout + good.stderr
    checked = lines(good)
    assert set(checked) == {"config", "disk", "tracking", "prefect", "store"} and all(
        v.startswith("ok") for v in checked.values()
    )
    assert (
        "a run and an artifact written and deleted" in checked["tracking"]
        and "asks for credentials" in checked["prefect"]
    )
    assert "s3://team/zhpipe: writable" in checked["store"]


@pytest.mark.parametrize(
    "case",
    [
        "wrong password",
        "tracking down",
        "bucket missing",
        "prefect without credentials",
        "prefect without auth",
    ],
)
def test_doctor_finds_each_misconfiguration(team, alice, prefect_harness, case):
    env, project = alice
    env, argv = dict(env), ["doctor"]
    if case == "wrong password":
        env["MLFLOW_TRACKING_PASSWORD"] = "not-alices-password"
        service, says = "tracking", "refused this machine as user 'alice' (HTTP 401)"
    elif case == "tracking down":
        env["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{free_port()}"
        service, says = "tracking", "does not answer"
    elif case == "bucket missing":
        argv += ["--storage", "s3://no-such-bucket/zhpipe"]
        service, says = (
            "store",
            "s3://no-such-bucket/zhpipe: cannot write, read and delete a file there",
        )
    elif case == "prefect without credentials":
        env.pop("PREFECT_API_AUTH_STRING")
        service, says = "prefect", "set PREFECT_API_AUTH_STRING"
    # a Prefect server that asks nobody for credentials (the test session's own), in a team's set-up
    else:
        env["PREFECT_API_URL"] = prefect_harness["url"]
        service, says = "prefect", "answers anyone without credentials"
    done = zhpipe(env, *argv, cwd=project)
    failed = {name: line for name, line in lines(done).items() if line.startswith("FAIL")}
    assert done.returncode == 1 and list(failed) == [service] and says in failed[service], (
        done.stdout + done.stderr
    )


def test_a_run_with_the_tracking_server_down_stops_before_it_builds(team, alice):
    env, project = alice
    run = zhpipe(
        {**env, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"},
        "run",
        "smoke",
        "--to",
        "download",
        cwd=project,
    )
    assert (
        run.returncode == 2
        and "the tracking server" in run.stderr
        and "nothing was built" in run.stderr
    ), run
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_credentials_never_reach_params_tags_artifacts_or_logs(team, alice, tmp_path):
    """An engineer's credentials for the team's servers (MLflow's basic-auth password, Prefect's
    auth string) travel in the environment: a run records none of them in its params, tags or
    artifacts, its Prefect logs (in the server's database), the servers' own logs, or what it
    prints."""
    import os

    from mlflow.tracking import MlflowClient

    env, project = alice
    done = zhpipe(env, "run", "smoke", "--to", "split", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        f"see it at {team.tracking}/#/experiments/" in done.stdout
        and "zhpipe ui" not in done.stdout + done.stderr
    )
    secrets = {
        "MLFLOW_TRACKING_PASSWORD": env["MLFLOW_TRACKING_PASSWORD"],
        "PREFECT_API_AUTH_STRING": team.auth_string,
        "database password": team.pg_password,
    }
    recorded = [
        done.stdout,
        done.stderr,
        (team.folder / "mlflow.log").read_text(),
        (team.folder / "prefect.log").read_text(),
    ]
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    os.environ.update(
        {
            "MLFLOW_TRACKING_USERNAME": "alice",
            "MLFLOW_TRACKING_PASSWORD": env["MLFLOW_TRACKING_PASSWORD"],
        }
    )
    try:
        client = MlflowClient(team.tracking)
        experiment = client.get_experiment_by_name("zhpipe-smoke")
        for run in client.search_runs([experiment.experiment_id]):
            recorded += [str(run.data.params), str(run.data.tags)]
            folder = tmp_path / run.info.run_id
            folder.mkdir()
            for artifact in client.list_artifacts(run.info.run_id):
                path = client.download_artifacts(run.info.run_id, artifact.path, str(folder))
                files = [p for p in (folder.rglob("*")) if p.is_file()] if path else []
                recorded += [p.read_bytes().decode("utf-8", errors="replace") for p in files]
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    recorded += prefect_logs(team)
    assert len(recorded) > 8
    for name, value in secrets.items():
        assert not any(value in text or value.split(":")[-1] in text for text in recorded), name


def prefect_logs(team) -> list[str]:
    """Every log line the Prefect server holds (its database), read through its API with the team's
    credentials."""
    import httpx

    user, password = team.auth_string.split(":", 1)
    answer = httpx.post(
        f"{team.prefect_api}/logs/filter", json={"limit": 200}, auth=(user, password), timeout=30
    )
    answer.raise_for_status()
    assert answer.json(), "the run left no log lines in the Prefect server"
    return [row["message"] for row in answer.json()]
