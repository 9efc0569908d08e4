"""Stopping the processes a test started."""
import os
import signal
import subprocess
import time


def stop(*procs: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM to each, then SIGKILL of the whole process group of those still running after `grace` seconds
    (all of them in the same `grace`). Each must lead a session of its own (`start_new_session=True`), so that the
    group is its own and its children's: a process worker still running a flow, or a Dask nanny's worker."""
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
