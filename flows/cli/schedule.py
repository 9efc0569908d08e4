"""`zhpipe deploy`, `serve`, `worker` and `server`: the Prefect side, for scheduled and remote runs."""
from __future__ import annotations

import os
import sys

from flows.cli.common import config_file, configs, console, explicit_config, pipeline_name
from flows.orchestrate import handover
from tasks.errors import ZhpipeError


def cmd_deploy(args) -> int:
    from rich.table import Table

    from flows.orchestrate.deploy import deploy, require_server

    chosen = configs(args, default_all=True)
    url = require_server()
    rows = deploy(chosen, config_file=explicit_config(args))
    table = Table(title=f"zhpipe deploy -> {url}")
    for col in ("deployment", "work pool", "train pool", "schedule"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["deployment"], r["work_pool"], r["train_pool"], r["schedule"])
    out = console()
    out.print(table)
    created = sorted({p for r in rows for p in r["pools_created"]})
    if created:
        out.print(f"created work pools: {', '.join(created)}")
    pools = sorted({r["work_pool"] for r in rows} | {r["train_pool"] for r in rows if r["train_pool"]})
    out.print("start a worker per pool, e.g. " + "; ".join(f"`zhpipe worker --pool {p}`" for p in pools))
    return 0


def cmd_alerts(args) -> int:
    """Prefect automations that send zhpipe's events to the project's `alerts:` target; `--test` sends one through."""
    from flows.orchestrate.deploy import require_server
    from flows.plan.config import load_alerts
    from flows.track import alerts
    from tasks.urls import redact_webhook

    wanted = load_alerts(config_file(args))
    alerts.check_target(wanted)  # before a server is started for it
    url = require_server()
    names = alerts.setup(wanted)
    target = redact_webhook(wanted.webhook or wanted.slack) if (wanted.webhook or wanted.slack) else f"block {wanted.block}"
    out = console()
    out.print(f"{len(names)} Prefect automations on {url} send zhpipe's events to {target}:")
    for name in names:
        out.print(f"  {name}")
    if args.test:
        from flows.plan.config import load_pipeline

        first = load_pipeline(pipeline_name(args))
        sent = alerts.emit("zhpipe.alerts.test", first, {"message": f"zhpipe alerts --test: {first.name} can reach you"})
        alerts.flush()
        if sent is None:
            raise ZhpipeError(f"alerts --test: the test event could not be sent to the Prefect server at {url}")
        out.print(f"sent a zhpipe.alerts.test event; waiting for its delivery to {target} ...")
        ok, why = alerts.delivery(names["zhpipe: zhpipe.alerts.test"], str(sent.id), wanted.timeout_s + 30, wanted.webhook or wanted.slack)
        if not ok:
            raise ZhpipeError(f"alerts --test: the test alert was not delivered to {target}: {why}")
        out.print(f"delivered: {target} accepted the test alert")
    return 0


def cmd_serve(args) -> int:
    from flows.orchestrate.deploy import serve

    chosen = configs(args, default_all=False)
    print(f"serving {', '.join(c.name for c in chosen)} (Ctrl-C stops)", flush=True)
    serve(chosen, config_file=explicit_config(args))
    return 0


def cmd_worker(args) -> int:
    from flows.orchestrate.deploy import require_server

    require_server()
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", args.pool, "--type", "process"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    os.execv(sys.executable, cmd)
    return 0


def cmd_server(args) -> int:
    from flows.orchestrate import server

    if args.action == "start":
        if os.environ.get("PREFECT_API_URL"):
            print(f"PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): zhpipe uses that server; unset it to use a background one")
            return 0
        already = server.running()
        print("starting a Prefect server in the background ..." if not already else "", end="", flush=True)
        state = server.start(args.port)
        print(f"{'' if already else ' '}Prefect server {'already ' if already else ''}running at {state['url']} "
              f"(UI {state['url'].removesuffix('/api')}, pid {state['pid']}, log {state['log']}); zhpipe commands use it")
        print(_ui_login())
    elif args.action == "stop":
        handover.stop()  # it runs commands against this server
        state = server.stop()
        print(f"stopped the Prefect server at {state['url']}" if state else "no background Prefect server was running")
    else:
        state = server.running()
        if state:
            print(f"running at {state['url']} (UI {state['url'].removesuffix('/api')}, pid {state['pid']})")
            print(_ui_login())
        elif os.environ.get("ZHPIPE_SERVER") == "temporary":
            print("not running: ZHPIPE_SERVER=temporary, so each command starts a temporary Prefect server")
        else:
            print("not running: the next `zhpipe run` starts it in the background (or `zhpipe server start` now)")
    return 0


def _ui_login() -> str:
    from flows.orchestrate import server

    return (f"the server asks for this project's credentials (the UI on first load): {server.credentials()} "
            f"(kept, readable by you only, in {server.state_file().with_name('zhpipe-server-auth')})")


def add_parsers(sub) -> None:
    from pathlib import Path

    deploy = sub.add_parser("deploy", help="create or update Prefect deployments (schedules, work pools) from pipelines.yaml")
    deploy.add_argument("pipelines", nargs="*", metavar="PIPELINE", help="pipelines to deploy (default: every one in the file)")
    deploy.add_argument("--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)")
    deploy.set_defaults(handler=cmd_deploy)
    alerts = sub.add_parser("alerts", help="Prefect automations that send zhpipe's events (checks, held partitions, champion, "
                            "failed runs) to the `alerts:` target of pipelines.yaml (needs a running server)")
    alerts.add_argument("--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)")
    alerts.add_argument("--test", action="store_true", help="then send a test event through them")
    alerts.set_defaults(handler=cmd_alerts, pipeline=None)
    serve = sub.add_parser("serve", help="run the scheduled pipelines from this process (no work pool or worker needed)")
    serve.add_argument("pipelines", nargs="*", metavar="PIPELINE", help="pipelines to serve (default: those with a schedule)")
    serve.add_argument("--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)")
    serve.set_defaults(handler=cmd_serve)
    worker = sub.add_parser("worker", help="start a Prefect process worker on a work pool (runs deployed pipelines)")
    worker.add_argument("--pool", default="zhpipe", help="work pool (default zhpipe; e.g. gpu on a GPU machine)")
    worker.add_argument("--limit", type=int, default=None, help="at most this many flow runs at once")
    worker.set_defaults(handler=cmd_worker)
    server = sub.add_parser("server", help="a Prefect server in the background that every zhpipe command reuses "
                            "(instead of starting a temporary one each time)")
    server.add_argument("action", choices=["start", "stop", "status"], help="start it (or show the running one), stop it, "
                        "or say whether it runs and where its UI is")
    server.add_argument("--port", type=int, help="with start: the port (default: the project's own, from 4300-4999, "
                        "or ZHPIPE_SERVER_PORT)")
    server.set_defaults(handler=cmd_server)
