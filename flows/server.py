"""A Prefect server that zhpipe starts once in the background and every later command reuses: without
one, each `zhpipe run` starts Prefect's temporary server (seconds on every command). `zhpipe server
start|stop|status`; the server keeps its database in the project's Prefect home, so the runs recorded by
temporary servers before are in its UI too. PREFECT_API_URL, when set, always wins."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tasks.errors import ZhpipeError


def state_file() -> Path:
    return Path(os.environ["PREFECT_HOME"]).expanduser() / "zhpipe-server.json"


def _healthy(url: str, timeout: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:  # noqa: S310 - a loopback URL we wrote
            return resp.status == 200
    except OSError:
        return False


def running() -> dict | None:
    """The background server's {pid, url, log} when it answers; a stale state file is removed."""
    path = state_file()
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if _healthy(state["url"]):
        return state
    path.unlink(missing_ok=True)
    return None


def use_running() -> str | None:
    """Point this process's Prefect client at the background server, when one is running and
    PREFECT_API_URL is not set. Call before Prefect is imported."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    state = running()
    if state:
        os.environ["PREFECT_API_URL"] = state["url"]
        return state["url"]
    return None


PORTS = (4300, 4999)  # where a project's own port is drawn from (Prefect's default 4200 stays free for its own server)


def project_port() -> int:
    """The project's own port: drawn from PORTS by a hash of the Prefect home folder, so it stays the same
    from one start to the next and two projects rarely meet; ZHPIPE_SERVER_PORT or --port change it."""
    import hashlib

    if os.environ.get("ZHPIPE_SERVER_PORT"):
        return int(os.environ["ZHPIPE_SERVER_PORT"])
    home = str(Path(os.environ["PREFECT_HOME"]).expanduser().resolve())
    lo, hi = PORTS
    return lo + int(hashlib.sha256(home.encode()).hexdigest(), 16) % (hi - lo + 1)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start(port: int | None = None, timeout: float = 180.0) -> dict:
    """Start `prefect server start` on loopback in the background (or return the running one), on the
    project's own port; the UI it serves is told that port (PREFECT_UI_API_URL), so it shows this server."""
    state = running()
    if state:
        return state
    port = port or project_port()
    if not _port_free(port):
        raise ZhpipeError(f"port {port} on 127.0.0.1 is taken (another server?); choose one with "
                          "`zhpipe server start --port PORT` or ZHPIPE_SERVER_PORT")
    home = Path(os.environ["PREFECT_HOME"]).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    log = home / "zhpipe-server.log"
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_API_URL": "", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_API_URL": url}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not _healthy(url, timeout=2):
        if proc.poll() is not None:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise ZhpipeError(f"prefect server exited with code {proc.returncode} ({tail[0][:200]}); see {log}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            raise ZhpipeError(f"prefect server did not answer on {url} within {timeout:.0f} s; see {log}")
        time.sleep(0.5)
    state = {"pid": proc.pid, "url": url, "log": str(log)}
    state_file().write_text(json.dumps(state), encoding="utf-8")
    return state


def stop(timeout: float = 30.0) -> dict | None:
    """Stop the background server (its whole process group); None when none was running."""
    path = state_file()
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    try:
        os.killpg(state["pid"], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            os.killpg(state["pid"], 0)
            time.sleep(0.2)
        os.killpg(state["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass
    path.unlink(missing_ok=True)
    return state
