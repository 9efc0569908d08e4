"""Files private to their user: state files and logs written 0600 (atomically), folders entered by
their owner only (0700, checked before use), and the project's own credentials, kept in one such
file, with the check that a server on a port is the one that asks for them. The background server
and the warm process (flows.runtime) keep their records here; `zhpipe ui` and the Prefect server ask
for the same credentials."""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path

from tasks.errors import ZhpipeError
from tasks.util.private import write_atomic


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, readable by this user only (0600)."""
    write_atomic(path, text)  # mkstemp: 0600, O_EXCL


def write_state(path: Path, state: dict) -> None:
    write_private(path, json.dumps(state))


def read_state(path: Path) -> dict | None:
    """A state file's contents; None when it is missing, unreadable, not ours or not JSON."""
    try:
        st = path.lstat()
        if st.st_uid != os.getuid() or not path.is_file():
            return None
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def open_private_log(path: Path, mode: str = "a"):
    """A log file only this user can read (an existing one is made so)."""
    fd = os.open(
        path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC), 0o600
    )
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, mode)


class NotPrivate(Exception):
    """A folder that should be this user's alone is not (another owner, other users' permissions, a
    link)."""


def private_dir(path: Path) -> Path:
    """`path` as a folder only this user can enter (0700), created if missing; `NotPrivate` when it
    exists and is a link, another user's, or open to others (someone else made it first: nothing is
    put there)."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise NotPrivate(f"{path} is not a folder of this user's")
    if st.st_mode & 0o077:
        raise NotPrivate(
            f"{path} is open to other users (mode {st.st_mode & 0o777:o}, expected 700)"
        )
    return path


def user_cache() -> Path | None:
    """Where this user keeps what zhpipe makes once per installed MLflow and Prefect (their empty
    databases, for new stores and new Prefect homes): ZHPIPE_USER_CACHE, else the XDG cache
    folder's zhpipe/, a folder only this user enters. None when it cannot be one."""
    folder = (
        os.environ.get("ZHPIPE_USER_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zhpipe"
    )
    try:
        return private_dir(Path(folder))
    except (NotPrivate, OSError):
        return None


def credentials_file() -> Path:
    """Where the project's credentials are kept (0600, in the Prefect home): `zhpipe ui`'s app reads
    them from here."""
    return Path(os.environ["PREFECT_HOME"]).expanduser() / "zhpipe-server-auth"


def credentials() -> str:
    """The project's own `user:password` for its server (Prefect's server.api.auth_string /
    api.auth_string): made once, kept 0600 in the Prefect home, given to zhpipe's commands and
    workers; the UI asks for it."""
    path = credentials_file()
    auth = (read_state(path) or {}).get("auth_string")
    if not isinstance(auth, str) or ":" not in auth:
        import secrets

        path.parent.mkdir(parents=True, exist_ok=True)
        auth = f"zhpipe:{secrets.token_urlsafe(24)}"
        write_state(path, {"auth_string": auth})
    return auth


def with_login(env: dict[str, str]) -> dict[str, str]:
    """`env` for a Prefect server zhpipe starts, background or temporary, and for its clients: the
    server asks for the project's credentials (PREFECT_SERVER_API_AUTH_STRING), the clients send
    them (PREFECT_API_AUTH_STRING). The one place a server zhpipe starts gets its login: none runs
    without one, whatever port or fallback it is on."""
    auth = credentials()
    return {**env, "PREFECT_SERVER_API_AUTH_STRING": auth, "PREFECT_API_AUTH_STRING": auth}


def status_of(url: str, auth: str | None, timeout: float) -> int:
    """The HTTP status of a GET, 0 when nothing answers."""
    import base64

    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        # a loopback URL we wrote
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def demands(url: str, auth: str, path: str = "/health", timeout: float = 2) -> bool:
    """Whether the server at `url` is one that asks for exactly these credentials: it refuses `path`
    without them and answers it with them (another server on that port is not ours)."""
    return (
        status_of(f"{url}{path}", None, timeout) == 401
        and status_of(f"{url}{path}", auth, timeout) == 200
    )


# --- whose socket listens on a port: credentials go only to a listener proved ours ----------------

_PROC = Path("/proc")


def parent_of(pid: int) -> int | None:
    """The parent's pid of process `pid` (field 4 of /proc/PID/stat); None when it is gone."""
    try:
        stat_line = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    return int(stat_line[stat_line.rindex(b")") + 2 :].split()[1])


def listeners(port: int) -> list[tuple[int, int]] | None:
    """(uid, socket inode) of each TCP socket listening on `port` on an address that loopback
    reaches (127.0.0.1, 0.0.0.0, ::, ::1), from /proc/net/tcp and tcp6; None without /proc."""
    wanted = {
        f"0100007F:{port:04X}",
        f"00000000:{port:04X}",
        f"{'0' * 32}:{port:04X}",
        # little-endian addresses, as the kernel prints them
        f"{'0' * 24}01000000:{port:04X}",
    }
    found, seen = [], False
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        seen = True
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and cols[1] in wanted:  # 0A: LISTEN
                found.append((int(cols[7]), int(cols[9])))
    return found if seen else None


def _address(host: str, port: int) -> str:
    """An IPv4 or IPv6 socket address as /proc/net/tcp(6) prints it (each 32-bit word in host byte
    order)."""
    import ipaddress
    import sys

    packed = ipaddress.ip_address(host.split("%")[0]).packed
    order = sys.byteorder
    words = [
        int.from_bytes(packed[i : i + 4], "big").to_bytes(4, order)
        for i in range(0, len(packed), 4)
    ]
    return f"{b''.join(words).hex().upper()}:{port:04X}"


def peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid that owns the client's side of the ESTABLISHED loopback TCP connection from `client`
    (host, port) to `server` (host, port), matched on all four (from /proc/net/tcp and tcp6; an IPv4
    peer of an IPv6 socket as ::ffff:a.b.c.d): who is asking a local server. None when it is not
    found or there is no /proc; never a match on ports alone (another address on loopback, or a
    socket in TIME_WAIT, is not the peer)."""
    import ipaddress

    wanted = set()
    for form in ("v4", "mapped"):
        try:
            hosts = [ipaddress.ip_address(h.split("%")[0]) for h in (client[0], server[0])]
            if form == "mapped":
                hosts = [
                    ipaddress.IPv6Address(f"::ffff:{h}") if h.version == 4 else h for h in hosts
                ]
            wanted.add((_address(str(hosts[0]), client[1]), _address(str(hosts[1]), server[1])))
        except ValueError:
            return None
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # 01: ESTABLISHED
            if len(cols) > 7 and cols[3] == "01" and (cols[1], cols[2]) in wanted:
                return int(cols[7])
    return None


def family(pid: int) -> set[int]:
    """`pid` and every process below it (a server's workers, a supervisor's server)."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (parent := parent_of(int(entry.name))) is not None:
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        found.add(current := todo.pop())
        todo.extend(c for c in children.get(current, ()) if c not in found)
    return found


def sockets_of(pids: set[int]) -> set[int]:
    """The inodes of the sockets the processes `pids` hold open (/proc/PID/fd links read
    `socket:[INODE]`)."""
    inodes = set()
    for pid in pids:
        try:
            fds = list((_PROC / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    return inodes


def serves(pid: int, port: int) -> bool | None:
    """Whether what listens on `port` is the process `pid` or one below it (its socket among their
    open files): True, False when nothing or something else listens, None without /proc (then
    nothing can be proved either way)."""
    found = listeners(port)
    if found is None:
        return None
    return bool(found) and not _others(pid, found)


def _others(pid: int, found: list[tuple[int, int]]) -> list[int]:
    """The uids of the listening sockets `found` (`listeners`) that are not `pid`'s or its
    children's."""
    ours = sockets_of(family(pid))
    return [uid for uid, inode in found if inode not in ours]


class PortTaken(ZhpipeError):
    """Another process listens on the port of a server zhpipe started: no credentials are sent
    there."""


def port_of(url: str) -> int:
    from urllib.parse import urlparse

    return urlparse(url).port or 80


def ours_listening(
    pid: int, url: str, sent: str = "no credentials were sent there; choose another port"
) -> bool:
    """Whether the socket listening on `url`'s port is one of process `pid`'s (or its workers'):
    False while nothing listens yet; True without /proc (nothing can be proved there); `PortTaken`,
    naming who holds it and saying `sent`, when another process does (another user who binds the
    port first, or between our check that it is free and our server's start)."""
    port = port_of(url)
    # one reading: a server that starts listening meanwhile is not taken for another's
    found = listeners(port)
    if found is None:
        return True
    if not found:
        return False  # nothing listens yet
    others = _others(pid, found)
    if not others:
        return True
    who = "you, another process" if others[0] == os.getuid() else f"another user (uid {others[0]})"
    raise PortTaken(
        f"port {port} on 127.0.0.1 is held by {who}, not by the server zhpipe started; {sent}"
    )


def ours_answering(
    pid: int, url: str, auth: str, path: str = "/health", timeout: float = 2
) -> bool:
    """Whether the server zhpipe started as process `pid` answers at `url` as ours: before a request
    with the credentials goes out, its socket must be `pid`'s (`ours_listening`); then the server
    must demand exactly these credentials (`demands`). False: not up yet."""
    return ours_listening(pid, url) and demands(url, auth, path, timeout)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on `port` of `host` now (a bind succeeds): what zhpipe checks before
    it starts a server there, and before it draws a project's port."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, drawn by the system (whoever binds it next is proved by
    `ours_listening`)."""
    import socket

    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
