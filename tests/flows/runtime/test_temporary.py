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
from tests.helpers.procs import start, stop, zhpipe

ROOT = Path(__file__).resolve().parents[3]


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


@pytest.mark.e2e
def test_a_run_starts_its_temporary_server_and_leaves_nothing(env, tmp_path):
    done = zhpipe(env, "run", "smoke", "--to", "split")
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-3000:]
    assert "a temporary Prefect server starts for this run" in printed
    # Prefect's link to a UI: the temporary server serves none, and is gone at exit
    assert "View at" not in printed
    # a server that started well
    assert not list((tmp_path / "prefect").glob("zhpipe-temporary-server-*.log"))
    runs = zhpipe(env, "runs", "smoke")
    # the run's row; a narrow table shows no status column
    row = re.search(r"^│ [0-9a-f]{12} │ (FINISHED │ )?smoke ", runs.stdout, re.M)
    assert runs.returncode == 0 and row, runs.stdout + runs.stderr


@pytest.mark.e2e
def test_the_temporary_server_dies_with_a_killed_run(env, tmp_path):
    log = tmp_path / "run.log"
    run = start(env, ROOT, "run", "smoke", "--to", "split", log=log)
    try:
        deadline = time.monotonic() + 120
        while not servers(run.pid):
            alive = run.poll() is None and time.monotonic() < deadline
            assert alive, "no temporary server started: " + log.read_text()[-2000:]
            time.sleep(0.1)
        started = servers(run.pid)
        # no exit hook runs: the kernel tells the server (PR_SET_PDEATHSIG)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        deadline = time.monotonic() + 20
        while any(a_server(p) for p in started):
            assert time.monotonic() < deadline, f"the server {started} outlived its killed run"
            time.sleep(0.2)
    finally:
        stop(run)


def waited(tmp_path, program: str, timeout: float = 30) -> Exception | None:
    """The error of waiting for a "server" that runs `program` (Python) on a free port."""
    from flows.runtime.temporary import Temporary
    from tests.helpers.procs import free_port

    log = tmp_path / "server.log"
    with open(log, "w") as out:
        argv = [sys.executable, "-c", program]
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    server = Temporary(proc, free_port(), log)
    try:
        server.wait(timeout)
    finally:
        server.stop()
    return server.error


def test_a_server_that_exits_is_one_error_with_its_last_line(tmp_path):
    error = waited(tmp_path, "print('address already in use'); raise SystemExit(3)")
    assert "exited with code 3 (address already in use)" in str(error), error


def test_a_server_that_never_answers_is_one_error_after_the_timeout(tmp_path):
    error = waited(tmp_path, "import time; time.sleep(60)", timeout=1)
    assert "did not answer" in str(error) and "within 1 s" in str(error), error


def test_a_port_another_process_listens_on_gets_no_request(tmp_path):
    """Another process (here the test's) listens on the port first: nothing is sent there."""
    import socket

    from flows.plan.private import PortTaken
    from flows.runtime.temporary import Temporary

    log = tmp_path / "server.log"
    log.write_text("")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        other.settimeout(0.5)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        server = Temporary(proc, other.getsockname()[1], log)
        try:
            server.wait(10)
            with pytest.raises(socket.timeout):
                other.accept()  # no connection was made to it
        finally:
            server.stop()
    assert isinstance(server.error, PortTaken) and "nothing was sent there" in str(server.error)


def test_a_new_home_starts_from_the_database_the_first_new_home_made(tmp_path, monkeypatch):
    """The first server in a new Prefect home migrates its database; once it answers, that database
    (without Prefect's telemetry session) goes into the user's cache, and the next new home starts
    from a copy (flows/runtime/homes.py). A home with a database of its own is left alone."""
    import sqlite3

    from flows.runtime import homes
    from flows.runtime.temporary import Temporary, command, environment
    from tests.helpers.procs import free_port

    monkeypatch.setenv("ZHPIPE_USER_CACHE", str(tmp_path / "cache"))

    def serve(home: Path) -> None:
        made = homes.prepare(home)
        port, log = free_port(), tmp_path / f"{home.name}.log"
        with open(log, "w") as out:
            env = environment({**os.environ, "PREFECT_HOME": str(home)})
            proc = subprocess.Popen(command(port), env=env, stdout=out, stderr=subprocess.STDOUT)
        server = Temporary(proc, port, log, new_home=home if made else None)
        try:
            server.wait(180)
        finally:
            server.stop()
        assert server.error is None, log.read_text()[-2000:]

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    serve(first)
    (cached,) = (tmp_path / "cache").glob("prefect-*.db")
    assert cached.stat().st_mode & 0o777 == 0o600
    con = sqlite3.connect(cached)
    assert con.execute(
        "SELECT count(*) FROM configuration WHERE key = 'TELEMETRY_SESSION'"
    ).fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM block_type").fetchone()[0] > 10
    con.close()

    assert homes.seed(second) and (second / homes.DATABASE).read_bytes() == cached.read_bytes()
    assert (second / homes.DATABASE).stat().st_mode & 0o777 == 0o600
    serve(second)  # Prefect accepts the copy as its own
    assert not homes.seed(second)  # a home with a database is never overwritten
