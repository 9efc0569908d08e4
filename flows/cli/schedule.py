"""`zhpipe deploy`, `serve`, `worker` and `alerts`: the Prefect side, for scheduled and remote runs
(`zhpipe server` is the runtime's: flows/runtime/commands.py)."""

from __future__ import annotations

import os
import sys

from flows.cli.common import config_file, configs, console, explicit_config, pipeline_name
from flows.needs import Needs
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
    pools = sorted(
        {r["work_pool"] for r in rows} | {r["train_pool"] for r in rows if r["train_pool"]}
    )
    out.print(
        "start a worker per pool, e.g. " + "; ".join(f"`zhpipe worker --pool {p}`" for p in pools)
    )
    return 0


def cmd_alerts(args) -> int:
    """Prefect automations that send zhpipe's events to the project's `alerts:` target; `--test`
    sends one through."""
    from flows.orchestrate.deploy import require_server
    from flows.plan.config import load_alerts
    from flows.track import alerts
    from tasks.util.urls import redact_webhook

    wanted = load_alerts(config_file(args))
    alerts.check_target(wanted)  # before a server is started for it
    if args.test:
        # a redirect is said here, not sent to again and again by Prefect
        alerts.check_answer(wanted)
    url = require_server()
    names = alerts.setup(wanted)
    target = (
        redact_webhook(wanted.webhook or wanted.slack)
        if (wanted.webhook or wanted.slack)
        else f"block {wanted.block}"
    )
    out = console()
    out.print(f"{len(names)} Prefect automations on {url} send zhpipe's events to {target}:")
    for name in names:
        out.print(f"  {name}")
    if args.test:
        from flows.plan.config import load_pipeline

        first = load_pipeline(pipeline_name(args))
        sent = alerts.emit(
            "zhpipe.alerts.test",
            first,
            {"message": f"zhpipe alerts --test: {first.name} can reach you"},
        )
        alerts.flush()
        if sent is None:
            raise ZhpipeError(
                f"alerts --test: the test event could not be sent to the Prefect server at {url}"
            )
        out.print(f"sent a zhpipe.alerts.test event; waiting for its delivery to {target} ...")
        ok, why = alerts.delivery(
            names["zhpipe: zhpipe.alerts.test"],
            str(sent.id),
            wanted.timeout_s + 30,
            wanted.webhook or wanted.slack,
        )
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
    cmd = [
        sys.executable,
        "-m",
        "prefect",
        "worker",
        "start",
        "--pool",
        args.pool,
        "--type",
        "process",
    ]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    os.execv(sys.executable, cmd)
    return 0


def add_parsers(sub) -> None:
    from pathlib import Path

    deploy = sub.add_parser(
        "deploy",
        help="create or update Prefect deployments (schedules, work pools) from pipelines.yaml",
    )
    deploy.add_argument(
        "pipelines",
        nargs="*",
        metavar="PIPELINE",
        help="pipelines to deploy (default: every one in the file)",
    )
    deploy.add_argument(
        "--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)"
    )
    deploy.set_defaults(handler=cmd_deploy, needs=Needs(space=True, server="use", prefect=True))
    alerts = sub.add_parser(
        "alerts",
        help="Prefect automations that send zhpipe's events (checks, held partitions, "
        "champion, failed runs) to the `alerts:` target of pipelines.yaml (needs a running server)",
    )
    alerts.add_argument(
        "--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)"
    )
    alerts.add_argument("--test", action="store_true", help="then send a test event through them")
    alerts.set_defaults(handler=cmd_alerts, pipeline=None, needs=Needs(space=True, server="start"))
    serve = sub.add_parser(
        "serve",
        help="run the scheduled pipelines from this process (no work pool or worker needed)",
    )
    serve.add_argument(
        "pipelines",
        nargs="*",
        metavar="PIPELINE",
        help="pipelines to serve (default: those with a schedule)",
    )
    serve.add_argument(
        "--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)"
    )
    serve.set_defaults(handler=cmd_serve, needs=Needs(space=True, server="use", prefect=True))
    worker = sub.add_parser(
        "worker", help="start a Prefect process worker on a work pool (runs deployed pipelines)"
    )
    worker.add_argument(
        "--pool", default="zhpipe", help="work pool (default zhpipe; e.g. gpu on a GPU machine)"
    )
    worker.add_argument(
        "--limit", type=int, default=None, help="at most this many flow runs at once"
    )
    worker.set_defaults(handler=cmd_worker, needs=Needs(space=True, server="use"))
