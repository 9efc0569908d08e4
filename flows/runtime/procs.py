"""What zhpipe leaves running (the background Prefect server, the warm process) and the files that
say where it is: private to the user who started it, and never a reason to signal a process that is
not provably ours.

A state file records a process's id with its start time and a word of its command line (`identity`);
a pid is signalled only while all three still match and the process belongs to this user
(`signal_ours`). A dead pid, a reused one (after a reboot, say) or another user's is a leftover: the
state file is removed, nothing is killed. State files and logs are written 0600, folders that hold
sockets 0700 and checked before use (flows.plan.private).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
from pathlib import Path

_PROC = Path("/proc")


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None when it
    is gone or the system has no /proc."""
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or ")": the fields after its
    # last ")"
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return (
            (_PROC / str(pid) / "cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
        )
    except OSError:
        return ""


def _owner(pid: int) -> int | None:
    try:
        return (_PROC / str(pid)).stat().st_uid
    except OSError:
        return None


def _home() -> str:
    """The real path of this project's Prefect home: what ties a process to its project."""
    return os.path.realpath(os.path.expanduser(os.environ.get("PREFECT_HOME", "")))


def _home_of(pid: int) -> str | None:
    """The real path of the Prefect home process `pid` was started with (from /proc/PID/environ),
    None when unknown."""
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"PREFECT_HOME="):
            return os.path.realpath(
                os.path.expanduser(item.split(b"=", 1)[1].decode(errors="replace"))
            )
    return None


def identity(pid: int, marker: str) -> dict:
    """What a state file records of process `pid` so that it can be told apart from a later one with
    its id, and from another project's (a copied project holds the original's state files): its
    start time, a word of its command line, and the real path of its project's Prefect home."""
    return {"pid": pid, "started": start_time(pid), "marker": marker, "home": _home()}


def is_ours(state: dict | None) -> bool:
    """Whether the process a state file names is still the one it recorded: same pid, same start
    time, this user's, its command line holding the recorded marker, and this project's (the state
    file's recorded Prefect home, and the one the process was started with, are this project's: a
    state file copied with a project names the original's process, which is never ours). Without
    /proc (not Linux) only a live pid of this user in this project counts."""
    if not isinstance(state, dict) or not isinstance(state.get("pid"), int) or state["pid"] <= 1:
        return False
    if "home" in state and state["home"] != _home():
        return False
    pid = state["pid"]
    if not _PROC.is_dir():
        try:
            # no signal is sent: fails for a dead pid and for another user's (EPERM)
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    started = start_time(pid)
    home = _home_of(pid)
    return (
        started is not None
        and started == state.get("started")
        and _owner(pid) == os.getuid()
        and bool(state.get("marker"))
        and state["marker"] in _cmdline(pid)
        and (home is None or home == _home())
    )


def signal_ours(state: dict, signum: int, group: bool = False) -> bool:
    """Send `signum` to the process (or its process group) a state file names, only when `is_ours`;
    whether it was sent."""
    if not is_ours(state):
        return False
    try:
        # a group only when it leads one (start_new_session)
        if group and os.getpgid(state["pid"]) == state["pid"]:
            os.killpg(state["pid"], signum)
        else:
            os.kill(state["pid"], signum)
    except ProcessLookupError:
        return False
    return True


def peer(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket (SO_PEERCRED,
    Linux)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


SIGNALS_FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)
