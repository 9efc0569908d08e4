"""The client side of the warm zhpipe process (`flows.runtime.warm`): `zhpipe run` and `zhpipe
status` hand their command to the project's warm process when one serves their settings
(`hand_over`), the first run leaves one behind (`spawn`), and `zhpipe server stop` stops it
(`stop`). Nothing here imports Prefect, MLflow or the stages.
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
import time
from pathlib import Path

from flows.plan import private
from flows.runtime import procs
from tasks.errors import say

_ENV_PREFIXES = ("PREFECT_", "MLFLOW_", "ZHPIPE_", "PYTHON")
_ENV_EXCLUDED = ("ZHPIPE_WARM",)
SERVING = False  # set in a warm process's fork: the command it runs is not handed over again


def home() -> Path:
    return Path(os.environ["PREFECT_HOME"]).expanduser()


def state_file(mine: str) -> Path:
    """Where the warm process for clients of fingerprint `mine` says where it listens (one per
    fingerprint)."""
    return home() / f"zhpipe-warm-{mine[:16]}.json"


def log_file() -> Path:
    return home() / "zhpipe-warm.log"


def socket_dir() -> Path:
    """A folder only this user can enter (0700, checked), short enough for a Unix socket's path (at
    most 107 bytes): `run/` in the Prefect home, else this user's runtime folder, else `zhpipe-UID`
    in the temporary folder. `private.NotPrivate` when the one it must use is not this user's
    alone."""
    import tempfile

    candidates = [home() / "run"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "zhpipe")
    candidates.append(Path(tempfile.gettempdir()) / f"zhpipe-{os.getuid()}")
    for folder in candidates:
        if len(str(folder).encode()) + 27 < 108:  # "/warm-<16 hex>.sock" and some room
            return private.private_dir(folder)
    raise private.NotPrivate("no folder with a path short enough for a Unix socket")


def socket_path(mine: str) -> str:
    # one per project and settings
    project = hashlib.sha256(f"{home().resolve()}|{mine}".encode()).hexdigest()[:16]
    return str(socket_dir() / f"warm-{project}.sock")


# the variables that decide what an import does, or what the process does that cannot be changed
# after start-up
# the locale of stdio; caches under ~ that modules fix on import
_ENV_EXACT = ("LANG", "LANGUAGE", "HOME")


def fingerprint(environ: dict | None = None) -> str:
    """What decides what an import does: the interpreter, the `flows` package and the settings'
    variables."""
    import flows

    environ = os.environ if environ is None else environ
    settings = sorted(
        (k, v)
        for k, v in environ.items()
        if (k.startswith(_ENV_PREFIXES) or k.startswith("LC_") or k in _ENV_EXACT)
        and not k.startswith(_ENV_EXCLUDED)
    )
    blob = json.dumps([sys.executable, sys.version, str(Path(flows.__file__).resolve()), settings])
    return hashlib.sha256(blob.encode()).hexdigest()


def enabled() -> bool:
    return os.environ.get("ZHPIPE_WARM", "on").lower() not in ("off", "0", "false", "no")


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
    if size > 16 << 20:
        return None, fds
    while len(blob) < size:
        more = sock.recv(size - len(blob))
        if not more:
            return None, fds
        blob += more
    return json.loads(blob), fds


def context() -> dict:
    """What a process inherits that the environment does not say: its limits, umask, priority and
    groups. The warm process's fork takes all of it on, or refuses the command
    (`flows.runtime.warm.apply_context`)."""
    import resource

    mask = os.umask(0)
    os.umask(mask)
    limits = {
        name: resource.getrlimit(getattr(resource, name))
        for name in dir(resource)
        if name.startswith("RLIMIT_")
    }
    return {
        "umask": mask,
        "limits": limits,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "groups": sorted(os.getgroups()),
        "gid": os.getgid(),
    }


def _connect(state: dict) -> socket.socket | None:
    """A connection to the warm process a state file names, once it is shown to be ours: the pid
    recorded with its start time, the socket in this user's private folder, and the listener's uid
    and pid (SO_PEERCRED)."""
    path = state.get("socket")
    if not isinstance(path, str) or not procs.is_ours(state):
        return None
    try:
        if Path(path).parent != socket_dir() or Path(path).lstat().st_uid != os.getuid():
            return None
    except (OSError, private.NotPrivate):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # a warm process that does not answer in that time is not one to wait for
        sock.settimeout(30)
        sock.connect(path)
        pid, uid, _ = procs.peer(sock)
    except OSError:
        sock.close()
        return None
    if uid != os.getuid() or pid != state["pid"]:
        say(
            "warning",
            f"{path} is served by process {pid} of uid {uid}, not this project's warm process; "
            "running the command here",
        )
        sock.close()
        return None
    return sock


# how long a command waits for a warm process that is still importing (about 8 s on 2 cores; a
# command run alone instead spends that and more on the same imports)
STARTING_WAIT_S = 30.0


def _ready(path: Path) -> dict | None:
    """The state of the warm process `path` names, once it listens: one still importing (left by
    the command before, a moment ago) is waited for while it lives, up to STARTING_WAIT_S."""
    deadline = time.monotonic() + STARTING_WAIT_S
    state = private.read_state(path)
    while state and state.get("starting") and procs.is_ours(state) and time.monotonic() < deadline:
        time.sleep(0.05)
        state = private.read_state(path)
    return state if state and not state.get("starting") else None


def hand_over(argv: list[str]) -> int | None:
    """Run `argv` in the warm process, if there is one that can; its exit status, or None to run it
    here."""
    if SERVING or not enabled():
        return None
    mine = fingerprint()
    path = state_file(mine)
    state = _ready(path)
    if not state or state.get("fingerprint") != mine:
        return None
    sock = _connect(state)
    if sock is None:
        # a leftover of a process that is gone (or a pid reused since): not a warm process
        if not procs.is_ours(state):
            path.unlink(missing_ok=True)
            _remove_socket(state)
        return None
    # the signals a user may send (Ctrl-C, Ctrl-Z) wait from the moment the command is handed over
    # until they can be passed on: none is lost to the fork, or acted on by this process alone
    held = {*procs.SIGNALS_FORWARDED, signal.SIGTSTP, signal.SIGCONT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        try:
            send(
                sock,
                {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "context": context()},
                [0, 1, 2],
            )
            reply, _ = recv(sock)
        except (OSError, ValueError):
            reply = None
        if (
            not reply
            or not isinstance(reply.get("pid"), int)
            or private.parent_of(reply["pid"]) != state["pid"]
        ):
            sock.close()  # refused (code changed, other limits, say): this process runs the command
            return None
        _pass_signals_on(reply["pid"])
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    return _wait(sock)


def _pass_signals_on(pid: int) -> None:
    """From now on the signals this process gets go to the fork `pid` (the leader of its own process
    group); job control (Ctrl-Z, fg) stops and continues it with this process."""

    def pass_on(signum, _frame):
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def suspend(_signum, _frame):
        # the fork's group is orphaned (its session's leader has no parent in a terminal session),
        # where the kernel drops SIGTSTP: it is stopped with SIGSTOP, then this process stops as the
        # shell expects
        pass_on(signal.SIGSTOP, None)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, suspend)  # continued (fg, bg): the fork goes on too
        pass_on(signal.SIGCONT, None)

    for signum in procs.SIGNALS_FORWARDED:
        signal.signal(signum, pass_on)
    signal.signal(signal.SIGTSTP, suspend)
    signal.signal(signal.SIGCONT, lambda *_: pass_on(signal.SIGCONT, None))


def _wait(sock: socket.socket) -> int:
    """The exit status the fork reports (one error line and 1 when it ends without one)."""
    sock.settimeout(None)
    try:
        done, _ = recv(sock)
    except (OSError, ValueError):
        done = None
    finally:
        sock.close()
    if not done or not isinstance(done.get("rc"), int):
        say(
            "error",
            f"the warm zhpipe process ended without an exit status (see {log_file()}); "
            "set ZHPIPE_WARM=off to run commands in their own process",
        )
        return 1
    return done["rc"]


# the warm process's program: the CLI's entry for it, which hands flows/runtime/warm.py the command
# each fork runs
PROGRAM = "flows.cli.warm"


def spawn(idle: float, environ: dict, root: Path | None = None) -> None:
    """Leave a warm process behind for the next commands (nothing when one runs or ZHPIPE_WARM=off);
    `environ` is the environment the command was handed over with (a run may add variables of its
    own later); `root` the project whose MLflow store it opens ahead of the commands."""
    mine = fingerprint(environ)
    if SERVING or not enabled():
        return
    state = private.read_state(state_file(mine))
    if state and procs.is_ours(state):
        return
    state_file(mine).unlink(missing_ok=True)  # a leftover (the process is gone): replaced
    try:
        socket_dir()
    except private.NotPrivate as e:
        say("warning", f"no warm process ({e}); commands run in their own process")
        return
    # one warm process per project: one for other settings (or older code) finishes its commands and
    # exits
    stop()
    env = dict(environ)
    # the `flows` package this process runs: imported, never
    installed = str(Path(__file__).resolve().parents[2])
    # the project it serves
    env["PYTHONPATH"] = os.pathsep.join(p for p in (installed, env.get("PYTHONPATH")) if p)
    with private.open_private_log(log_file()) as log:
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                PROGRAM,
                "--idle",
                str(idle),
                "--fingerprint",
                mine,
                *(["--project", str(root)] if root else []),
            ],
            env=env,
            cwd=str(root) if root else None,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _remove_socket(state: dict | None) -> None:
    """A leftover's socket, when it lies in this user's private folder."""
    try:
        if (
            state
            and isinstance(state.get("socket"), str)
            and Path(state["socket"]).parent == socket_dir()
        ):
            Path(state["socket"]).unlink(missing_ok=True)
    except private.NotPrivate:
        pass


def stop() -> int:
    """Stop the project's warm processes; how many were running. A state file naming a process that
    is not provably the warm process it recorded (gone, or its pid reused) is a leftover: removed,
    nothing signalled."""
    stopped = 0
    for path in home().glob("zhpipe-warm-*.json"):
        state = private.read_state(path)
        if state and procs.signal_ours(state, signal.SIGTERM):
            stopped += 1
        else:
            path.unlink(missing_ok=True)
            _remove_socket(state)
    return stopped
