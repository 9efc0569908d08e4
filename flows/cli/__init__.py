"""The `zhpipe` command line: one module per command group (run, schedule, results, store, catalog),
each adding its commands to the parser; this module parses, sets up logging, hands a command to the
warm process or runs it, and exits. Light at start: Prefect, MLflow and the stage modules are
imported by the commands that need them, after the project folder is activated."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

from flows.cli import catalog, doctor, results, run, schedule, store
from flows.cli.common import Parser, version
from flows.cli.ending import abort, finish
from flows.needs import Needs
from flows.plan import project
from flows.runtime import commands, provide
from tasks.errors import ZhpipeError, say
from tasks.util.private import owner_only
from tasks.util.urls import check_storage_url

GROUPS = (run, schedule, results, store, catalog, doctor, commands)


def _parser() -> Parser:
    parser = Parser(
        prog="zhpipe",
        description="Chinese-NLP training pipelines on Prefect and "
        "MLflow. Run inside a project folder (one with a pipelines.yaml), or pass "
        "--project.",
    )
    parser.add_argument("--version", action="version", version=f"zhpipe {version()}")
    parser.add_argument(
        "--project",
        metavar="DIR",
        help="the project folder (default: the nearest folder with a "
        "pipelines.yaml from the current one upwards, or ZHPIPE_PROJECT)",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


class _ConsoleFormatter(logging.Formatter):
    """Prefect's task-run lines ("Finished in state Completed()") name the task they are about."""

    def format(self, record: logging.LogRecord) -> str:
        task = getattr(record, "task_name", None) or getattr(record, "task_run_name", None)
        if task and record.name.startswith("prefect"):
            record = logging.makeLogRecord({**record.__dict__, "name": f"{record.name} [{task}]"})
        return super().format(record)


class _NoZhpipeTraceback(logging.Filter):
    """Prefect logs a failed task with its traceback; for the errors the command ends in one line
    that is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and (
            isinstance(error, ZhpipeError) or project.disk_full(error) or project.unreachable(error)
        ):
            record.exc_info, record.exc_text = None, None
        return True


class _FullDiskSaidOnce(logging.Filter):
    """MLflow logs each write that fails on a full disk with its traceback (33 of them in one run,
    929 lines before the command's one line). Those records are dropped: the command ends in one
    line naming the full disk."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (
            (error is not None and project.disk_full(error))
            or "database or disk is full" in str(record.msg)
        )


def _quiet_prefect_tracebacks() -> None:
    # logger-level filters see every record those loggers create, whatever handlers Prefect installs
    # later
    for name in (
        "prefect.flow_runs",
        "prefect.task_runs",
        "prefect.flow_engine",
        "prefect.task_engine",
    ):
        logging.getLogger(name).addFilter(_NoZhpipeTraceback())
    for name in (
        "mlflow.store.db.utils",
        "mlflow.tracking",
        "mlflow.store.tracking.sqlalchemy_store",
    ):
        logging.getLogger(name).addFilter(_FullDiskSaidOnce())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # whatever it creates (a new project with `init` too) is 0600/0700, whatever the shell's umask
    owner_only()
    # `zhpipe run --debug` as well as `zhpipe --debug run`
    if "--debug" in argv[1:] and "--" not in argv:
        argv = ["--debug", *[a for a in argv if a != "--debug"]]
    args = _parser().parse_args(argv)
    needs = getattr(args, "needs", Needs()).of(args)  # what the command declared with its parser
    try:
        if needs.project:
            project.activate(project.find(args.project))
        if needs.space:
            project.check_space()
            project.check_writable()
        # before the URL is shown anywhere
        check_storage_url(getattr(args, "storage", None), "--storage")
        check_storage_url(os.environ.get("ZHPIPE_STORAGE"), "ZHPIPE_STORAGE")
        provide.find_server(needs)
    except ZhpipeError as e:
        say("error", str(e))
        return 2
    # MLflow sets its own loggers' level when it is imported (later, lazily): tell it up front
    if not args.debug:
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    handed_env = dict(os.environ)
    # the warm process runs it, imports done
    code = None if args.debug else provide.hand_over(needs, argv)
    if code is not None:
        return code
    try:
        # runs flows here, with no server to use: one starts now, beside the imports
        provide.temporary_server(needs)
    except (ZhpipeError, OSError) as e:
        say("error", project.disk_full(e) or f"the temporary Prefect server could not start: {e}")
        return 2
    _setup_logging(args, needs)
    return _run(args, needs, handed_env)


def _setup_logging(args, needs: Needs) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S"
    )
    for handler in logging.getLogger().handlers:
        handler.setFormatter(
            _ConsoleFormatter("%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
        )
    # their INFO lines are noise here
    for noisy in ("httpx", "alembic", "mlflow", "gensim", "smart_open", "distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Prefect's queues say they still drain at exit: after the last line
    for draining in ("EventsWorker", "APILogWorker"):
        logging.getLogger(draining).setLevel(logging.ERROR)
    if not args.debug and needs.prefect:
        # configures Prefect's loggers, which the filter then attaches to
        import prefect  # noqa: F401

        _quiet_prefect_tracebacks()


def _run(args, needs: Needs, handed_env: dict[str, str]) -> int:
    """The command itself, the background server watched where it asked; then a warm process left
    for the next."""
    try:
        with provide.watched(needs, args.command, abort):
            code = args.handler(args)
        provide.leave_warm(needs, handed_env)  # the next runs skip the imports
        return code
    except ZhpipeError as e:
        if args.debug:
            raise
        say("error", str(e))
        return 2
    # a full disk or a service that did not answer is one line; anything else is raised
    except Exception as e:  # noqa: BLE001
        full = project.disk_full(e) or project.unreachable(e)
        if full is None or args.debug:
            raise
        say("error", full)
        return 2
    except KeyboardInterrupt:
        say("interrupted", needs.keeps)
        return 130


def entry() -> NoReturn:
    """The `zhpipe` command."""
    finish(main())
