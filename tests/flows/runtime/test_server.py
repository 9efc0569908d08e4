"""`zhpipe server start|status|stop`: a Prefect server in the background that later commands reuse
instead of starting a temporary one each."""

import os
from pathlib import Path

import httpx
import pytest

from tests.helpers.procs import zhpipe

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e


def auth_of(prefect_home: Path) -> tuple[str, str]:
    """The project's server credentials, as `zhpipe server status` shows them (user, password)."""
    import json

    path = prefect_home / "zhpipe-server-auth"
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner only
    return tuple(json.loads(path.read_text())["auth_string"].split(":", 1))


def test_background_server_is_started_reused_and_stopped(
    tmp_path, monkeypatch, seed_prefect_home, seed_mlflow
):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        {
            "PREFECT_HOME": str(seed_prefect_home(tmp_path / "prefect")),
            "ZHPIPE_DATA": str(tmp_path / "store"),
            "MLFLOW_TRACKING_URI": seed_mlflow(tmp_path / "mlflow.db"),
        }
    )
    assert "not running" in zhpipe(env, "server", "status").stdout
    started = zhpipe(env, "server", "start")
    assert started.returncode == 0, started.stderr[-2000:]
    url = started.stdout.split("running at ")[1].split()[0]
    try:
        assert url.startswith("http://127.0.0.1:") and url in zhpipe(env, "server", "status").stdout
        assert "already running" in zhpipe(env, "server", "start").stdout  # one server per project
        run = zhpipe(env, "run", "smoke", "--to", "download")
        assert run.returncode == 0, run.stderr[-2000:]
        assert "temporary server" not in run.stdout + run.stderr  # it used the background server
        auth = auth_of(tmp_path / "prefect")
        # for the UI's login
        assert f"{auth[0]}:{auth[1]}" in zhpipe(env, "server", "status").stdout
        # nobody else gets in
        assert httpx.post(f"{url}/flow_runs/filter", json={}, timeout=10).status_code == 401
        assert (
            httpx.post(
                f"{url}/variables/", json={"name": "planted", "value": "x"}, timeout=10
            ).status_code
            == 401
        )
        assert (
            httpx.post(
                f"{url}/flow_runs/filter", json={}, auth=("zhpipe", "guess"), timeout=10
            ).status_code
            == 401
        )
        runs = httpx.post(f"{url}/flow_runs/filter", json={}, auth=auth, timeout=10).json()
        assert [r["state_type"] for r in runs if r["flow_id"]] and all(
            r["state_type"] == "COMPLETED" for r in runs
        )
        # found by the pipeline's tag and named after it; its UI is told this server's own API
        tagged = httpx.post(
            f"{url}/flow_runs/filter",
            json={"flow_runs": {"tags": {"all_": ["pipeline:smoke"]}}},
            auth=auth,
            timeout=10,
        ).json()
        assert (
            len(tagged) == 1
            and tagged[0]["name"].startswith("smoke ")
            and "task:classification" in tagged[0]["tags"]
        )
        settings = httpx.get(url.removesuffix("/api") + "/ui-settings", timeout=10).json()
        assert settings["api_url"] == url
        from flows.runtime.server import project_port

        monkeypatch.setenv("PREFECT_HOME", env["PREFECT_HOME"])
        assert url == f"http://127.0.0.1:{project_port()}/api"  # the project's own, stable port
    finally:
        stopped = zhpipe(env, "server", "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert "not running" in zhpipe(env, "server", "status").stdout
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=2)


def test_the_first_run_leaves_a_server_that_later_runs_reuse_and_that_stops_when_idle(
    tmp_path, seed_prefect_home, seed_mlflow
):
    """The idle clock is the test's to hold: the test is one of the server's users (as every zhpipe
    command is) until it lets go, so a slow machine cannot stop the server between the two runs. The
    warm process's clock is its own (the same timeout, no users): 8 s leave the second command time
    to reach it on a busy machine (with 2 s, two busy-loop hogs made it stop before the second
    command's hand-over)."""
    import json
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ZHPIPE_SERVER")}
    env.update(
        {
            "PREFECT_HOME": str(seed_prefect_home(tmp_path / "prefect")),
            "ZHPIPE_DATA": str(tmp_path / "store"),
            "ZHPIPE_SERVER_IDLE": "8",
            "MLFLOW_TRACKING_URI": seed_mlflow(tmp_path / "mlflow.db"),
        }
    )
    state_file = tmp_path / "prefect" / "zhpipe-server.json"
    holder = tmp_path / "prefect" / "zhpipe-server-users" / str(os.getpid())
    holder.parent.mkdir(parents=True)
    holder.touch()
    try:
        first = zhpipe(env, "run", "smoke", "--to", "download")
        assert first.returncode == 0, first.stderr[-2000:]
        assert (
            "starting this project's Prefect server in the background" in first.stdout
            and "temporary" not in first.stdout
        )
        state = json.loads(state_file.read_text())
        assert (
            state["idle_s"] == 8
            and httpx.get(f"{state['url']}/health", timeout=5).status_code == 200
        )
        # and a warm process for the next commands (flows.runtime.warm)
        deadline = time.monotonic() + 120
        while (
            not list((tmp_path / "prefect").glob("zhpipe-warm-*.json"))
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        [warm_state] = (tmp_path / "prefect").glob("zhpipe-warm-*.json")
        second = zhpipe(env, "run", "smoke", "--to", "download")
        assert second.returncode == 0 and "starting" not in second.stdout  # it found the server
        # its summary table reached this process's stdout
        assert "download" in second.stdout and "hit" in second.stdout
        assert json.loads(state_file.read_text())["pid"] == state["pid"]
        assert (
            "warm: running `zhpipe run smoke --to download`"
            in (tmp_path / "prefect" / "zhpipe-warm.log").read_text()
        )
        # the last user is gone: 8 s later (checked every half second) the server stops, and the
        # warm process with it
        holder.unlink()
        deadline = time.monotonic() + 180
        while (state_file.exists() or warm_state.exists()) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert not state_file.exists() and not warm_state.exists()
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{state['url']}/health", timeout=2)
    finally:
        holder.unlink(missing_ok=True)
        zhpipe(env, "server", "stop")
