"""A warm zhpipe process beside the project's background Prefect server, so that a cached `zhpipe run` does not
spend seconds importing Prefect, MLflow and the stages again.

The first `zhpipe run` that uses the background server leaves this process behind (`python -m flows.warm`): it
imports what a run imports, then waits on a Unix socket in the Prefect home (one warm process per project,
for the settings of the run that started it, below). A later `zhpipe run` or `zhpipe
status` (the client, which imports nothing heavy) hands it its arguments, working folder, environment and its
stdin/stdout/stderr; the warm process forks, and the fork runs the command as the client would have, writing
to the client's own terminal, while the client waits for its exit status (Ctrl-C is passed on). Each command
runs in a fresh fork, so nothing of one run leaks into the next.

It serves only clients that would import the same code with the same settings: the same Python, the same
`flows` package and the same PREFECT_*, MLFLOW_*, ZHPIPE_* and PYTHON* variables (Prefect reads its settings
when it is imported); any other client runs the command itself. Before each command the fork checks that no
module file it imported has changed since (an edited stage, an upgraded package): if one has, the command runs
in the client and the warm process exits, and the next run starts a new one. It stops by itself after
`ZHPIPE_SERVER_IDLE` seconds without a command (as the server does), with `zhpipe server stop`, or with
ZHPIPE_WARM=off in the environment, which also keeps every command in its own process.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = ("run", "status")  # the commands a warm process may run (short-lived, with a pipeline)
# what a run imports: loaded once here, shared by every fork
PRELOAD = ("flows.cli", "flows.pipeline", "flows.runner", "flows.tracking", "flows.evaluation", "flows.registry", "flows.status",
           "prefect.flow_engine", "prefect.task_engine", "mlflow", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store",
           "mlflow.store.model_registry.sqlalchemy_store")
_ENV_PREFIXES = ("PREFECT_", "MLFLOW_", "ZHPIPE_", "PYTHON")
_ENV_EXCLUDED = ("ZHPIPE_WARM",)
SERVING = False  # set in a warm process's fork: the command it runs is not handed over again


def home() -> Path:
    return Path(os.environ["PREFECT_HOME"]).expanduser()


def state_file(mine: str) -> Path:
    """Where the warm process for clients of fingerprint `mine` says where it listens (one per fingerprint)."""
    return home() / f"zhpipe-warm-{mine[:16]}.json"


def _socket_path(mine: str) -> str:
    path = str(state_file(mine).with_suffix(".sock"))
    if len(path.encode()) < 100:  # a Unix socket's path is at most 104-108 bytes
        return path
    return f"/tmp/zhpipe-warm-{hashlib.sha256(path.encode()).hexdigest()[:16]}.sock"


def fingerprint(environ: dict | None = None) -> str:
    """What decides what an import does: the interpreter, the `flows` package and the settings' variables."""
    import flows

    environ = os.environ if environ is None else environ
    settings = sorted((k, v) for k, v in environ.items() if k.startswith(_ENV_PREFIXES) and not k.startswith(_ENV_EXCLUDED))
    blob = json.dumps([sys.executable, sys.version, str(Path(flows.__file__).resolve()), settings])
    return hashlib.sha256(blob.encode()).hexdigest()


def enabled() -> bool:
    return os.environ.get("ZHPIPE_WARM", "on").lower() not in ("off", "0", "false", "no")


def _read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# ---- the client: `zhpipe run` and `zhpipe status` hand their command over --------------------------------------

def _send(sock: socket.socket, payload: dict, fds: list[int] | None = None) -> None:
    blob = json.dumps(payload).encode()
    frame = struct.pack("!I", len(blob)) + blob
    if fds:
        socket.send_fds(sock, [frame], fds)
    else:
        sock.sendall(frame)


def _recv(sock: socket.socket, with_fds: bool = False) -> tuple[dict | None, list[int]]:
    """One framed message (and the descriptors that came with it); None at the end of the stream."""
    fds: list[int] = []
    if with_fds:
        head, fds, _, _ = socket.recv_fds(sock, 4, 3)
    else:
        head = sock.recv(4)
    while head and len(head) < 4:
        more = sock.recv(4 - len(head))
        if not more:
            return None, fds
        head += more
    if not head:
        return None, fds
    size, blob = struct.unpack("!I", head)[0], b""
    while len(blob) < size:
        more = sock.recv(size - len(blob))
        if not more:
            return None, fds
        blob += more
    return json.loads(blob), fds


def hand_over(argv: list[str]) -> int | None:
    """Run `argv` in the warm process, if there is one that can; its exit status, or None to run it here."""
    if SERVING or not enabled():
        return None
    mine = fingerprint()
    state = _read_state(state_file(mine))
    if not state or state.get("fingerprint") != mine:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(30)  # a warm process that does not answer in that time is not one to wait for
        sock.connect(state["socket"])
        _send(sock, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
        reply, _ = _recv(sock)
    except OSError:
        sock.close()
        return None
    if not reply or "pid" not in reply:  # refused (code changed, say): this process runs the command
        sock.close()
        return None
    pid = reply["pid"]

    def pass_on(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, pass_on)
    sock.settimeout(None)
    try:
        done, _ = _recv(sock)
    finally:
        sock.close()
    if not done or "rc" not in done:
        print(f"zhpipe: error: the warm zhpipe process ended without an exit status (see {home() / 'zhpipe-warm.log'}); "
              "set ZHPIPE_WARM=off to run commands in their own process", file=sys.stderr)
        return 1
    return int(done["rc"])


def spawn(idle: float, environ: dict) -> None:
    """Leave a warm process behind for the next commands (nothing when one runs or ZHPIPE_WARM=off); `environ` is
    the environment the command was handed over with (a run may add variables of its own later)."""
    mine = fingerprint(environ)
    if SERVING or not enabled() or _read_state(state_file(mine)):
        return
    stop()  # one warm process per project: one for other settings (or older code) finishes its commands and exits
    env = dict(environ)
    root = str(Path(__file__).resolve().parent.parent)  # the `flows` package this process runs
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with open(home() / "zhpipe-warm.log", "a") as log:
        subprocess.Popen([sys.executable, "-m", "flows.warm", "--idle", str(idle), "--fingerprint", mine],
                         env=env, cwd=root, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop() -> int:
    """Stop the project's warm processes; how many were running."""
    stopped = 0
    for path in home().glob("zhpipe-warm-*.json"):
        state = _read_state(path)
        try:
            os.kill(state["pid"], signal.SIGTERM)
            stopped += 1
        except (ProcessLookupError, TypeError, KeyError):
            path.unlink(missing_ok=True)
    return stopped


# ---- the warm process ------------------------------------------------------------------------------------------

def module_files() -> dict[str, tuple[int, int]]:
    """(mtime, size) of every imported module's file."""
    out = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path not in out:
            try:
                st = os.stat(path)
            except OSError:
                continue
            out[path] = (st.st_mtime_ns, st.st_size)
    return out


def changed(files: dict[str, tuple[int, int]]) -> str | None:
    """The first of `files` that is not as it was (edited, replaced or removed), if any."""
    for path, seen in files.items():
        try:
            st = os.stat(path)
        except OSError:
            return path
        if (st.st_mtime_ns, st.st_size) != tuple(seen):
            return path
    return None


def _run_command(conn: socket.socket, files: dict, mine: str) -> None:
    """In the fork: take the client's command and run it as the client would; never returns."""
    request, fds = _recv(conn, with_fds=True)
    if request is None or len(fds) != 3:
        os._exit(1)
    if fingerprint(request["env"]) != mine:
        _send(conn, {"refused": "settings differ"})
        os._exit(0)
    edited = changed(files)
    if edited:
        _send(conn, {"refused": f"{edited} changed"})
        print(f"{edited} changed since this process imported it: stopping", flush=True)
        os.kill(os.getppid(), signal.SIGTERM)
        os._exit(0)
    print(f"warm: running `zhpipe {' '.join(request['argv'])}` in process {os.getpid()}", flush=True)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    for number, fd in enumerate(fds):
        os.dup2(fd, number)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["zhpipe", *request["argv"]]
    sys.stdout.reconfigure(line_buffering=True)
    try:
        _send(conn, {"pid": os.getpid()})
    except OSError:  # the client gave up waiting and runs the command itself
        os._exit(0)
    import flows.warm
    from flows import cli

    flows.warm.SERVING = True  # this module runs as __main__: the CLI's copy is the one to tell

    code = 1
    try:
        code = cli.main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - shown as a plain process would show it
        import traceback

        traceback.print_exc()
    cli.finish(code)  # MLflow's and Prefect's exit hooks run, as in any command


def serve(idle: float, mine: str) -> int:
    """Import, listen, and fork a process per command until `idle` seconds pass without one (or SIGTERM)."""
    import importlib

    t0 = time.monotonic()
    for name in PRELOAD:
        importlib.import_module(name)
    files = module_files()
    # what was imported lives as long as this process: kept out of the collector, so that a fork's collections
    # neither walk it (about 0.3 s each, with Prefect, MLflow and pandas loaded) nor copy its pages on write
    gc.collect()
    gc.freeze()
    path = _socket_path(mine)
    Path(path).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)  # this user's commands only
    listener.listen(16)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping = []
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    state = {"pid": os.getpid(), "socket": path, "fingerprint": mine, "modules": len(files)}
    tmp = home() / f".zhpipe-warm.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state), encoding="utf-8")
    os.replace(tmp, state_file(mine))
    print(f"warm: {len(files)} modules imported in {time.monotonic() - t0:.1f} s; listening on {path}", flush=True)
    clients: dict[int, socket.socket] = {}
    me, last = os.getpid(), time.monotonic()
    try:
        while True:
            if stopping and listener.fileno() >= 0:  # no new commands; the running ones still get their status sent
                listener.close()
            if (stopping or time.monotonic() - last > idle) and not clients:
                break
            watch = [wake_r] + ([listener] if listener.fileno() >= 0 else [])
            try:
                ready, _, _ = select.select(watch, [], [], 5.0)
            except InterruptedError:
                ready = []
            if wake_r in ready:
                os.read(wake_r, 512)
            while clients:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    break
                conn = clients.pop(pid, None)
                if conn is not None:
                    try:
                        _send(conn, {"rc": os.waitstatus_to_exitcode(status)})
                    except OSError:
                        pass
                    conn.close()
                last = time.monotonic()
            if listener.fileno() >= 0 and listener in ready:
                conn, _ = listener.accept()
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    for fd in (listener, *clients.values()):
                        fd.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _run_command(conn, files, mine)
                clients[pid] = conn
                last = time.monotonic()
    finally:
        if os.getpid() == me:  # not in a fork leaving through here
            if (_read_state(state_file(mine)) or {}).get("pid") == me:
                state_file(mine).unlink(missing_ok=True)
            Path(path).unlink(missing_ok=True)
    print("warm: stopping" + (" (asked to)" if stopping else f" (no command for {idle:.0f} s)"), flush=True)
    return 0


if __name__ == "__main__":  # python -m flows.warm --idle S --fingerprint F (started by `zhpipe run`, see spawn)
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=float, required=True)
    ap.add_argument("--fingerprint", required=True)
    ns = ap.parse_args()
    raise SystemExit(serve(ns.idle, ns.fingerprint))
