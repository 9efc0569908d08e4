"""The `zhpipe` command line: run, stages, status, pipelines, ui."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from flows.config import DEFAULT_CONFIG, DEFAULT_PIPELINE, load_pipeline, list_pipelines
from flows.errors import ZhpipeError
from flows.runner import STAGES

STAGE_HELP = {
    "download": "find or fetch the corpus (path, file:// or http(s):// URL), verify sha256, read it",
    "clean": "NFKC, strip HTML/URLs/control chars, optional t2s; quarantine empty/short/long/duplicate rows",
    "split": "stratified, seeded train/validation/test split",
    "segment": "jieba words (+POS) and characters, in parallel processes",
    "augment": "grow the train split with a registered augmenter (EDA in v1)",
    "vocab": "word and character vocab.txt (BERT-style specials) + frequency tables; validation OOV rate",
    "embed": "gensim Word2Vec and fastText subword vectors; nearest neighbours of probe words",
    "train": "fastText supervised classifier and TextCNN from Word2Vec vectors, early stopping",
    "evaluate": "test accuracy, macro-F1, per-class P/R/F1, confusion matrices, comparison table",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zhpipe", description="Chinese-NLP training pipeline on Prefect and MLflow.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    def pipeline_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("pipeline", nargs="?", default=DEFAULT_PIPELINE, help=f"pipeline name (default {DEFAULT_PIPELINE})")
        p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="pipelines file (default pipelines.yaml)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="STAGE.PARAM=VALUE",
                       help="override one parameter for this run (repeatable)")
        p.add_argument("--source", help="run on another corpus: a path or URL")
        p.add_argument("--text-column", default="text", help="with --source: the text column (default text)")
        p.add_argument("--label-column", default="label", help="with --source: the label column (default label)")

    run = sub.add_parser("run", help="run a pipeline (cached stages are reused)")
    pipeline_args(run)
    run.add_argument("--from", dest="start", choices=list(STAGES), help="first stage to run")
    run.add_argument("--to", dest="stop", choices=list(STAGES), help="last stage to run")
    run.add_argument("--only", choices=list(STAGES), help="run just this stage (its inputs must be cached)")
    run.add_argument("--force", nargs="?", const="", choices=["", *STAGES], metavar="STAGE",
                     help="rebuild STAGE and every later stage even if cached (all stages without STAGE)")
    status = sub.add_parser("status", help="show each stage as cached, stale or missing")
    pipeline_args(status)
    sub.add_parser("stages", help="list the stages")
    sub.add_parser("pipelines", help="list the pipelines in pipelines.yaml").add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ui = sub.add_parser("ui", help="start the MLflow UI on the project's tracking store")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1")
    return parser


def _load(args):
    source = None
    if args.source:
        source = {"path": args.source, "text_column": args.text_column, "label_column": args.label_column or None}
    return load_pipeline(args.pipeline, args.config, args.overrides, source)


def cmd_run(args) -> int:
    from rich.console import Console

    from flows.pipeline import pipeline_flow, select_stages

    config = _load(args)
    stages = select_stages(args.start, args.stop, args.only)
    force = None if args.force is None else ([args.force] if args.force else [])
    t0 = time.perf_counter()
    out = pipeline_flow(config, stages=stages, force=force)
    console = Console()
    console.print(summary_table(out["stages"], time.perf_counter() - t0, config.name))
    console.print(f"MLflow: experiment [bold]{out['experiment']}[/], parent run {out['parent_run_id']}  (see it with `zhpipe ui`)")
    return 0


def summary_table(rows: list[dict], wall: float, name: str):
    """The end-of-run table: stage, cache, seconds, rows, headline metric."""
    from rich.table import Table

    table = Table(title=f"zhpipe run {name}: {wall:.1f} s wall")
    for col in ("stage", "cache", "seconds", "rows", "metric"):
        table.add_column(col, justify="right" if col in ("seconds", "rows") else "left")
    for r in rows:
        value = r["metrics"].get(r["headline"])
        metric = f"{r['headline']}={value:.4g}" if value is not None else ""
        table.add_row(r["stage"], "[green]hit[/]" if r["cache"] == "hit" else "[yellow]miss[/]",
                      f"{r['seconds']:.1f}", str(r["rows"] if r["rows"] is not None else ""), metric)
    return table


def cmd_status(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from flows.pipeline import DATA_ROOT
    from flows.runner import plan_keys
    from flows.store import StageStore

    config = _load(args)
    store, keys = StageStore(DATA_ROOT), plan_keys(config)
    table = Table(title=f"zhpipe status {config.name}")
    for col in ("stage", "state", "key", "rows", "built seconds"):
        table.add_column(col)
    for stage, key in keys.items():
        if store.is_done(stage, key):
            m = store.manifest(stage, key)
            table.add_row(stage, "[green]cached[/]", key, str(m.rows), f"{m.seconds:.1f}")
        else:
            state = "[yellow]stale[/]" if store.others(stage, key) else "[red]missing[/]"
            table.add_row(stage, state, key, "", "")
    Console().print(table)
    return 0


def cmd_stages(args) -> int:
    for stage, deps in STAGES.items():
        print(f"{stage:<9} <- {', '.join(deps) or 'source':<28} {STAGE_HELP[stage]}")
    return 0


def cmd_pipelines(args) -> int:
    for name, description in list_pipelines(args.config).items():
        print(f"{name:<20} {description}")
    return 0


def cmd_ui(args) -> int:
    from flows.tracking import tracking_uri

    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri(), "--host", args.host, "--port", str(args.port)]
    print(f"MLflow UI on http://{args.host}:{args.port} (store {tracking_uri()})", flush=True)
    os.execv(sys.executable, cmd)
    return 0


class _NoZhpipeTraceback(logging.Filter):
    """Prefect logs a failed task with its traceback; for our own one-line errors that is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ZhpipeError):
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_prefect_tracebacks() -> None:
    # logger-level filters see every record those loggers create, whatever handlers Prefect installs later
    for name in ("prefect.flow_runs", "prefect.task_runs", "prefect.flow_engine", "prefect.task_engine"):
        logging.getLogger(name).addFilter(_NoZhpipeTraceback())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "alembic", "mlflow.store.db.utils", "gensim", "smart_open"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.debug:
        import prefect  # noqa: F401 - configures Prefect's loggers, which the filter then attaches to

        _quiet_prefect_tracebacks()
    commands = {"run": cmd_run, "status": cmd_status, "stages": cmd_stages, "pipelines": cmd_pipelines, "ui": cmd_ui}
    try:
        return commands[args.command](args)
    except ZhpipeError as e:
        if args.debug:
            raise
        print(f"zhpipe: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zhpipe: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
