"""Faults a team's run meets, each on the real services of tests/helpers/team.py while a run is in
flight: the tracking server killed and restarted, the database restarted (every connection of both
servers dropped), the object store unreachable for ten seconds. A run rides a fault out where a
retry is safe, or stops in one line; nothing is half-written (verify finds every output sound), and
the rerun reuses what finished."""

from __future__ import annotations

import re
import time

import pytest

from tests.helpers.procs import start, zhpipe

pytestmark = pytest.mark.e2e


def through(fault, alice, seed: int, when: str, log) -> tuple[int, str]:
    """A run of smoke (new from split on: `split.seed`), `fault()` once its log shows `when`; its
    exit status and log."""
    env, project = alice
    proc = start(env, project, "run", "smoke", "--set", f"split.seed={seed}", log=log)
    deadline = time.monotonic() + 300
    while when not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    fault()
    code = proc.wait(900)
    text = log.read_text()
    print(
        f"the run through the fault exited {code}; its last lines:",
        *text.splitlines()[-4:],
        sep="\n",
    )
    return code, text


def afterwards(alice, seed: int, code: int, text: str, finished_before: tuple[str, ...]) -> None:
    """One line when it failed; every output sound; the rerun completes and reuses what finished
    before the fault."""
    env, project = alice
    if code != 0:
        errors = [line for line in text.splitlines() if line.startswith("zhpipe: ")]
        assert code == 2 and len(errors) == 1 and "Traceback" not in text, text[-4000:]
    verified = zhpipe(env, "verify", cwd=project)
    assert verified.returncode == 0 and " 0 corrupt" in verified.stdout, (
        verified.stdout + verified.stderr
    )
    rerun = zhpipe(env, "run", "smoke", "--set", f"split.seed={seed}", cwd=project)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-4000:]
    for stage in finished_before:
        assert re.search(rf"│ {stage}\s+│ hit", rerun.stdout), rerun.stdout


def test_tracking_server_killed_and_restarted_during_a_run(team, alice, tmp_path):
    """SIGKILL to the tracking server while the run trains, started again 2 s later: MLflow's client
    retries ride it out."""

    def fault():
        team.stop_mlflow(kill=True)
        time.sleep(2)
        team.start_mlflow()

    code, text = through(fault, alice, 11, "train.fasttext: building", tmp_path / "run.log")
    assert code == 0, text[-4000:]
    afterwards(alice, 11, code, text, ("download", "clean", "split", "segment", "embed"))


def test_database_restarted_during_a_run(team, alice, tmp_path):
    """PostgreSQL restarted (fast: every open connection of the MLflow and Prefect servers dropped)
    while the run trains."""
    code, text = through(
        team.restart_postgres, alice, 13, "train.fasttext: building", tmp_path / "run.log"
    )
    # MLflow's pool checks each connection before use; Prefect's clients retry
    assert code == 0, text[-4000:]
    afterwards(alice, 13, code, text, ("download", "clean", "split", "segment", "embed"))


def test_object_store_unreachable_for_ten_seconds(team, alice, tmp_path):
    """The S3 server unreachable for 10 s (connections refused, open ones broken) from the segment
    stage on: more than three times as long as botocore's default retries wait (3 attempts, at most
    3 s of backoff), inside zhpipe's (16 attempts, a minute or two)."""

    def fault():
        team.gate.cut()
        time.sleep(10)
        team.gate.mend()

    code, text = through(fault, alice, 17, "segment: building", tmp_path / "run.log")
    # each request to the store retries for a minute or two (flows/plan/store.py)
    assert code == 0, text[-4000:]
    afterwards(alice, 17, code, text, ("download", "clean", "split"))
