"""A Prefect server that zhpipe starts once in the background and every later command reuses: without
one, each `zhpipe run` would start Prefect's temporary server (about 20 s on every command). The first
`zhpipe run` of a project starts it, with an idle timeout (`ZHPIPE_SERVER_IDLE`, seconds; it stops that long
after the last zhpipe command that used it ended); `zhpipe server start|stop|status` manage it by hand
(`start` without a timeout). The server keeps its database in the project's Prefect home, so the runs recorded
before are in its UI too. PREFECT_API_URL, when set, always wins; `ZHPIPE_SERVER=temporary` restores a
temporary server per command."""
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


def users_dir() -> Path:
    return state_file().with_name("zhpipe-server-users")


def use_running() -> str | None:
    """Point this process's Prefect client at the background server, when one is running and
    PREFECT_API_URL is not set, and count this process as one of its users (a server with an idle timeout
    stays up while a user lives). Call before Prefect is imported."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    state = running()
    if state:
        os.environ["PREFECT_API_URL"] = state["url"]
        users_dir().mkdir(parents=True, exist_ok=True)
        (users_dir() / str(os.getpid())).touch()
        return state["url"]
    return None


DEFAULT_IDLE_S = 1800  # a server zhpipe run started by itself stops after 30 minutes without a user


def idle_timeout() -> float:
    value = os.environ.get("ZHPIPE_SERVER_IDLE", str(DEFAULT_IDLE_S))
    try:
        return float(value)
    except ValueError:
        raise ZhpipeError(f"ZHPIPE_SERVER_IDLE={value!r}: expected seconds (e.g. 1800)") from None


def supervise(argv: list[str], idle: float, poll: float = 5.0) -> int:
    """Run the Prefect server (`argv`) and stop it once no zhpipe process has used it for `idle` seconds: its
    users are the processes named in `users_dir()` (dead ones are dropped as they are seen)."""
    from flows.store import alive

    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    last_used = time.monotonic()

    def stop_child(*_):
        child.terminate()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
        state_file().unlink(missing_ok=True)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop_child)
    while child.poll() is None:
        time.sleep(poll)
        folder = users_dir()
        users = [p for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
        for user in users:
            if alive(int(user.name)):
                last_used = time.monotonic()
            else:
                user.unlink(missing_ok=True)
        if time.monotonic() - last_used > idle:
            print(f"no zhpipe command used this server for {idle:.0f} s: stopping", flush=True)
            stop_child()
    return child.returncode


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


def start(port: int | None = None, timeout: float = 180.0, idle: float | None = None) -> dict:
    """Start `prefect server start` on loopback in the background (or return the running one), on the
    project's own port; the UI it serves is told that port (PREFECT_UI_API_URL), so it shows this server.
    With `idle` (seconds), it stops that long after its last user (`supervise`)."""
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
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    if idle is not None:
        argv = [sys.executable, "-m", "flows.server", "--idle", str(idle), "--", *argv]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")) if p)
    users_dir().mkdir(parents=True, exist_ok=True)
    (users_dir() / str(os.getpid())).touch()  # the starter is a user while it waits: the idle clock waits with it
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not _healthy(url, timeout=2):
        if proc.poll() is not None:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise ZhpipeError(f"prefect server exited with code {proc.returncode} ({tail[0][:200]}); see {log}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            raise ZhpipeError(f"prefect server did not answer on {url} within {timeout:.0f} s; see {log}")
        time.sleep(0.5)
    state = {"pid": proc.pid, "url": url, "log": str(log), **({"idle_s": idle} if idle is not None else {})}
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


if __name__ == "__main__":  # the supervisor of a server started with an idle timeout: python -m flows.server --idle S -- ARGV...
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=float, required=True)
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    ns = ap.parse_args()
    raise SystemExit(supervise([a for a in ns.argv if a != "--"] if ns.argv[:1] == ["--"] else ns.argv, ns.idle))
