"""Prefect's temporary server for one command (`ZHPIPE_SERVER=temporary`, or when the background
server could not start), started as the command starts instead of when its flow first asks for one.

Left to Prefect, the temporary server starts inside the flow: this process imports Prefect's server
module (about 2 s), starts the server process and waits for it (seconds of imports and start-up),
and only then runs the flow. Here the server process starts before this process has imported
anything heavy, Prefect is pointed at it through PREFECT_API_URL, and the command waits for it
(`ready`) only once its own imports and the MLflow store are done.

It is Prefect's own server app (`prefect.server.api.server:create_app`, as Prefect's temporary
server runs it) on a loopback port chosen free, asking for the project's credentials as the
background server does (`private.with_login`); before the first request the port's listening socket
must be the server's own (another user who binds the port first gets nothing), and the server must
refuse a request without the credentials. It stops with the command: at exit, or by the kernel when
the command is killed (Linux's PR_SET_PDEATHSIG)."""

from __future__ import annotations

import atexit
import importlib.util
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from flows.plan.private import (
    credentials,
    demands,
    free_port,
    open_private_log,
    ours_listening,
    status_of,
    with_login,
)
from flows.plan.project import corrupt_prefect_database
from flows.runtime import homes
from tasks.errors import ZhpipeError

TIMEOUT_S = 180.0  # a first start on 2 cores, new database included, is about 20 s

# sent SIGTERM when the process that started it dies (PR_SET_PDEATHSIG, kept across exec), then
# Python is exec'd; argv: the parent's pid, then the arguments
_DIE_WITH_PARENT = """import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):
    sys.exit("the process that started this server is gone")
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


@dataclass
class Temporary:
    proc: subprocess.Popen
    port: int
    log: Path
    error: Exception | None = None
    new_home: Path | None = None  # a home it made its database in: kept for later new homes
    waiting: threading.Thread = field(init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def wait(self, timeout: float = TIMEOUT_S) -> None:
        """Until the server answers its health check on a socket of its own; the error is kept for
        `ready`."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    tail = self.log.read_text(errors="replace").strip().splitlines()[-1:] or [
                        "(no output)"
                    ]
                    home = Path(os.environ["PREFECT_HOME"]).expanduser()
                    raise ZhpipeError(
                        corrupt_prefect_database(home)
                        or (
                            f"the temporary Prefect server exited with code {self.proc.returncode} "
                            f"({tail[0][:200]}); see {self.log}"
                        )
                    )
                # the port's socket proved the server's before anything is sent there, then its
                # login
                ours = ours_listening(self.proc.pid, self.url, "nothing was sent there; run again")
                if (
                    ours
                    and status_of(f"{self.url}/health", None, 2) == 200
                    and demands(self.url, credentials(), "/admin/version")
                ):
                    if self.new_home is not None:
                        homes.keep(self.new_home)
                    return
                if time.monotonic() > deadline:
                    raise ZhpipeError(
                        f"the temporary Prefect server did not answer on {self.url} within "
                        f"{timeout:.0f} s; see {self.log}"
                    )
                time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - said by `ready`, in the command's thread
            self.error = e

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_STARTED: Temporary | None = None


def command(port: int) -> list[str]:
    """Prefect's server app on loopback `port`, as Prefect's own temporary server runs it; on Linux
    it is sent SIGTERM when the process that started it dies, killed or not (no exit hook runs
    then)."""
    app_dir = str(Path(importlib.util.find_spec("prefect").origin).parents[1])
    argv = [
        "-m",
        "uvicorn",
        "--app-dir",
        app_dir,
        "--factory",
        "prefect.server.api.server:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "error",
        "--lifespan",
        "on",
    ]
    if sys.platform.startswith("linux"):
        argv = ["-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
    return [sys.executable, *argv]


def environment(environ) -> dict[str, str]:
    """The server's environment: this one's (its Prefect home), for a server without a UI that asks
    for the project's credentials."""
    env = with_login({k: v for k, v in environ.items() if k != "PREFECT_API_URL"})
    env.update(
        {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    )
    return env


def launch() -> Temporary:
    """Start the server process now, point Prefect at it (call before Prefect is imported) and wait
    for it in a thread; `ready` joins that wait."""
    global _STARTED
    port = free_port()  # free now; `wait` proves that the socket listening there is the server's
    home = Path(os.environ["PREFECT_HOME"]).expanduser()
    made = homes.prepare(home)
    log = home / f"zhpipe-temporary-server-{port}.log"
    with open_private_log(log, "w") as out:
        proc = subprocess.Popen(
            command(port),
            env=environment(os.environ),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _STARTED = server = Temporary(proc, port, log, new_home=home if made else None)
    atexit.register(_stop)
    os.environ["PREFECT_API_URL"] = server.url
    os.environ["PREFECT_API_AUTH_STRING"] = credentials()
    # it serves no UI: Prefect prints no "View at" link to it
    os.environ.setdefault("PREFECT_UI_URL", "")
    server.waiting = threading.Thread(
        target=server.wait, name="zhpipe-temporary-server", daemon=True
    )
    server.waiting.start()
    return server


def _stop() -> None:
    """At exit: the server stopped, and its log removed unless it says why the server failed."""
    if _STARTED is not None:
        _STARTED.stop()
        if _STARTED.error is None:
            _STARTED.log.unlink(missing_ok=True)


def ready() -> None:
    """Return once the temporary server started with this command answers (at once when none was
    started); its failure to start is this command's error."""
    if _STARTED is None:
        return
    _STARTED.waiting.join()
    if _STARTED.error is not None:
        raise _STARTED.error
