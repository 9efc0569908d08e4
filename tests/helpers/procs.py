"""Stopping the processes a test started."""

import os
import signal
import subprocess
import time


def stop(*procs: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM to each, then SIGKILL of the whole process group of those still running after `grace`
    seconds (all of them in the same `grace`). Each must lead a session of its own
    (`start_new_session=True`), so that the group is its own and its children's: a process worker
    still running a flow, or a Dask nanny's worker."""
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def free_port() -> int:
    """A loopback port nobody listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def zhpipe_argv(*args) -> list[str]:
    """The command line of `zhpipe ARGS` as the tests start it (`python -m flows.cli`, this
    interpreter): the one place a test spells it, for `zhpipe`, `start` and the tests that start a
    command with Popen options of their own (tests/test_layout.py holds every other test to it)."""
    import sys

    return [sys.executable, "-m", "flows.cli", *map(str, args)]


def zhpipe(
    env: dict | None, *args, cwd=ROOT, timeout: float = 600, umask: int | None = None, **kw
) -> subprocess.CompletedProcess:
    """`zhpipe ARGS` as a user runs it, a process of its own (`python -m flows.cli`, its output
    captured): in `cwd` (the checkout unless given), with `env` (this process's when None) and, with
    `umask`, that umask. The one way the tests start a zhpipe command; a test that checks no process
    behaviour calls `flows.cli.main` in its own process instead (tests/helpers/cli.py), which skips
    seconds of imports; `start` runs one in the background."""

    def with_umask():
        os.umask(umask)

    return subprocess.run(
        zhpipe_argv(*args),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=None if umask is None else with_umask,
        **kw,
    )


def start(env: dict, cwd, *argv: str, log) -> subprocess.Popen:
    """`zhpipe ARGS` in the background, in `cwd` with `env`, its output in the file `log`; the
    leader of a session of its own (`stop` ends it and what it started)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            zhpipe_argv(*argv),
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
