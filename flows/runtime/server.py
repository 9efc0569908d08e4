"""A Prefect server that zhpipe starts once in the background and every later command reuses:
without one, each `zhpipe run` would start Prefect's temporary server (about 20 s on every command).
The first `zhpipe run` of a project starts it, with an idle timeout (`ZHPIPE_SERVER_IDLE`, seconds;
it stops that long after the last zhpipe command that used it ended); `zhpipe server
start|stop|status` manage it by hand (`start` without a timeout). The server keeps its database in
the project's Prefect home, so the runs recorded before are in its UI too. PREFECT_API_URL, when
set, always wins; `ZHPIPE_SERVER=temporary` restores a temporary server per command."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from flows.plan.private import (
    PortTaken,
    credentials,
    free_port,
    open_private_log,
    ours_answering,
    port_free,
    read_state,
    status_of,
    with_login,
    write_state,
)
from flows.plan.project import corrupt_prefect_database
from flows.runtime import homes, procs
from tasks.errors import ZhpipeError


def state_file() -> Path:
    return Path(os.environ["PREFECT_HOME"]).expanduser() / "zhpipe-server.json"


def _healthy(url: str, timeout: float = 0.5) -> bool:
    """Whether the server at `url` answers its health check (no credentials are sent)."""
    return status_of(f"{url}/health", None, timeout) == 200


def _ours(pid: int, url: str, timeout: float = 2) -> bool:
    """Whether the Prefect server process `pid` started answers at `url` as ours: its socket, then
    our credentials (`private.ours_answering`; `PortTaken` when another process holds the port)."""
    return _healthy(url, timeout) and ours_answering(
        pid, url, credentials(), "/admin/version", timeout
    )


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _read() -> dict | None:
    """The state file; one written by an earlier zhpipe (pid and url only) gets the identity of the
    process it names when that process is this user's Prefect server on that url's port (so it can
    still be stopped)."""
    state = read_state(state_file())
    if (
        state
        and "started" not in state
        and isinstance(state.get("pid"), int)
        and isinstance(state.get("url"), str)
    ):
        try:
            marker = f"server start --host 127.0.0.1 --port {_port(state['url'])}"
        except (ValueError, IndexError):
            return state
        legacy = procs.identity(state["pid"], marker)
        if procs.is_ours(legacy):
            state.update(legacy, legacy=True)
    return state


def running() -> dict | None:
    """The background server's {pid, url, log} when it answers and is provably this user's: the
    process its state file recorded (pid and start time), the port's listener of this uid, our
    credentials accepted. A server still starting (its state file says so and names a live process
    of ours) is not running yet, and its file stays, so that `start` waits for it and `stop` stops
    it. Anything else is a leftover: its state file is removed, nothing is sent to that port."""
    path = state_file()
    state = _read()
    if not state:
        return None
    try:
        url = state["url"]
        ours = procs.is_ours(state) and _ours(state["pid"], url)
    except (KeyError, TypeError, ValueError, IndexError, PortTaken):
        ours = False
    if ours:
        return state
    if starting(state):
        return None
    path.unlink(missing_ok=True)
    return None


def starting(state: dict | None = None) -> dict | None:
    """The state of a background server that is still starting: recorded before it answered (by a
    command that may have been killed since) and still a live process of ours."""
    state = _read() if state is None else state
    return state if state and state.get("starting") and procs.is_ours(state) else None


def users_dir() -> Path:
    return state_file().with_name("zhpipe-server-users")


def use_running() -> str | None:
    """Point this process's Prefect client at the background server, when one is running and
    PREFECT_API_URL is not set, and count this process as one of its users (a server with an idle
    timeout stays up while a user lives). Call before Prefect is imported."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    state = running()
    if state:
        os.environ.update(with_login({"PREFECT_API_URL": state["url"]}))
        users_dir().mkdir(parents=True, exist_ok=True)
        (users_dir() / str(os.getpid())).touch()
        return state["url"]
    return None


def background_url() -> str | None:
    """PREFECT_API_URL when it is the project's background server (the one its state file names)."""
    url = os.environ.get("PREFECT_API_URL")
    return url if url and (read_state(state_file()) or {}).get("url") == url else None


@contextlib.contextmanager
def watched(url: str, on_lost: Callable[[float], None], every: float = 2.0, misses: int = 3):
    """Within the block, ask `url` for its health every `every` seconds; after `misses` unanswered
    asks in a row (the server was killed) call `on_lost(seconds without an answer)` from the
    watching thread."""
    stop = threading.Event()

    def watch():
        failed = 0
        while not stop.wait(every):
            failed = 0 if status_of(f"{url}/health", None, timeout=every) == 200 else failed + 1
            if failed >= misses and not stop.is_set():
                on_lost(failed * every)
                return

    thread = threading.Thread(target=watch, daemon=True, name="zhpipe-server-watch")
    thread.start()
    try:
        yield
    finally:
        stop.set()


DEFAULT_IDLE_S = 1800  # a server zhpipe run started by itself stops after 30 minutes without a user


def idle_timeout() -> float:
    value = os.environ.get("ZHPIPE_SERVER_IDLE", str(DEFAULT_IDLE_S))
    try:
        return float(value)
    except ValueError:
        raise ZhpipeError(f"ZHPIPE_SERVER_IDLE={value!r}: expected seconds (e.g. 1800)") from None


def supervise(argv: list[str], idle: float, poll: float | None = None) -> int:
    """Run the Prefect server (`argv`) and stop it once no zhpipe process has used it for `idle`
    seconds: its users are the processes named in `users_dir()` (dead ones are dropped as they are
    seen), looked at every `poll` seconds (5, or a fifth of a shorter timeout, so that it stops
    within a fifth of it late)."""
    from tasks.util.procs import alive

    poll = poll if poll is not None else min(5.0, max(idle / 5, 0.5))

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


# where a project's own port is drawn from (Prefect's default 4200 stays free for its own server)
PORTS = (4300, 4999)


def project_port() -> int:
    """The project's own port: drawn from PORTS by a hash of the Prefect home folder, so it stays
    the same from one start to the next and two projects rarely meet; ZHPIPE_SERVER_PORT or --port
    change it."""
    import hashlib

    if os.environ.get("ZHPIPE_SERVER_PORT"):
        return int(os.environ["ZHPIPE_SERVER_PORT"])
    home = str(Path(os.environ["PREFECT_HOME"]).expanduser().resolve())
    lo, hi = PORTS
    return lo + int(hashlib.sha256(home.encode()).hexdigest(), 16) % (hi - lo + 1)


def _free_port(wanted: int | None) -> int:
    """`wanted` (a port the user chose) when it is free, else one line; without one, the project's
    own port, or, when another process holds that, a port drawn free from the system: a taken port
    is never a reason to run without the project's login."""
    if wanted is not None or os.environ.get("ZHPIPE_SERVER_PORT"):
        port = wanted or project_port()
        if not port_free(port):
            raise ZhpipeError(
                f"port {port} on 127.0.0.1 is taken (another server?); choose one with "
                "`zhpipe server start --port PORT` or ZHPIPE_SERVER_PORT"
            )
        return port
    port = project_port()
    if port_free(port):
        return port
    drawn = free_port()
    print(f" (port {port} is taken; using {drawn})", end="", flush=True)
    return drawn


def start(port: int | None = None, timeout: float = 180.0, idle: float | None = None) -> dict:
    """Start `prefect server start` on loopback in the background (or return the running one, or
    wait for the one starting), on the project's own port; the UI it serves is told that port
    (PREFECT_UI_API_URL), so it shows this server. With `idle` (seconds), it stops that long after
    its last user (`supervise`). Its state file is written as it starts, before it answers: a
    command killed meanwhile leaves a server that `status` sees and `stop` stops."""
    state = running()
    if state:
        return state
    booting = starting()
    if booting:
        return _wait_answering(booting, None, timeout, None)
    home = Path(os.environ["PREFECT_HOME"]).expanduser()
    if why := corrupt_prefect_database(home):
        raise ZhpipeError(why)
    port = _free_port(port)
    home.mkdir(parents=True, exist_ok=True)
    if home.stat().st_uid == os.getuid():
        home.chmod(0o700)  # the server's database holds flow parameters and logs: this user's only
    log = home / "zhpipe-server.log"
    url = f"http://127.0.0.1:{port}/api"
    env = with_login(
        {
            **os.environ,
            "PREFECT_API_URL": "",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_API_URL": url,
        }
    )
    argv = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if idle is not None:
        argv = [sys.executable, "-m", "flows.runtime.server", "--idle", str(idle), "--", *argv]
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p
        )
    made = homes.prepare(home)  # a new home starts from the cached database
    users_dir().mkdir(parents=True, exist_ok=True)
    # the starter is a user while it waits: the idle clock waits with it
    (users_dir() / str(os.getpid())).touch()
    with open_private_log(log, "w") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    # in the command line of both the supervisor and the server
    marker = f"server start --host 127.0.0.1 --port {port}"
    state = {
        **procs.identity(proc.pid, marker),
        "url": url,
        "log": str(log),
        **({"idle_s": idle} if idle is not None else {}),
    }
    write_state(state_file(), {**state, "starting": True})
    return _wait_answering(state, proc, timeout, home if made else None)


def _wait_answering(
    state: dict, proc: subprocess.Popen | None, timeout: float, made: Path | None
) -> dict:
    """Until the server `state` names answers as ours; then its state file says it runs. A server
    that exits, does not answer in `timeout` seconds or loses its port to another process is
    stopped, its state file removed, and said in one line."""
    url, log = state["url"], Path(state["log"])
    deadline = time.monotonic() + timeout

    def failed(why: str, error=ZhpipeError):
        if proc is not None:
            _stop_group(proc)
        else:
            procs.signal_ours(state, signal.SIGTERM, group=True)
        state_file().unlink(missing_ok=True)
        return error(why)

    while True:
        try:
            if _ours(state["pid"], url):
                if made is not None:
                    homes.keep(made)
                break
        except PortTaken as e:  # someone bound the port while ours started: stopped, and said so
            raise failed(
                f"prefect server: {e} (`zhpipe server start --port PORT` or ZHPIPE_SERVER_PORT)",
                PortTaken,
            ) from None
        if (proc.poll() is not None) if proc is not None else not procs.is_ours(state):
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or [
                "(no output)"
            ]
            code = proc.returncode if proc is not None else "?"
            state_file().unlink(missing_ok=True)
            home = Path(os.environ["PREFECT_HOME"]).expanduser()
            raise ZhpipeError(
                corrupt_prefect_database(home)
                or f"prefect server exited with code {code} ({tail[0][:200]}); see {log}"
            )
        if time.monotonic() > deadline:
            raise failed(
                f"prefect server did not answer on {url} within {timeout:.0f} s; see {log}"
            )
        time.sleep(0.5)
    write_state(state_file(), state)
    return state


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop a server this process started (its session's process group), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def stop(timeout: float = 30.0) -> dict | None:
    """Stop the background server (its whole process group); None when none was running. Only the
    process its state file recorded is signalled (pid and start time): a leftover naming a process
    that is gone, or another one with that pid since, is removed and nothing is killed."""
    path = state_file()
    state = _read()
    if not state:
        path.unlink(missing_ok=True)
        return None
    if not procs.signal_ours(state, signal.SIGTERM, group=True):
        path.unlink(missing_ok=True)
        return None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and procs.is_ours(state):
        time.sleep(0.2)
    # still the same process after `timeout`: it would not stop
    procs.signal_ours(state, signal.SIGKILL, group=True)
    path.unlink(missing_ok=True)
    return state


# the supervisor of a server started with an idle timeout: python -m flows.runtime.server --idle S
# -- ARGV...
if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=float, required=True)
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    ns = ap.parse_args()
    raise SystemExit(
        supervise([a for a in ns.argv if a != "--"] if ns.argv[:1] == ["--"] else ns.argv, ns.idle)
    )
