"""A warm zhpipe process beside the project's background Prefect server, so that a cached `zhpipe
run` does not spend seconds importing Prefect, MLflow and the stages again.

The first `zhpipe run` that uses the background server leaves this process behind (`python -m
flows.cli.warm`): it imports what a run imports, then waits on a Unix socket in a folder only its
user can enter (`handover.socket_dir`; one warm process per project, for the settings of the run
that started it, below). A later `zhpipe run` or `zhpipe status` (the client,
`flows.runtime.handover`, which imports nothing heavy) hands it its arguments, working folder,
environment and its stdin/stdout/stderr; the warm process forks, and the fork runs the command as
the client would have, writing to the client's own terminal, while the client waits for its exit
status (Ctrl-C is passed on). Each command runs in a fresh fork, so nothing of one run leaks into
the next.

It serves only clients that would import the same code with the same settings: the same Python, the
same `flows` package and the same PREFECT_*, MLFLOW_*, ZHPIPE_* and PYTHON* variables (Prefect reads
its settings when it is imported); any other client runs the command itself. Before each command the
fork checks that no module file it imported has changed since (an edited stage, an upgraded
package): if one has, the command runs in the client and the warm process exits, and the next run
starts a new one. It stops by itself after `ZHPIPE_SERVER_IDLE` seconds without a command (as the
server does), with `zhpipe server stop`, or with ZHPIPE_WARM=off in the environment, which also
keeps every command in its own process.

Only its own user reaches it, and a command runs as the client would have run it: each side checks
the other's uid (SO_PEERCRED); the fork takes on the client's limits, umask, niceness, groups, time
zone and environment or refuses (`apply_context`), leads a process group of its own that the
client's signals and job control reach, is interrupted when its client goes away, and reports its
exit status itself.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

from flows.plan import private
from flows.runtime import handover, procs
from flows.runtime.handover import fingerprint, recv, send, state_file
from tasks.util.private import PRIVATE_UMASK

# the command each fork runs, and the modules loaded once before (`serve`: the CLI's entry,
# flows/cli/warm.py)
_COMMAND = None


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


def apply_context(ctx: dict) -> str | None:
    """Take on the client's limits, umask, priority and groups (`handover.context`); what could not
    be matched, if anything (then the client runs the command itself)."""
    import resource

    if not isinstance(ctx, dict):
        return "no context"
    if ctx.get("gid") != os.getgid() or sorted(ctx.get("groups", [])) != sorted(os.getgroups()):
        return "other groups"
    try:
        for name, (soft, hard) in ctx["limits"].items():
            which = getattr(resource, name, None)
            if which is not None and resource.getrlimit(which) != (soft, hard):
                resource.setrlimit(which, (soft, hard))  # raising a hard limit fails: refused below
        now = os.getpriority(os.PRIO_PROCESS, 0)
        if ctx["nice"] != now:
            # a lower niceness than this process's fails: refused
            os.setpriority(os.PRIO_PROCESS, 0, ctx["nice"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its limits or priority ({e})"
    os.umask(int(ctx["umask"]) | PRIVATE_UMASK)  # the shell's umask, never looser than owner-only
    return None


def _end_when_client_goes(conn: socket.socket) -> None:
    """In the fork: when the client's end of the connection closes (it was killed), interrupt the
    command as Ctrl-C would, then kill the fork's process group if it has not ended 30 s later."""
    import threading

    def watch():
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        os.killpg(os.getpid(), signal.SIGINT)
        time.sleep(30)
        os.killpg(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="zhpipe-client-watch").start()


def _run_command(conn: socket.socket, files: dict, mine: str) -> None:
    """In the fork: take the client's command and run it as the client would; never returns."""
    request, fds = recv(conn, with_fds=True)
    if request is None or len(fds) != 3:
        os._exit(1)
    _admit(conn, request, files, mine)
    _become_client(request, fds)
    try:
        send(conn, {"pid": os.getpid()})
    except OSError:  # the client gave up waiting and runs the command itself
        os._exit(0)
    _end_when_client_goes(conn)
    _COMMAND(conn, request)


def _admit(conn: socket.socket, request: dict, files: dict, mine: str) -> None:
    """In the fork: the client's command is run here only with the same settings, code and context;
    else the client is told why (and runs it itself) and the fork ends."""
    if fingerprint(request["env"]) != mine:
        send(conn, {"refused": "settings differ"})
        os._exit(0)
    edited = changed(files)
    if edited:
        send(conn, {"refused": f"{edited} changed"})
        print(f"{edited} changed since this process imported it: stopping", flush=True)
        os.kill(os.getppid(), signal.SIGTERM)
        os._exit(0)
    refused = apply_context(request.get("context"))
    if refused:
        send(conn, {"refused": refused})
        print(f"refused a command: could not take on {refused}", flush=True)
        os._exit(0)


def _become_client(request: dict, fds: list[int]) -> None:
    """In the fork: the client's process group, signals, stdin/stdout/stderr, folder, environment,
    time zone and argv."""
    # its own process group: the client's signals reach it and what it starts, no one else
    os.setpgid(0, 0)
    from tasks.util.urls import redact_text

    print(
        f"warm: running `zhpipe {' '.join(redact_text(a) for a in request['argv'])}` in process "
        f"{os.getpid()}",
        flush=True,
    )
    for signum in (
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGCHLD,
        signal.SIGQUIT,
        signal.SIGTSTP,
        signal.SIGCONT,
    ):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    for number, fd in enumerate(fds):
        os.dup2(fd, number)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()  # TZ as the client has it: log times in its zone
    sys.argv = ["zhpipe", *request["argv"]]
    sys.stdout.reconfigure(line_buffering=True)


def _private_log() -> None:
    """The log this process writes to (its stdout: a file of this user's) is readable by this user
    only."""
    import stat

    try:
        st = os.fstat(1)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
            os.fchmod(1, 0o600)
    except OSError:
        pass


def serve(idle: float, mine: str, root: str | None, command, preload: tuple[str, ...]) -> int:
    """Import `preload`, listen, and fork a process per command until `idle` seconds pass without
    one (or SIGTERM); each fork runs `command(conn, request)` (the CLI, as the client would have run
    it), which never returns."""
    global _COMMAND
    _COMMAND = command
    t0 = time.monotonic()
    _private_log()
    # what is imported already (start-up's modules) is watched as it was before anyone could hand a
    # command over; a client that finds this process starting waits for it (`handover.hand_over`)
    early = module_files()
    identity = procs.identity(os.getpid(), handover.PROGRAM)
    private.write_state(state_file(mine), {**identity, "fingerprint": mine, "starting": True})
    files = {**_preload(root, preload), **early}
    listener, path = _listen(mine)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping = []
    from flows.runtime import server

    # the project's server its commands use: when it stops, so does this process
    served = server.background_url()
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    state = {
        **identity,
        "socket": path,
        "fingerprint": mine,
        "modules": len(files),
    }
    private.write_state(state_file(mine), state)
    print(
        f"warm: {len(files)} modules imported in {time.monotonic() - t0:.1f} s; listening on "
        f"{path}",
        flush=True,
    )
    clients: dict[int, socket.socket] = {}
    me, last = os.getpid(), time.monotonic()
    try:
        while True:
            if (
                served
                and not stopping
                and (private.read_state(server.state_file()) or {}).get("url") != served
            ):
                print("warm: the Prefect server its commands use has stopped", flush=True)
                stopping.append(True)
            # no new commands; the running ones still get their status sent
            if stopping and listener.fileno() >= 0:
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
            if _reap(clients):
                last = time.monotonic()
            if (
                listener.fileno() >= 0
                and listener in ready
                and _accept(listener, clients, (wake_r, wake_w), files, mine)
            ):
                last = time.monotonic()
    finally:
        if os.getpid() == me:  # not in a fork leaving through here
            if (private.read_state(state_file(mine)) or {}).get("pid") == me:
                state_file(mine).unlink(missing_ok=True)
            Path(path).unlink(missing_ok=True)
    print(
        "warm: stopping" + (" (asked to)" if stopping else f" (no command for {idle:.0f} s)"),
        flush=True,
    )
    return 0


def _preload(root: str | None, preload: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Import what a run imports (and open the project's MLflow store); returns the imported
    modules' files."""
    import importlib

    for name in preload:
        importlib.import_module(name)
    # the project's MLflow store, opened once: its forks skip MLflow's engine and schema checks
    if root:
        from flows.plan import project
        from flows.track import tracker as tracking

        project.activate(project.Project(Path(root)))
        _preload_own_models(project.current().config_file)
        try:
            tracking.prepare()
        # a store that does not open here is opened (and reported) by the command
        except Exception as e:  # noqa: BLE001
            print(
                "warm: the MLflow store is opened by each command "
                f"({str(e).splitlines()[0][:200]})",
                flush=True,
            )
    files = module_files()
    # what was imported lives as long as this process: kept out of the collector, so that a fork's
    # collections neither walk it (about 0.3 s each, with Prefect, MLflow and pandas loaded) nor
    # copy its pages on write
    gc.collect()
    gc.freeze()
    return files


def _preload_own_models(config: Path) -> None:
    """skops, when the project's pipelines declare a team's estimator (`estimator:`): importing it
    lists every scikit-learn estimator (about 3 s), which each training and loading of such a model
    would pay otherwise."""
    import importlib

    try:
        declares = "estimator:" in config.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    if declares:
        importlib.import_module("skops.io")


def _listen(mine: str) -> tuple[socket.socket, str]:
    path = handover.socket_path(mine)  # in a folder only this user can enter (0700, checked)
    Path(path).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)  # created 0600: this user's commands only
    finally:
        os.umask(old)
    listener.listen(16)
    return listener, path


def _reap(clients: dict[int, socket.socket]) -> bool:
    """Send each ended fork's exit status to its client; whether any ended."""
    ended = False
    while clients:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if not pid:
            break
        conn = clients.pop(pid, None)
        if conn is not None:
            try:
                send(conn, {"rc": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass
            conn.close()
        ended = True
    return ended


def _accept(
    listener: socket.socket,
    clients: dict[int, socket.socket],
    wake: tuple[int, int],
    files: dict,
    mine: str,
) -> bool:
    """A client of this user: a fork runs its command (and never returns here); another user's is
    refused."""
    conn, _ = listener.accept()
    _, uid, _ = procs.peer(conn)
    if uid != os.getuid():  # the folder is private; this holds should it ever not be
        print(f"warm: refused a connection from uid {uid}", flush=True)
        conn.close()
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd in (listener, *clients.values()):
            fd.close()
        for fd in wake:
            os.close(fd)
        _run_command(conn, files, mine)
    clients[pid] = conn
    return True
