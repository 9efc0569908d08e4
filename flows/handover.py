"""The client side of the warm zhpipe process (`flows.warm`): `zhpipe run` and `zhpipe status` hand their command
to the project's warm process when one serves their settings (`hand_over`), the first run leaves one behind
(`spawn`), and `zhpipe server stop` stops it (`stop`). Nothing here imports Prefect, MLflow or the stages.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

COMMANDS = ("run", "status")  # the commands a warm process may run (short-lived, with a pipeline)
_ENV_PREFIXES = ("PREFECT_", "MLFLOW_", "ZHPIPE_", "PYTHON")
_ENV_EXCLUDED = ("ZHPIPE_WARM",)
SERVING = False  # set in a warm process's fork: the command it runs is not handed over again


def home() -> Path:
    return Path(os.environ["PREFECT_HOME"]).expanduser()


def state_file(mine: str) -> Path:
    """Where the warm process for clients of fingerprint `mine` says where it listens (one per fingerprint)."""
    return home() / f"zhpipe-warm-{mine[:16]}.json"


def socket_path(mine: str) -> str:
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


def read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def send(sock: socket.socket, payload: dict, fds: list[int] | None = None) -> None:
    blob = json.dumps(payload).encode()
    frame = struct.pack("!I", len(blob)) + blob
    if fds:
        socket.send_fds(sock, [frame], fds)
    else:
        sock.sendall(frame)


def recv(sock: socket.socket, with_fds: bool = False) -> tuple[dict | None, list[int]]:
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
    state = read_state(state_file(mine))
    if not state or state.get("fingerprint") != mine:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(30)  # a warm process that does not answer in that time is not one to wait for
        sock.connect(state["socket"])
        send(sock, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
        reply, _ = recv(sock)
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
        done, _ = recv(sock)
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
    if SERVING or not enabled() or read_state(state_file(mine)):
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
        state = read_state(path)
        try:
            os.kill(state["pid"], signal.SIGTERM)
            stopped += 1
        except (ProcessLookupError, TypeError, KeyError):
            path.unlink(missing_ok=True)
    return stopped
