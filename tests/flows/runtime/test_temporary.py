"""The temporary Prefect server a run starts when it has no server to use
(`ZHPIPE_SERVER=temporary`): it starts with the command, prints no link to a UI it does not serve,
and nothing of it outlives the command, killed or not."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.plan.private import family
from tests.helpers.procs import stop, zhpipe

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e


@pytest.fixture
def env(tmp_path, seed_prefect_home, seed_mlflow):
    environ = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ZHPIPE_WARM")}
    environ.update(
        {
            "ZHPIPE_SERVER": "temporary",
            "ZHPIPE_WARM": "off",
            "PREFECT_HOME": str(tmp_path / "prefect"),
            "ZHPIPE_DATA": str(tmp_path / "store"),
            "MLFLOW_TRACKING_URI": seed_mlflow(tmp_path / "mlflow.db"),
        }
    )
    seed_prefect_home(tmp_path / "prefect")
    return environ


def a_server(pid: int) -> bool:
    """Whether `pid` runs Prefect's server app (a zombie's command line is empty)."""
    try:
        return b"prefect.server.api.server:create_app" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def servers(pid: int) -> set[int]:
    """The temporary servers below process `pid`."""
    return {p for p in family(pid) - {pid} if a_server(p)}


def test_a_run_starts_its_temporary_server_and_leaves_nothing(env, tmp_path):
    done = zhpipe(env, "run", "smoke", "--to", "split")
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-3000:]
    assert "a temporary Prefect server starts for this run" in printed
    assert (
        "View at" not in printed
    )  # Prefect's link to a UI: the temporary server serves none, and is gone at exit
    assert not list(
        (tmp_path / "prefect").glob("zhpipe-temporary-server-*.log")
    )  # a server that started well
    runs = zhpipe(env, "runs", "smoke")
    assert runs.returncode == 0 and re.search(r"│ [0-9a-f]{12} │ smoke ", runs.stdout), (
        runs.stdout + runs.stderr
    )


def test_the_temporary_server_dies_with_a_killed_run(env, tmp_path):
    run = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "smoke", "--to", "split"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not servers(run.pid):
            assert run.poll() is None and time.monotonic() < deadline, "no temporary server started"
            time.sleep(0.1)
        started = servers(run.pid)
        os.kill(
            run.pid, signal.SIGKILL
        )  # no exit hook runs: the kernel tells the server (PR_SET_PDEATHSIG)
        run.wait(10)
        deadline = time.monotonic() + 20
        while any(a_server(p) for p in started):
            assert time.monotonic() < deadline, (
                f"the temporary server {started} outlived its killed run"
            )
            time.sleep(0.2)
    finally:
        stop(run)
