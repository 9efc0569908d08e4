"""`zhpipe server start|stop|status`: the project's background Prefect server, by hand."""

from __future__ import annotations

import os

from flows.needs import Needs
from flows.plan import private
from flows.runtime import handover, server


def cmd_server(args) -> int:
    if args.action == "start":
        if os.environ.get("PREFECT_API_URL"):
            print(
                f"PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): zhpipe uses that "
                "server; unset it to use "
                f"a background one"
            )
            return 0
        already = server.running()
        print(
            "starting a Prefect server in the background ..." if not already else "",
            end="",
            flush=True,
        )
        state = server.start(args.port)
        print(
            f"{'' if already else ' '}Prefect server {'already ' if already else ''}running at "
            f"{state['url']} "
            f"(UI {state['url'].removesuffix('/api')}, pid {state['pid']}, log {state['log']}); "
            f"zhpipe commands use it"
        )
        print(_ui_login())
    elif args.action == "stop":
        handover.stop()  # it runs commands against this server
        state = server.stop()
        print(
            f"stopped the Prefect server at {state['url']}"
            if state
            else "no background Prefect server was running"
        )
    else:
        state = server.running()
        booting = None if state else server.starting()
        if state:
            print(
                f"running at {state['url']} (UI {state['url'].removesuffix('/api')}, pid "
                f"{state['pid']})"
            )
            print(_ui_login())
        elif booting:
            print(
                f"starting at {booting['url']} (pid {booting['pid']}; `zhpipe server stop` stops "
                "it)"
            )
        elif os.environ.get("ZHPIPE_SERVER") == "temporary":
            print(
                "not running: ZHPIPE_SERVER=temporary, so each command starts a temporary Prefect "
                "server"
            )
        else:
            print(
                "not running: the next `zhpipe run` starts it in the background (or `zhpipe server "
                "start` now)"
            )
    return 0


def _ui_login() -> str:
    return (
        "the server asks for this project's credentials (the UI on first load): "
        f"{private.credentials()} "
        f"(kept, readable by you only, in {private.credentials_file()})"
    )


def add_parsers(sub) -> None:
    parser = sub.add_parser(
        "server",
        help="a Prefect server in the background that every zhpipe command reuses "
        "(instead of starting a temporary one each time)",
    )
    parser.add_argument(
        "action",
        choices=["start", "stop", "status"],
        help="start it (or show the running one), stop it, "
        "or say whether it runs and where its UI is",
    )
    parser.add_argument(
        "--port",
        type=int,
        help="with start: the port (default: the project's own, from 4300-4999, "
        "or ZHPIPE_SERVER_PORT)",
    )
    parser.set_defaults(handler=cmd_server, needs=Needs())
