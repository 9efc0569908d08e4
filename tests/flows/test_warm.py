"""The warm zhpipe process (flows.warm, flows.handover): commands handed to it run as they would alone (same output, exit
status, errors), clients with other settings or after a code change run by themselves, and it stops."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import handover, warm

ROOT = Path(__file__).resolve().parents[2]


def zhpipe(env, *args):
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def handed(log: Path) -> int:
    return log.read_text().count("warm: running `zhpipe ") if log.exists() else 0


@pytest.fixture
def warm_env(tmp_path):
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text("# imported at start-up: a module file the warm process watches\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ZHPIPE_WARM")}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect"), "ZHPIPE_DATA": str(tmp_path / "store"),
                "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "MLFLOW_LOGGING_LEVEL": "WARNING",
                "PYTHONPATH": os.pathsep.join([str(probe), str(ROOT)])})
    (tmp_path / "prefect").mkdir()
    log = tmp_path / "prefect" / "zhpipe-warm.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.warm", "--idle", "60", "--fingerprint", handover.fingerprint(env)],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    state = handover.state_file(handover.fingerprint(env)).relative_to(handover.home())
    state = tmp_path / "prefect" / state
    deadline = time.monotonic() + 120
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert state.exists(), log.read_text()
    yield {"env": env, "log": log, "state": state, "proc": proc, "probe": probe / "sitecustomize.py"}
    proc.terminate()
    proc.wait(30)


def test_a_command_handed_over_prints_and_exits_as_it_would_alone(warm_env):
    env, log = warm_env["env"], warm_env["log"]
    served = zhpipe(env, "status", "smoke")
    assert served.returncode == 0, served.stderr[-2000:]
    assert handed(log) == 1
    alone = zhpipe({**env, "ZHPIPE_WARM": "off"}, "status", "smoke")
    assert handed(log) == 1  # ZHPIPE_WARM=off: run here
    assert served.stdout == alone.stdout and "zhpipe status smoke" in served.stdout and "missing" in served.stdout
    bad = zhpipe(env, "status", "no-such-pipeline")  # an error line and its exit status come back as they are
    assert handed(log) == 2
    assert bad.returncode == 2 and bad.stderr.startswith("zhpipe: error:") and "no-such-pipeline" in bad.stderr
    assert bad.stderr == zhpipe({**env, "ZHPIPE_WARM": "off"}, "status", "no-such-pipeline").stderr


def test_other_settings_run_alone_and_an_edited_module_stops_it(warm_env):
    env, log = warm_env["env"], warm_env["log"]
    other = zhpipe({**env, "PREFECT_LOGGING_LEVEL": "ERROR"}, "status", "smoke")  # Prefect reads it when imported
    assert other.returncode == 0 and handed(log) == 0
    assert zhpipe(env, "status", "smoke").returncode == 0 and handed(log) == 1
    time.sleep(0.05)
    warm_env["probe"].write_text("# edited: what the warm process imported is not what is on disk now\n")
    after = zhpipe(env, "status", "smoke")
    assert after.returncode == 0 and "zhpipe status smoke" in after.stdout  # run by the client itself
    assert warm_env["proc"].wait(30) == 0 and not warm_env["state"].exists()  # and the warm process stopped
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
    assert warm.changed(json.loads(json.dumps(files))) == str(b)  # (mtime, size) as lists, as JSON gives them back


def test_a_warm_process_for_other_settings_replaces_the_one_running(warm_env, monkeypatch):
    env = warm_env["env"]
    other = {**env, "PREFECT_LOGGING_LEVEL": "ERROR"}
    monkeypatch.setenv("PREFECT_HOME", env["PREFECT_HOME"])
    handover.spawn(60, other)
    assert warm_env["proc"].wait(30) == 0 and not warm_env["state"].exists()  # one warm process per project
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
