"""The warm zhpipe process (flows.runtime.warm, flows.runtime.handover): commands handed to it run
as they would alone (same output, exit status, errors), clients with other settings or after a code
change run by themselves, and it stops.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.runtime import handover, warm
from tests.helpers.procs import zhpipe, zhpipe_argv

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e  # real zhpipe processes and servers: `make test-quick` leaves them out


def handed(log: Path) -> int:
    return log.read_text().count("warm: running `zhpipe ") if log.exists() else 0


def _warm(folder: Path, seed_prefect_home, seed_mlflow, idle: int = 60, ready: bool = True):
    """A warm process for a new project's settings in `folder`; its runs start temporary Prefect
    servers in a seeded home. Yielded once it listens, or (`ready=False`) once it has said it is
    starting."""
    probe = folder / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(
        "# imported at start-up: a module file the warm process watches\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ZHPIPE_WARM")}
    env.update(
        {
            "PREFECT_HOME": str(folder / "prefect"),
            "ZHPIPE_DATA": str(folder / "store"),
            "MLFLOW_TRACKING_URI": seed_mlflow(folder / "mlflow.db"),
            "MLFLOW_LOGGING_LEVEL": "WARNING",
            "PYTHONPATH": os.pathsep.join([str(probe), str(ROOT)]),
        }
    )
    seed_prefect_home(folder / "prefect")
    log = folder / "prefect" / "zhpipe-warm.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flows.cli.warm",
                "--idle",
                str(idle),
                "--fingerprint",
                handover.fingerprint(env),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    state = handover.state_file(handover.fingerprint(env)).relative_to(handover.home())
    state = folder / "prefect" / state
    deadline = time.monotonic() + 120

    def listening() -> bool:
        return state.exists() and (not ready or "socket" in json.loads(state.read_text() or "{}"))

    while not listening() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert listening(), log.read_text()
    yield {
        "env": env,
        "log": log,
        "state": state,
        "proc": proc,
        "probe": probe / "sitecustomize.py",
    }
    proc.terminate()
    proc.wait(30)
    if (
        state.exists()
        # a warm process the test killed (kill -9) left its state file, and its socket in the shared
        # folder
    ):
        Path(json.loads(state.read_text()).get("socket", "")).unlink(missing_ok=True)


@pytest.fixture
def warm_env(tmp_path, seed_prefect_home, seed_mlflow):
    """A warm process of the test's own: for tests that stop, replace or kill it."""
    yield from _warm(tmp_path, seed_prefect_home, seed_mlflow)


@pytest.fixture(scope="module")
def shared_warm(tmp_path_factory, seed_prefect_home, seed_mlflow):
    """One warm process for the tests that leave it running (each counts only the commands it hands
    over)."""
    yield from _warm(
        tmp_path_factory.mktemp("shared-warm"), seed_prefect_home, seed_mlflow, idle=600
    )


def test_a_command_handed_over_prints_and_exits_as_it_would_alone(shared_warm):
    env, log = shared_warm["env"], shared_warm["log"]
    before = handed(log)
    served = zhpipe(env, "status", "smoke")
    assert served.returncode == 0, served.stderr[-2000:]
    assert handed(log) == before + 1
    alone = zhpipe({**env, "ZHPIPE_WARM": "off"}, "status", "smoke")
    assert handed(log) == before + 1  # ZHPIPE_WARM=off: run here
    assert (
        served.stdout == alone.stdout
        and "zhpipe status smoke" in served.stdout
        and "missing" in served.stdout
    )
    # an error line and its exit status come back as they are
    bad = zhpipe(env, "status", "no-such-pipeline")
    assert handed(log) == before + 2
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("zhpipe: error:")
        and "no-such-pipeline" in bad.stderr
    )
    assert bad.stderr == zhpipe({**env, "ZHPIPE_WARM": "off"}, "status", "no-such-pipeline").stderr


def test_a_command_waits_for_the_warm_process_still_importing(
    tmp_path, seed_prefect_home, seed_mlflow
):
    """The command right after one that left a warm process finds it still importing (seconds):
    it waits and is handed over, instead of running alone through the same imports."""
    starting = _warm(tmp_path, seed_prefect_home, seed_mlflow, ready=False)
    w = next(starting)
    try:
        assert "socket" not in json.loads(w["state"].read_text())  # not listening yet
        served = zhpipe(w["env"], "status", "smoke")
        assert served.returncode == 0 and "zhpipe status smoke" in served.stdout, served.stderr
        assert handed(w["log"]) == 1
    finally:
        next(starting, None)  # stops it


def test_other_settings_run_alone_and_an_edited_module_stops_it(warm_env):
    env, log = warm_env["env"], warm_env["log"]
    # Prefect reads it when imported
    other = zhpipe({**env, "PREFECT_LOGGING_LEVEL": "ERROR"}, "status", "smoke")
    assert other.returncode == 0 and handed(log) == 0
    assert zhpipe(env, "status", "smoke").returncode == 0 and handed(log) == 1
    time.sleep(0.05)
    warm_env["probe"].write_text(
        "# edited: what the warm process imported is not what is on disk now\n"
    )
    after = zhpipe(env, "status", "smoke")
    # run by the client itself
    assert after.returncode == 0 and "zhpipe status smoke" in after.stdout
    # and the warm process stopped
    assert warm_env["proc"].wait(30) == 0 and not warm_env["state"].exists()
    assert "sitecustomize.py changed" in log.read_text() and handed(log) == 1


def test_changed_names_an_edited_or_removed_file(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    files = {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in (a, b)}
    assert warm.changed(files) is None
    b.write_text("y = 22\n")
    assert warm.changed(files) == str(b)
    b.unlink()
    assert warm.changed({str(b): files[str(b)]}) == str(b)
    # (mtime, size) as lists, as JSON gives them back
    assert warm.changed(json.loads(json.dumps(files))) == str(b)


def test_a_warm_process_for_other_settings_replaces_the_one_running(warm_env, monkeypatch):
    env = warm_env["env"]
    other = {**env, "PREFECT_LOGGING_LEVEL": "ERROR"}
    monkeypatch.setenv("PREFECT_HOME", env["PREFECT_HOME"])
    handover.spawn(60, other)
    # one warm process per project
    assert warm_env["proc"].wait(30) == 0 and not warm_env["state"].exists()
    replacement = handover.state_file(handover.fingerprint(other))
    deadline = time.monotonic() + 120
    while not replacement.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        assert replacement.exists(), warm_env["log"].read_text()
        served = zhpipe(other, "status", "smoke")
        assert served.returncode == 0 and handed(warm_env["log"]) == 1
    finally:
        assert handover.stop() == 1


def _fork_pid(log: Path, command: str, timeout: float = 120) -> int:
    """The pid of the fork running `command`, from the warm process's log line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines() if log.exists() else []:
            if line.startswith(f"warm: running `zhpipe {command}` in process "):
                return int(line.rsplit(" ", 1)[1])
        time.sleep(0.1)
    raise AssertionError(f"no fork ran `{command}`: {log.read_text()[-2000:]}")


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _wait_for(predicate, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.1)
    return predicate()


def test_ctrl_z_stops_the_fork_and_a_killed_client_ends_it(shared_warm, tmp_path):
    env, log = shared_warm["env"], shared_warm["log"]
    # a job of its own, as a shell starts it (a group the kernel may stop)
    with open(tmp_path / "out", "w") as out:
        client = subprocess.Popen(
            zhpipe_argv("run", "smoke", "--to", "download"),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    fork = _fork_pid(log, "run smoke --to download")
    client.send_signal(signal.SIGTSTP)  # Ctrl-Z: the shell's job stops, and the command with it
    assert _wait_for(lambda: _proc_state(fork) == "T" and _proc_state(client.pid) == "T", 20)
    client.send_signal(signal.SIGCONT)  # fg
    assert _wait_for(
        lambda: _proc_state(fork) not in ("T", None) and _proc_state(client.pid) != "T", 20
    )
    client.kill()  # kill -9 of the client: the command it handed over does not go on without it
    client.wait(10)
    assert _wait_for(lambda: _proc_state(fork) in (None, "Z"), 60), (tmp_path / "out").read_text()[
        -2000:
    ]


def test_the_fork_reports_its_status_when_the_warm_parent_dies_and_keeps_the_shells_umask_and_zone(
    warm_env, tmp_path
):
    from datetime import datetime
    from zoneinfo import ZoneInfo

    env, log = {**warm_env["env"], "TZ": "Asia/Shanghai"}, warm_env["log"]
    client = subprocess.Popen(
        zhpipe_argv("run", "smoke", "--to", "download"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.umask(0o077),
    )
    _fork_pid(log, "run smoke --to download")
    warm_env["proc"].kill()  # kill -9 of the warm parent while its fork runs the command
    out, err = client.communicate(timeout=300)
    assert client.returncode == 0, err[-2000:]
    # the run finished, and said so
    assert "download" in out and "without an exit status" not in err
    built = [
        p for p in (Path(env["ZHPIPE_DATA"]) / "download").iterdir() if not p.name.startswith(".")
    ]
    assert built and all(p.stat().st_mode & 0o077 == 0 for p in built)  # umask 077, as in the shell
    stamp = next(
        line.split()[0] for line in err.splitlines() if line[:2].isdigit() and line[2:3] == ":"
    )
    now = datetime.now(ZoneInfo("Asia/Shanghai"))
    logged = now.replace(hour=int(stamp[:2]), minute=int(stamp[3:5]))
    assert (
        abs((now - logged).total_seconds()) % 86400 < 600
        or abs((now - logged).total_seconds()) % 86400 > 86400 - 600
    )


def test_the_log_is_private_and_holds_no_password(shared_warm):
    env, log = shared_warm["env"], shared_warm["log"]
    secret = "https://alice:s3cr3t-(pw@example.com/reviews.csv"
    zhpipe(env, "status", "smoke", "--set", f"source.url={secret}")
    assert "warm: running `zhpipe status smoke --set" in log.read_text()
    assert "s3cr3t" not in log.read_text() and log.stat().st_mode & 0o077 == 0
