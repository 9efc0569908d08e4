"""The warm process's program (`python -m flows.cli.warm`, started by flows/runtime/handover.py):
what it loads once, and what each fork runs, the CLI. flows/runtime/warm.py listens, admits a client
and forks; the runtime imports nothing of the CLI."""

from __future__ import annotations

import signal
import socket
import sys

# what a run imports: loaded once in the warm process, shared by every fork (tasks.stages: every
# kind's stage modules and their libraries, OpenCC, jieba, ...)
PRELOAD = (
    "flows.cli",
    "flows.cli.run",
    "flows.orchestrate.pipeline",
    "flows.orchestrate.execute",
    "flows.orchestrate.model_stages",
    "tasks.stages",
    "flows.track.tracker",
    "flows.track.champion",
    "flows.plan.status",
    "flows.track.serving",
    "prefect.flow_engine",
    "prefect.task_engine",
    "prefect.utilities.visualization",
    "mlflow",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "sqlalchemy.dialects.sqlite",
    "alembic.config",
    "huggingface_hub.file_download",
)


def run_as_cli(conn: socket.socket, request: dict) -> None:
    """In the fork: the command, as `zhpipe` would run it; its exit status goes to the client; never
    returns."""
    from flows import cli
    from flows.cli import ending
    from flows.runtime import handover
    from flows.track import tracker as tracking

    tracking.after_fork()
    handover.SERVING = True  # the command this fork runs is not handed over again

    # the fork tells its client itself: its status arrives even if the warm parent died
    def report(rc: int) -> None:
        # the client closes once it has the status: nothing to interrupt
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            handover.send(conn, {"rc": rc})
        except OSError:
            pass

    ending.REPORT = report

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
    ending.finish(code)  # MLflow's and Prefect's exit hooks run, as in any command


# python -m flows.cli.warm --idle S --fingerprint F (started by handover.spawn)
if __name__ == "__main__":
    import argparse

    from flows.runtime import warm

    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=float, required=True)
    ap.add_argument("--fingerprint", required=True)
    ap.add_argument(
        "--project", help="the project whose MLflow store is opened ahead of the commands"
    )
    ns = ap.parse_args()
    raise SystemExit(warm.serve(ns.idle, ns.fingerprint, ns.project, run_as_cli, PRELOAD))
