"""The `zhpipe` command line. Light at start: Prefect, MLflow and the stage modules are imported by the
commands that need them, after the project folder is activated."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable, NoReturn

from flows import handover, project
from tasks.errors import ZhpipeError, say
from tasks.stages import KINDS, STAGE_NAMES  # the stage graph, declared once; it imports nothing heavy


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zhpipe")
    except PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zhpipe", description="Chinese-NLP training pipelines on Prefect and MLflow. "
                                     "Run inside a project folder (one with a pipelines.yaml), or pass --project.")
    parser.add_argument("--version", action="version", version=f"zhpipe {_version()}")
    parser.add_argument("--project", metavar="DIR", help="the project folder (default: the nearest folder with a pipelines.yaml "
                        "from the current one upwards, or ZHPIPE_PROJECT)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    def pipeline_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("pipeline", nargs="?", help="pipeline name (default: the first in pipelines.yaml)")
        p.add_argument("--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="STAGE.PARAM=VALUE",
                       help="override one parameter for this run (repeatable)")
        p.add_argument("--source", help="run on another corpus: a path or URL")
        p.add_argument("--text-column", help="with --source: the text column (default: the pipeline's source.text_column)")
        p.add_argument("--label-column", help="with --source: the label column (default: the pipeline's source.label_column)")
        p.add_argument("--allow-unverified", action="store_true", help="fetch an http(s) source without a sha256, keyed by the "
                       "server's ETag/Last-Modified/size (re-checked on every run)")

    def storage_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--storage", metavar="URL", help="stage store root: a folder or an fsspec URL such as s3://bucket/zhpipe "
                       "(default: ZHPIPE_STORAGE, else the pipeline's `storage`, else the project's data/)")

    run = sub.add_parser("run", help="run a pipeline (cached stages are reused)")
    pipeline_args(run)
    storage_arg(run)
    run.add_argument("--dask", metavar="ADDRESS", help="run the chunked stages (clean, segment, augment) on Dask: "
                     "`local` for a local cluster, or a scheduler address such as tcp://10.0.0.5:8786")
    run.add_argument("--from", dest="start", choices=STAGE_NAMES, help="first stage to run")
    run.add_argument("--to", dest="stop", choices=STAGE_NAMES, help="last stage to run")
    run.add_argument("--only", choices=STAGE_NAMES, help="run just this stage (its inputs must be cached)")
    run.add_argument("--force", nargs="?", const="", choices=["", *STAGE_NAMES], metavar="STAGE",
                     help="rebuild STAGE and every later stage even if cached (all stages without STAGE)")
    run.add_argument("--verify", action="store_true", help="hash every file of a reused output against its manifest "
                     "(file sizes, and files up to 8 MB, are always checked)")
    status = sub.add_parser("status", help="show each stage as cached, stale or missing")
    pipeline_args(status)
    storage_arg(status)
    deploy = sub.add_parser("deploy", help="create or update Prefect deployments (schedules, work pools) from pipelines.yaml")
    deploy.add_argument("pipelines", nargs="*", metavar="PIPELINE", help="pipelines to deploy (default: every one in the file)")
    deploy.add_argument("--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)")
    serve = sub.add_parser("serve", help="run the scheduled pipelines from this process (no work pool or worker needed)")
    serve.add_argument("pipelines", nargs="*", metavar="PIPELINE", help="pipelines to serve (default: those with a schedule)")
    serve.add_argument("--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)")
    worker = sub.add_parser("worker", help="start a Prefect process worker on a work pool (runs deployed pipelines)")
    worker.add_argument("--pool", default="zhpipe", help="work pool (default zhpipe; e.g. gpu on a GPU machine)")
    worker.add_argument("--limit", type=int, default=None, help="at most this many flow runs at once")
    verify = sub.add_parser("verify", help="check every output in the stage store against its manifest (sizes and sha256)")
    storage_arg(verify)
    gc = sub.add_parser("gc", help="remove outputs no pipeline in pipelines.yaml uses, and leftovers of killed builds")
    storage_arg(gc)
    gc.add_argument("--dry-run", action="store_true", help="show what would be removed, remove nothing")
    gc.add_argument("--forget", action="append", default=[], metavar="NAME",
                    help="no longer keep what the run on another corpus NAME built (`zhpipe run --source`; repeatable)")
    sub.add_parser("stages", help="list the stages, what each reads and does")
    sub.add_parser("models", help="list the registered models (names for train.models)")
    sub.add_parser("pipelines", help="list the pipelines in pipelines.yaml").add_argument("--config", type=Path, help="pipelines file")
    init = sub.add_parser("init", help="write a starter project (pipelines.yaml for your CSV) into DIR")
    init.add_argument("dir", nargs="?", default=".", help="the project folder (default: the current one)")
    init.add_argument("--csv", help="your corpus: a CSV file with a text and a label column (default: a 12-row example)")
    init.add_argument("--text-column", default="text", help="the CSV's text column (default text)")
    init.add_argument("--label-column", default="label", help="the CSV's label column (default label)")
    init.add_argument("--link", action="store_true", help="link the CSV into data/raw/ instead of copying it (its sha256 is pinned either way)")
    tune = sub.add_parser("tune", help="an Optuna study of one model's settings (TPE, pruning, resumable; nested MLflow runs)")
    pipeline_args(tune)
    storage_arg(tune)
    tune.add_argument("--model", required=True, help="the model of train.models to tune")
    tune.add_argument("--trials", type=int, default=20, help="trials to add to the study (default 20)")
    tune.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    runs = sub.add_parser("runs", help="list recent pipeline runs (date, commit, source, best model, metrics)")
    runs.add_argument("pipeline", nargs="?", help="one pipeline (default: all)")
    runs.add_argument("--limit", type=int, default=20, help="at most this many runs, newest first (default 20)")
    compare = sub.add_parser("compare", help="side-by-side table of the parameters and metrics that differ between runs")
    compare.add_argument("runs", nargs="+", metavar="RUN", help="run ids or prefixes (as `zhpipe runs` prints them)")
    compare.add_argument("--all", action="store_true", help="every parameter and metric, not only those that differ")
    predict = sub.add_parser("predict", help="label raw texts with a registered model (default: the pipeline's champion)")
    predict.add_argument("texts", nargs="*", metavar="TEXT", help="texts to label (raw text, cleaned and segmented as the model's pipeline does)")
    predict.add_argument("--model", help="an MLflow model URI (default models:/zhpipe-<pipeline>@champion)")
    predict.add_argument("--pipeline", help="whose champion to use (default: the first pipeline in pipelines.yaml)")
    predict.add_argument("--input", type=Path, help="a .csv, .tsv, .jsonl or .parquet file of texts")
    predict.add_argument("--output", type=Path, help="where to write the input rows with label and probabilities (same formats)")
    predict.add_argument("--text-column", default="text", help="with --input: the text column (default text)")
    predict.add_argument("--jsonl", action="store_true", help="print one JSON object per text instead of a table")
    predict.add_argument("--dask", metavar="ADDRESS", help="with --input: predict in chunks on Dask (`local` or a scheduler address)")
    server = sub.add_parser("server", help="a Prefect server in the background that every zhpipe command reuses "
                            "(instead of starting a temporary one each time)")
    server.add_argument("action", choices=["start", "stop", "status"], help="start it (or show the running one), stop it, "
                        "or say whether it runs and where its UI is")
    server.add_argument("--port", type=int, help="with start: the port (default: the project's own, from 4300-4999, "
                        "or ZHPIPE_SERVER_PORT)")
    ui = sub.add_parser("ui", help="start the MLflow UI on the project's tracking store")
    ui.add_argument("--port", type=int, default=5000, help="the port to serve on (default 5000)")
    ui.add_argument("--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1: this machine only)")
    return parser


def _source(args) -> dict | None:
    if not args.source:
        return None
    # columns not given are the pipeline's own (None: kept from its source)
    return {"path": args.source, "text_column": args.text_column, "label_column": args.label_column}


def _config_file(args) -> Path:
    return getattr(args, "config", None) or project.current().config_file


def _explicit_config(args) -> str | None:
    """A --config file other than the project's, as deployments and flows receive it (None for the default)."""
    return str(args.config.resolve()) if args.config else None


def _load(args):
    from flows.config import load_pipeline

    overrides = list(args.overrides) + (["source.allow_unverified=true"] if args.allow_unverified else [])
    return load_pipeline(_pipeline_name(args), _config_file(args), overrides, _source(args))


def _pipeline_name(args) -> str:
    """The pipeline named on the command line, else the first one in the file."""
    from flows.config import list_pipelines

    name = getattr(args, "pipeline", None)
    if name:
        return name
    names = list(list_pipelines(_config_file(args)))
    if not names:
        raise ZhpipeError(f"{_config_file(args)}: no pipelines declared")
    return names[0]


def cmd_run(args) -> int:
    from flows.pipeline import pipeline_flow, select_stages
    from tasks.urls import conceal, redact_text

    config = _load(args)
    stages = select_stages(args.start, args.stop, args.only, tuple(config.kind.stages))
    force = None if args.force is None else ([args.force] if args.force else [])
    t0 = time.perf_counter()
    if not os.environ.get("PREFECT_API_URL"):  # no background server (`ZHPIPE_SERVER=temporary`, or it could not start)
        print("starting a temporary Prefect server for this run (about 20 s; `zhpipe server start` keeps one running)", flush=True)
    # what the flow run records in Prefect: URLs redacted (the config already holds the redacted forms)
    with _heartbeats(), _server_watched():
        out = pipeline_flow(config.name, stages=stages, force=force, storage=conceal(args.storage), dask=args.dask, verify=args.verify,
                            overrides=[redact_text(o) for o in args.overrides], config_file=_explicit_config(args),
                            source=config.source.model_dump(exclude_defaults=True) if args.source else None)
    console = _console()
    console.print(summary_table(out["stages"], time.perf_counter() - t0, config.name, out.get("units", [])))
    console.print(f"MLflow: experiment [bold]{out['experiment']}[/], parent run {out['parent_run_id']}  (see it with `zhpipe ui`)")
    return 0


def _server_watched():
    """The background Prefect server watched while the run goes on: killed mid-run, the run stops within seconds with
    one line, instead of minutes of connection errors (what it built is in the store; the next run reuses it)."""
    import contextlib

    from flows import server

    url = server.background_url()
    if not url:
        return contextlib.nullcontext()

    def lost(seconds: float) -> None:
        say("error", f"the Prefect server at {url.removesuffix('/api')} stopped answering ({seconds:.0f} s without an "
            "answer): the run stops here; the stages it finished are in the store, and the next `zhpipe run` reuses them "
            "(it starts a new server)")
        abort(3)

    return server.watched(url, lost)


def _console():
    """A rich console; piped or logged (a cron job's file), one wide enough that no table cell is cut or wrapped."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=10_000)


def _heartbeats():
    """A run started from the command line sends no flow-run heartbeats unless PREFECT_FLOWS_HEARTBEAT_FREQUENCY is
    set: their only use is a zombie-run automation on the server, and stopping Prefect's heartbeat thread holds
    every run up to a second at its end. Deployment runs (workers, `zhpipe serve`) keep Prefect's default."""
    import contextlib

    if any(k in os.environ for k in ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")):
        return contextlib.nullcontext()
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def summary_table(rows: list[dict], wall: float, name: str, units: list[dict] = ()):
    """The end-of-run table: stage, cache, seconds, rows, headline metric; each model unit under its stage."""
    from rich.table import Table

    table = Table(title=f"zhpipe run {name}: {wall:.1f} s wall")
    for col in ("stage", "cache", "seconds", "rows", "metric"):
        table.add_column(col, justify="right" if col in ("seconds", "rows") else "left")
    for r in rows:
        value = r["metrics"].get(r["headline"])
        metric = f"{r['headline']}={_number(value)}" if value is not None else ""
        table.add_row(r["stage"], "[green]hit[/]" if r["cache"] == "hit" else "[yellow]miss[/]",
                      f"{r['seconds']:.1f}", str(r["rows"] if r["rows"] is not None else ""), metric)
        partitions = [u for u in units if u["stage"].startswith(r["stage"] + ":")]
        if partitions:  # a partitioned source: one line for all of a stage's partitions
            built = [u for u in partitions if u["cache"] == "miss"]
            table.add_row(f"  {len(partitions)} partitions", f"{len(partitions) - len(built)} hit, {len(built)} built",
                          f"{sum(u['seconds'] for u in built):.1f}", str(sum(u["rows"] or 0 for u in built)), "rows built")
        for u in (u for u in units if u["stage"].startswith(r["stage"] + ".")):
            key = _unit_metric(u["metrics"], r["headline"])
            table.add_row(f"  {u['stage'].partition('.')[2]}", "[green]hit[/]" if u["cache"] == "hit" else "[yellow]miss[/]",
                          f"{u['seconds']:.1f}", "", f"{key}={_number(u['metrics'][key])}" if key else "")
    return table


def _unit_metric(metrics: dict, headline: str | None) -> str | None:
    """A model unit's metric for the summary, whatever the task kind: its stage's headline without `best_` (each
    model's test F1, BLEU or accuracy), else a validation or test metric it has."""
    preferred = ([headline.removeprefix("best_")] if headline else []) + ["val_macro_f1_best", "test_accuracy",
                                                                         "val_perplexity_best", "test_perplexity"]
    return next((k for k in preferred if k in metrics), None) or next((k for k in sorted(metrics) if k.startswith(("test_", "val_"))), None)


def _number(value: float) -> str:
    """A metric as people read it: whole numbers with thousands separators, others to 4 significant digits."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:.4g}"


def cmd_status(args) -> int:
    from rich.table import Table

    from flows.runner import plan
    from flows.status import stage_states
    from flows.store import StageStore, stage_key, storage_root

    config = _load(args)
    causes = plan(config)
    keys = {stage: stage_key(c) for stage, c in causes.items()}
    table = Table(title=f"zhpipe status {config.name}")
    for col in ("stage", "state", "key", "rows", "built seconds", "why"):
        table.add_column(col)
    colour = {"cached": "green", "stale": "yellow", "missing": "red", "corrupt": "red"}
    rows = stage_states(StageStore(storage_root(config, args.storage)), causes, keys, config.name)
    parts: dict[str, list[dict]] = {}
    for row in rows:  # a partitioned source: its partition units, one line per stage
        if ":" in row["stage"]:
            parts.setdefault(row["stage"].split(":", 1)[0], []).append(row)
    for row in (r for r in rows if ":" not in r["stage"]):
        table.add_row(row["stage"], f"[{colour[row['state']]}]{row['state']}[/]", row["key"],
                      "" if row["rows"] is None else str(row["rows"]),
                      "" if row["seconds"] is None else f"{row['seconds']:.1f}", "\n".join(row["why"]))
        if row["stage"] in parts:
            units = parts[row["stage"]]
            new = [u["stage"].split(":", 1)[1] for u in units if u["state"] != "cached"]
            table.add_row(f"  {len(units)} partitions", f"{len(units) - len(new)} cached, {len(new)} to build", "",
                          str(sum(u["rows"] or 0 for u in units)), "",
                          ("to build: " + ", ".join(new[:3]) + (f" and {len(new) - 3} more" if len(new) > 3 else "")) if new else "")
    _console().print(table)
    return 0


def _configs(args, default_all: bool) -> list:
    from flows.config import list_pipelines, load_pipeline

    file = _config_file(args)
    configs = [load_pipeline(n, file) for n in (args.pipelines or list_pipelines(file))]
    if not args.pipelines and not default_all:
        configs = [c for c in configs if c.schedule is not None]
    if not configs:
        raise ZhpipeError(f"{file}: no pipeline has a `schedule`; name the pipelines to serve")
    return configs


def cmd_deploy(args) -> int:
    from rich.table import Table

    from flows.deploy import deploy, require_server

    configs = _configs(args, default_all=True)
    url = require_server()
    rows = deploy(configs, config_file=_explicit_config(args))
    table = Table(title=f"zhpipe deploy -> {url}")
    for col in ("deployment", "work pool", "train pool", "schedule"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["deployment"], r["work_pool"], r["train_pool"], r["schedule"])
    console = _console()
    console.print(table)
    created = sorted({p for r in rows for p in r["pools_created"]})
    if created:
        console.print(f"created work pools: {', '.join(created)}")
    pools = sorted({r["work_pool"] for r in rows} | {r["train_pool"] for r in rows if r["train_pool"]})
    console.print("start a worker per pool, e.g. " + "; ".join(f"`zhpipe worker --pool {p}`" for p in pools))
    return 0


def cmd_serve(args) -> int:
    from flows.deploy import serve

    configs = _configs(args, default_all=False)
    print(f"serving {', '.join(c.name for c in configs)} (Ctrl-C stops)", flush=True)
    serve(configs, config_file=_explicit_config(args))
    return 0


def cmd_worker(args) -> int:
    from flows.deploy import require_server

    require_server()
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", args.pool, "--type", "process"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    os.execv(sys.executable, cmd)
    return 0


def _print_frame(df, title: str, no_wrap: tuple[str, ...] = ()) -> None:
    from rich.table import Table

    table = Table(title=title)
    for col in df.columns:
        table.add_column(str(col), justify="right" if df[col].dtype.kind in "if" else "left", no_wrap=col in no_wrap)
    for row in df.itertuples(index=False):
        table.add_row(*["" if v is None or (isinstance(v, float) and v != v) else f"{v:.4f}" if isinstance(v, float) else str(v) for v in row])
    _console().print(table)


def cmd_tune(args) -> int:
    from flows.tune import tune

    if args.source:
        raise ZhpipeError("tune: tune on the corpus a pipeline declares (add a pipeline for another corpus to pipelines.yaml)")
    if args.trials < 1:
        raise ZhpipeError(f"tune: --trials must be at least 1, got {args.trials}")
    result = tune(_pipeline_name(args), args.model, args.trials, args.overrides, args.seed, args.storage)
    print(f"best of {result['complete']} complete trials ({result['trials']} in the study): {result['metric']} "
          f"{result['value']:.4f} (trial {result['trial']}); MLflow tune run {result['run_id']}")
    print("as --set lines:  " + " ".join(f"--set {s}" for s in result["sets"]))
    print(f"as YAML (also in {result['file']}):\n{result['yaml']}", end="")
    return 0


def cmd_runs(args) -> int:
    from flows.runs import pipeline_runs, runs_table

    df = runs_table(pipeline_runs(args.pipeline, args.limit))
    if df.empty:
        print("no pipeline runs yet; `zhpipe run` makes one")
        return 0
    # the run's name holds its pipeline, its overrides and its time: the columns that repeat it are left out here
    shown = df.drop(columns=[c for c in ("pipeline", "overrides", "started") if c in df])
    _print_frame(shown, f"zhpipe runs{' ' + args.pipeline if args.pipeline else ''} (newest first)", no_wrap=("name",))
    return 0


def cmd_compare(args) -> int:
    from flows.runs import compare_table

    if len(args.runs) < 2:
        raise ZhpipeError("compare needs at least two runs")
    _print_frame(compare_table(args.runs, args.all), "zhpipe compare" + ("" if args.all else " (rows that differ, and the headline metrics)"))
    return 0


def cmd_predict(args) -> int:
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from flows.runs import load_model, model_version, predict_frame, read_input, with_predictions, write_table

    if bool(args.texts) == bool(args.input):
        raise ZhpipeError("predict: give TEXT arguments or --input FILE (not both)")
    if args.input and not args.output:
        raise ZhpipeError("predict: --input needs --output FILE")
    if args.output:
        from flows.runs import READERS

        if args.output.suffix.lower() not in READERS:  # before loading a model and predicting, not after
            raise ZhpipeError(f"--output {args.output}: unknown file type '{args.output.suffix}' (expected .csv, .tsv, .jsonl or .parquet)")
    df = read_input(args.input, args.text_column) if args.input else pd.DataFrame({"text": args.texts})
    uri = args.model or f"models:/zhpipe-{_pipeline_name(args)}@champion"
    from flows.tracking import tracking_uri

    store = tracking_uri().removeprefix("sqlite:///") if tracking_uri().startswith("sqlite:///") else None
    if uri.startswith("models:/") and store and not Path(store).is_file():  # nothing to load, and nothing to create
        raise ZhpipeError(f"no models yet: {store} does not exist; run a pipeline first (`zhpipe run`) or pass --model DIR")
    column = args.text_column if args.input else "text"
    model = load_model(uri)  # fail here, once, with one line
    used = model_version(uri)
    shown = f"{used['model']} version {used['version']}" if used["version"] else used["model"]
    try:
        if args.dask:
            from prefect import flow

            from flows.runs import predict_distributed

            @flow(name="zhpipe-predict", log_prints=True)
            def predict_flow():  # the chunk task runs are grouped under one flow run in the Prefect UI
                return predict_distributed(uri, df, column, args.dask)

            out = predict_flow()
        else:
            out = predict_frame(model, df, column)
    except MlflowException as e:
        raise ZhpipeError(f"predict: {e.message.removeprefix('zhpipe: ')}") from None
    out = with_predictions(df, out, used)
    statuses = out["pred_status"].value_counts().to_dict()
    tagger, translator = "pred_entities" in out, "pred_translation" in out
    if args.output:
        write_table(out, args.output)
        found = (f"entities: {int(out['pred_count'].sum())}" if tagger else f"translations: {int(out['pred_translation'].notna().sum())}"
                 if translator else f"labels: {out['pred_label'].value_counts().to_dict()}")
        print(f"{len(out)} rows -> {args.output} ({found}; status: {statuses}; model {shown}, {uri})")
    elif args.jsonl:
        import json

        for row in out.itertuples(index=False):
            record = {"text": row.text, "status": row.pred_status}
            record |= ({"entities": json.loads(row.pred_entities)} if tagger else {"translation": row.pred_translation} if translator
                       else {"label": row.pred_label, "probability": row.pred_probability})
            print(json.dumps(record, ensure_ascii=False, default=float))
    elif translator:
        _print_frame(out[["text", "pred_translation", "pred_status"]], f"zhpipe predict: model {shown} ({uri})")
    elif tagger:
        from flows.runs import entities_text

        _print_frame(out.assign(pred_entities=out["pred_entities"].map(entities_text))[["text", "pred_entities", "pred_status"]],
                     f"zhpipe predict: model {shown} ({uri})")
    else:
        _print_frame(out[["text", "pred_label", "pred_probability", "pred_status"]], f"zhpipe predict: model {shown} ({uri})")
    return 0


def _store(args):
    from flows.config import list_pipelines, load_pipeline
    from flows.store import StageStore, storage_root

    first = load_pipeline(next(iter(list_pipelines(project.current().config_file))))
    return StageStore(storage_root(first, args.storage))


def cmd_verify(args) -> int:
    from flows.maintenance import verify_store

    store = _store(args)
    rows = verify_store(store)
    bad = [r for r in rows if r["problems"]]
    for r in bad:
        print(f"{r['stage']}/{r['key']}: " + "; ".join(r["problems"][:3]))
    print(f"{len(rows)} outputs checked in {store.url}: {len(rows) - len(bad)} sound, {len(bad)} corrupt"
          + (" (`zhpipe run` rebuilds them; `zhpipe gc` removes what no pipeline uses)" if bad else ""))
    return 1 if bad else 0


def _source_paths(config) -> list:
    """The local files and folders a pipeline reads its corpus from (gc never removes them)."""
    from flows.runner import resolve_local

    parts = [config.source, *config.source.given().values()]
    return [p for p in (resolve_local(src.path) for src in parts if src.path) if p is not None]


def cmd_gc(args) -> int:
    from flows.config import list_pipelines, load_pipeline
    from flows.maintenance import collect_garbage
    from flows.runner import plan_keys, resolve_local, source_run_record, source_run_records

    file = project.current().config_file
    configs = [load_pipeline(name, file) for name in list_pipelines(file)]
    from flows.store import unit_folder

    keep = {(unit_folder(unit), key) for config in configs for unit, key in plan_keys(config).items()}
    sources = tuple(path for config in configs for path in _source_paths(config))
    records = source_run_records()
    for name in args.forget:
        if name not in records:
            raise ZhpipeError(f"gc --forget {name}: no run on another corpus of that name (kept: {', '.join(records) or 'none'})")
        if not args.dry_run:
            source_run_record(name).unlink()
        del records[name]
    for name, record in records.items():  # runs on other corpora (`--source`): kept until forgotten
        keep |= {(unit_folder(unit), key) for unit, key in record.get("keys", {}).items()}
        sources += tuple(p for p in [resolve_local(str(record["source"]))] if p is not None) if record.get("source") else ()
        print(f"keeping what `{name}` built (zhpipe run --source {record.get('source')}); `zhpipe gc --forget {name}` releases it")
    store = _store(args)
    removed = collect_garbage(store, keep, dry_run=args.dry_run, protect=(project.current().root / "data" / "raw", *sources))
    for item in removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {item['path']} ({item['mb']:.1f} MB, {item['why']})")
    total = sum(i["mb"] for i in removed)
    print(f"{len(removed)} items, {total:.1f} MB {'would be freed' if args.dry_run else 'freed'} in {store.url}")
    return 0


def cmd_stages(args) -> int:
    for kind in KINDS.values():
        print(f"task {kind.name} ({kind.about}):")
        for stage in kind.stages.values():
            units = " (a unit per model)" if stage.per_model else ""
            print(f"  {stage.name:<9} <- {', '.join(stage.needs) or 'source':<30} {stage.help}{units}")
    return 0


def cmd_models(args) -> int:
    from tasks.models import MODELS

    for name, spec in MODELS.items():
        kind = "language model" if spec.is_language_model else f"{KINDS[spec.task].flavour} ({spec.task})"
        print(f"{name:<14} {kind:<15} {spec.about}")
    return 0


def cmd_pipelines(args) -> int:
    from flows.config import list_pipelines

    for name, description in list_pipelines(_config_file(args)).items():
        print(f"{name:<20} {description}")
    return 0


def cmd_init(args) -> int:
    from flows.init import init_project

    written = init_project(Path(args.dir), Path(args.csv) if args.csv else None, args.text_column, args.label_column, args.link)
    for path in written:
        print(f"wrote {path}")
    print(f"next: cd {args.dir} && zhpipe run")
    return 0


def cmd_ui(args) -> int:
    import subprocess
    import urllib.request
    from importlib.metadata import entry_points

    from flows.tracking import home_url, tracking_uri

    # MLflow's default of 4 uvicorn workers takes many seconds to answer on a small machine: one per 2 cores, up to 4
    workers = str(max(1, min(4, (os.cpu_count() or 2) // 2)))
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri(), "--host", args.host, "--port", str(args.port),
           "--workers", workers]
    opener = any(e.name == "zhpipe" for e in entry_points(group="mlflow.app"))  # installed: the page that opens the runs view
    if opener:
        cmd += ["--app-name", "zhpipe"]
    print(f"starting the MLflow UI on http://{args.host}:{args.port} (store {tracking_uri()}) ...", flush=True)
    proc = subprocess.Popen(cmd)

    def stop(*_):  # a terminated `zhpipe ui` takes its server (and MLflow's workers) with it
        raise KeyboardInterrupt

    import signal

    signal.signal(signal.SIGTERM, stop)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            try:  # the URL is printed once it answers, so the first click works
                with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2):  # noqa: S310 - loopback
                    break
            except OSError:
                time.sleep(0.5)
        if proc.poll() is None:
            print(f"MLflow UI on {home_url(f'http://{args.host}:{args.port}', opener)} (Ctrl-C stops it)", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 0


def cmd_server(args) -> int:
    from flows import server

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
    from flows import server

    return (f"the server asks for this project's credentials (the UI on first load): {server.credentials()} "
            f"(kept, readable by you only, in {server.state_file().with_name('zhpipe-server-auth')})")


class _ConsoleFormatter(logging.Formatter):
    """Prefect's task-run lines ("Finished in state Completed()") name the task they are about."""

    def format(self, record: logging.LogRecord) -> str:
        task = getattr(record, "task_name", None) or getattr(record, "task_run_name", None)
        if task and record.name.startswith("prefect"):
            record = logging.makeLogRecord({**record.__dict__, "name": f"{record.name} [{task}]"})
        return super().format(record)


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


def _start_background_server() -> None:
    """The first `zhpipe run` of a project starts the project's Prefect server in the background, with an idle
    timeout, so later runs skip the 20 s start of a temporary server (`ZHPIPE_SERVER=temporary`: a temporary
    server per run, as before)."""
    from flows import server

    if os.environ.get("ZHPIPE_SERVER", "background") == "temporary":
        return
    idle = server.idle_timeout()
    after = f"{idle / 60:.0f} min" if idle >= 60 else f"{idle:.0f} s"
    beside = ", and a warm zhpipe process beside it that skips their imports" if handover.enabled() else ""
    print(f"starting this project's Prefect server in the background (about 20 s, once; later runs reuse it{beside}; both "
          f"stop {after} after the last zhpipe command, or with `zhpipe server stop`) ...", end="", flush=True)
    try:
        state = server.start(idle=idle)
    except ZhpipeError as e:  # a taken port, say: this run goes on with a temporary server
        print(f" not started ({e}); using a temporary server", flush=True)
        return
    print(f" running at {state['url'].removesuffix('/api')} (its UI asks for the credentials `zhpipe server status` prints)",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv[1:] and "--" not in argv:  # `zhpipe run --debug` as well as `zhpipe --debug run`
        argv = ["--debug", *[a for a in argv if a != "--debug"]]
    args = _parser().parse_args(argv)
    try:
        if args.command != "init":
            project.activate(project.find(args.project))
    except ZhpipeError as e:
        say("error", str(e))
        return 2
    if args.command in ("run", "tune", "deploy", "serve", "worker") or getattr(args, "dask", None):
        from flows.server import use_running

        project.ensure_prefect_home()

        # a background server instead of a temporary one per command: the running one, else (run, tune) a new one
        if not use_running() and args.command in ("run", "tune") and not os.environ.get("PREFECT_API_URL"):
            _start_background_server()
            use_running()
    if not args.debug:  # MLflow sets its own loggers' level when it is imported (later, lazily): tell it up front
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    handed_env = dict(os.environ)
    if args.command in handover.COMMANDS and not args.debug and not getattr(args, "dask", None):
        code = handover.hand_over(argv)  # the project's warm process runs it, imports done (flows.warm)
        if code is not None:
            return code
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_ConsoleFormatter("%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S"))
    for noisy in ("httpx", "alembic", "mlflow", "gensim", "smart_open", "distributed"):  # their INFO lines are noise here
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for draining in ("EventsWorker", "APILogWorker"):  # Prefect's queues say they still drain at exit: after the last line
        logging.getLogger(draining).setLevel(logging.ERROR)
    if not args.debug and (args.command in ("run", "tune", "deploy", "serve") or getattr(args, "dask", None)):
        import prefect  # noqa: F401 - configures Prefect's loggers, which the filter then attaches to

        _quiet_prefect_tracebacks()
    commands = {"run": cmd_run, "status": cmd_status, "stages": cmd_stages, "pipelines": cmd_pipelines, "ui": cmd_ui,
                "deploy": cmd_deploy, "serve": cmd_serve, "worker": cmd_worker, "runs": cmd_runs, "compare": cmd_compare, "tune": cmd_tune,
                "predict": cmd_predict, "models": cmd_models, "init": cmd_init,
                "verify": cmd_verify, "gc": cmd_gc, "server": cmd_server}
    try:
        code = commands[args.command](args)
        if args.command == "run" and handed_env.get("PREFECT_API_URL") and os.environ.get("ZHPIPE_SERVER") != "temporary":
            from flows.server import idle_timeout

            handover.spawn(idle_timeout(), handed_env, project.current().root)  # the next runs skip the imports (it stops with the server's timeout)
        return code
    except ZhpipeError as e:
        if args.debug:
            raise
        say("error", str(e))
        return 2
    except KeyboardInterrupt:
        kept = ("the stages it finished are kept in the store (and a model's checkpoints), so the next `zhpipe run` "
                "reuses them" if args.command in ("run", "tune") else "")
        say("interrupted", kept)
        return 130


_REPORT: Callable[[int], None] | None = None  # set in the warm process's fork: tells its client the exit status


def abort(code: int) -> NoReturn:
    """End the command now, from any thread, with `code` (no exit hooks: what they would wait for is gone)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if _REPORT is not None:
        _REPORT(code)
    os._exit(code)


def finish(code: int) -> NoReturn:
    """Exit with `code` as the interpreter would, less its teardown: Prefect's and MLflow's exit hooks run (their
    queues drain, logging flushes), then the process ends without freeing every object of every module it
    imported, which takes over a second once Prefect, MLflow and PyTorch are loaded. Every output is already
    written and closed by then (`tasks.io` writes atomically)."""
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # joins non-daemon threads and runs their exit hooks
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if _REPORT is not None:  # the warm process's fork tells its client (flows.warm)
        _REPORT(code)
    os._exit(code)


def entry() -> NoReturn:
    """The `zhpipe` command."""
    finish(main())


if __name__ == "__main__":
    entry()
