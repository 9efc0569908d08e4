"""What a command's declared needs (`flows.needs.Needs`) get from the runtime, asked by the CLI's
entry point: the background Prefect server found or started, the hand-over to the warm process, the
server watched while the command runs, and a warm process left for the next command."""

from __future__ import annotations

import contextlib
import os
import sys

from flows.needs import provide_server_ready
from flows.plan import project
from flows.plan.private import PortTaken, with_login
from flows.runtime import handover, server, temporary
from tasks.errors import ZhpipeError, say


def find_server(needs) -> None:
    """A background Prefect server instead of a temporary one per command: the running one, else
    (`start`) a new one."""
    if not needs.server:
        return
    project.ensure_prefect_home()
    if (
        not server.use_running()
        and needs.server == "start"
        and not os.environ.get("PREFECT_API_URL")
    ):
        if _start_background_server():
            server.use_running()


def temporary_server(needs) -> None:
    """A command that runs flows here with no server to use: a temporary one, started now
    (flows/runtime/temporary.py), once the command was not handed to a warm process. Prefect reads
    PREFECT_API_URL once, when it is imported: a warm process's fork has it imported, and there
    Prefect starts its temporary server itself."""
    if needs.flows and not os.environ.get("PREFECT_API_URL"):
        # whoever starts it (here, or Prefect itself in a warm process's fork), it asks for the
        # project's login
        os.environ.update(with_login({}))
    if needs.flows and not os.environ.get("PREFECT_API_URL") and "prefect" not in sys.modules:
        print(
            "a temporary Prefect server starts for this run (`zhpipe server start` keeps one "
            "running)",
            flush=True,
        )
        temporary.launch()
        provide_server_ready(temporary.ready)


def _start_background_server() -> bool:
    """The first run of a project starts the project's Prefect server in the background, with an
    idle timeout, so later runs skip the 20 s start of a temporary server
    (`ZHPIPE_SERVER=temporary`: a temporary server per run, as before)."""
    if os.environ.get("ZHPIPE_SERVER", "background") == "temporary":
        return False
    idle = server.idle_timeout()
    after = f"{idle / 60:.0f} min" if idle >= 60 else f"{idle:.0f} s"
    beside = (
        ", and a warm zhpipe process beside it that skips their imports"
        if handover.enabled()
        else ""
    )
    print(
        "starting this project's Prefect server in the background (about 20 s, once; later runs "
        f"reuse it{beside}; "
        f"both stop {after} after the last zhpipe command, or with `zhpipe server stop`) ...",
        end="",
        flush=True,
    )
    try:
        state = server.start(idle=idle)
    # someone took the port as ours started: said, and the command stops (docs/background.md)
    except PortTaken:
        print(" not started", flush=True)
        raise
    except ZhpipeError as e:  # a taken port, say: this run goes on with a temporary server
        print(f" not started ({e}); using a temporary server", flush=True)
        return False
    print(
        f" running at {state['url'].removesuffix('/api')} (its UI asks for the credentials `zhpipe "
        f"server status` prints)",
        flush=True,
    )
    return True


def hand_over(needs, argv: list[str]) -> int | None:
    """The command's exit status when the project's warm process ran it (its imports done), else
    None: run it here."""
    return handover.hand_over(argv) if needs.warm else None


def watched(needs, command: str, abort):
    """The background Prefect server watched while the command runs: killed mid-way, the command
    stops within seconds with one line (`abort(3)`), instead of minutes of connection errors."""
    url = server.background_url() if needs.watched else None
    if not url:
        return contextlib.nullcontext()

    def lost(seconds: float) -> None:
        kept = f"; {needs.keeps}" if needs.keeps else ""
        say(
            "error",
            f"the Prefect server at {url.removesuffix('/api')} stopped answering ({seconds:.0f} s "
            "without an "
            f"answer): `zhpipe {command}` stops here{kept} (the next run starts a new server)",
        )
        abort(3)

    return server.watched(url, lost)


def leave_warm(needs, environ: dict[str, str]) -> None:
    """A warm process beside the background server for the next commands (it stops with the server's
    timeout)."""
    if (
        needs.leaves_warm
        and environ.get("PREFECT_API_URL")
        and os.environ.get("ZHPIPE_SERVER") != "temporary"
    ):
        handover.spawn(server.idle_timeout(), environ, project.current().root)
