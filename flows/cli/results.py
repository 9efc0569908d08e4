"""`zhpipe runs`, `compare`, `predict` and `ui`: the MLflow side, runs and registered models."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from flows.cli.common import pipeline_name, print_frame, storage_arg
from flows.needs import Needs
from tasks.errors import ZhpipeError, printable

WHY_CHARS = 60  # of the champion decision's reason in `zhpipe runs`


def cmd_runs(args) -> int:
    from flows.track.runs import pipeline_runs, runs_table

    df = runs_table(pipeline_runs(args.pipeline, args.limit))
    if args.json:  # every column, every value whole: for scripts
        print(
            df.to_json(orient="records", lines=True, force_ascii=False) if len(df) else "", end=""
        )
        return 0
    if df.empty:
        print("no pipeline runs yet; `zhpipe run` makes one")
        return 0
    if args.columns:
        wanted = [c.strip() for c in args.columns.split(",") if c.strip()]
        unknown = [c for c in wanted if c not in df.columns]
        if unknown or not wanted:
            raise ZhpipeError(
                f"runs --columns: no column {', '.join(map(repr, unknown)) or 'named'} (columns: "
                f"{', '.join(df.columns)})"
            )
        shown = df[wanted]
    # the run's name holds its pipeline, its overrides and its time: the columns that repeat it are
    # left out
    else:
        shown = df.drop(columns=[c for c in ("pipeline", "overrides", "started") if c in df])
    # a champion decision's reason runs to 200 characters: its start here, all of it in MLflow's
    # tags and --json
    if "why" in shown:
        shown = shown.assign(
            why=[
                w if len(str(w)) <= WHY_CHARS else str(w)[: WHY_CHARS - 1] + "…"
                for w in shown["why"]
            ]
        )
    width = terminal_width()
    if width is not None and not args.columns:
        shown = shown[fitting(shown, width)]
    # every value whole: only a name longer than its share of the line folds onto a second line
    print_frame(
        shown,
        f"zhpipe runs{' ' + args.pipeline if args.pipeline else ''} (newest first)",
        no_wrap=tuple(c for c in shown.columns if c != "name"),
        width=width,
    )
    return 0


# the columns `zhpipe runs` keeps first in a narrow terminal (the others follow in the table's
# order, as they fit)
RUNS_FIRST = (
    "run",
    "name",
    "test acc",
    "test macro-F1",
    "test entity F1",
    "test BLEU",
    "best model",
    "champion",
    "registered",
    "status",
)


def terminal_width() -> int | None:
    """$COLUMNS when set, else the terminal's width; None into a pipe or a file (no limit: nothing
    is left out)."""
    import shutil

    if os.environ.get("COLUMNS", "").isdigit():
        return max(int(os.environ["COLUMNS"]), 40)
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def fitting(df, width: int) -> list[str]:
    """The columns of `df` that fit in `width` terminal cells with every value whole: `run` and
    `name` always (a name longer than a third of the line folds onto more lines, at its spaces where
    it can), then RUNS_FIRST's, then the others, each only if it still fits; returned in the table's
    order. Widths are terminal cells: a Chinese character takes two."""
    from rich.cells import cell_len

    from flows.cli.common import cell

    def need(col) -> int:
        cells = max([cell_len(str(col))] + [cell_len(cell(v)) for v in df[col]])
        # a space each side, a border
        return (min(cells, max(24, width // 3)) if col == "name" else cells) + 3

    order = [c for c in RUNS_FIRST if c in df.columns] + [
        c for c in df.columns if c not in RUNS_FIRST
    ]
    chosen, used = set(), 1  # the table's left border
    for col in order:
        if used + need(col) <= width or col in ("run", "name"):
            chosen.add(col)
            used += need(col)
    return [c for c in df.columns if c in chosen]


def cmd_compare(args) -> int:
    from flows.track.runs import compare_table

    if len(args.runs) < 2:
        raise ZhpipeError("compare needs at least two runs")
    print_frame(
        compare_table(args.runs, args.all),
        "zhpipe compare" + ("" if args.all else " (rows that differ, and the headline metrics)"),
    )
    return 0


def cmd_predict(args) -> int:
    """`--storage`: the stage store whose records vouch for the model's files (flows.track.trust),
    here and in Dask workers, for this command only."""
    if not args.storage:
        return _predict(args)
    before = os.environ.get("ZHPIPE_STORAGE")
    os.environ["ZHPIPE_STORAGE"] = args.storage
    try:
        return _predict(args)
    finally:
        if before is None:
            os.environ.pop("ZHPIPE_STORAGE", None)
        else:
            os.environ["ZHPIPE_STORAGE"] = before


def _predict(args) -> int:
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from flows.track.predict import (
        load_model,
        model_version,
        predict_frame,
        read_input,
        with_predictions,
    )

    if bool(args.texts) == bool(args.input):
        raise ZhpipeError("predict: give TEXT arguments or --input FILE (not both)")
    if args.input and not args.output:
        raise ZhpipeError("predict: --input needs --output FILE")
    if args.output:
        from flows.track.predict import READERS

        # before loading a model and predicting, not after
        if args.output.suffix.lower() not in READERS:
            raise ZhpipeError(
                f"--output {args.output}: unknown file type '{args.output.suffix}' (expected .csv, "
                ".tsv, "
                f".jsonl or .parquet)"
            )
    # the pipeline's own text column, as its corpus names it
    if args.input and args.text_column is None:
        args.text_column = _text_column(args)
    df = (
        read_input(args.input, args.text_column)
        if args.input
        else pd.DataFrame({"text": args.texts})
    )
    uri = args.model or f"models:/zhpipe-{pipeline_name(args)}@champion"
    from flows.track.tracker import tracking_uri

    store = (
        tracking_uri().removeprefix("sqlite:///")
        if tracking_uri().startswith("sqlite:///")
        else None
    )
    # nothing to load, and nothing to create
    if uri.startswith("models:/") and store and not Path(store).is_file():
        raise ZhpipeError(
            f"no models yet: {store} does not exist; run a pipeline first (`zhpipe "
            f"run`) or pass --model DIR"
        )
    column = args.text_column if args.input else "text"
    model = load_model(uri)  # fail here, once, with one line
    used = model_version(uri)
    shown = f"{used['model']} version {used['version']}" if used["version"] else used["model"]
    try:
        if args.dask:
            from prefect import flow

            from flows.track.predict import predict_distributed

            @flow(name="zhpipe-predict", log_prints=True)
            # the chunk task runs are grouped under one flow run in the Prefect UI
            def predict_flow():
                return predict_distributed(uri, df, column, args.dask)

            out = predict_flow()
        else:
            out = predict_frame(model, df, column)
    except MlflowException as e:
        raise ZhpipeError(f"predict: {e.message.removeprefix('zhpipe: ')}") from None
    show_predictions(with_predictions(df, out, used), args, f"model {shown} ({uri})")
    return 0


def _text_column(args) -> str:
    """The text column of the pipeline whose model predicts (`source.text_column`); `text` when no
    pipeline is found (a model given by --model outside a project)."""
    from flows.plan.config import load_pipeline
    from tasks.errors import ConfigError

    try:
        return load_pipeline(pipeline_name(args)).source.text_column or "text"
    except (ConfigError, ZhpipeError):
        return "text"


def show_predictions(out, args, model: str) -> None:
    """Predictions written to --output (with a one-line count), printed as JSON lines, or as a
    table; how a kind's answers read is its serving module's `SHOWN`."""
    from flows.track.predict import PREFIX, shown_as

    statuses = out["pred_status"].value_counts().to_dict()
    shown = shown_as(out)
    answers = out[[f"{PREFIX}{c}" for c in shown.columns if f"{PREFIX}{c}" in out]].rename(
        columns=lambda c: c.removeprefix(PREFIX)
    )
    if args.output:
        from flows.track.predict import write_table

        write_table(out, args.output)
        counted = out[[c for c in out if c.startswith(PREFIX)]].rename(
            columns=lambda c: c.removeprefix(PREFIX)
        )
        print(
            printable(
                f"{len(out)} rows -> {args.output} ({shown.found(counted)}; status: {statuses}; "
                f"{model})"
            )
        )
    elif args.jsonl:
        import json

        for text, status, row in zip(out["text"], out["pred_status"], answers.to_dict("records")):
            print(
                printable(
                    json.dumps(
                        {"text": text, "status": status, **shown.record(row)},
                        ensure_ascii=False,
                        default=float,
                    )
                )
            )
    else:
        cells = {f"{PREFIX}{c}": out[f"{PREFIX}{c}"].map(shown.cell) for c in shown.nested}
        print_frame(
            out.assign(**cells)[["text", *(f"{PREFIX}{c}" for c in shown.columns), "pred_status"]],
            f"zhpipe predict: {model}",
        )


def _served(proc, local: str, auth: str, port: int, timeout: float = 120) -> None:
    """Wait until the MLflow server `proc` answers at `local` as ours: its own socket on the port,
    then our credentials (`private.ours_answering`); one line, the server stopped, when it exits,
    another process holds the port, or it does not answer in time."""
    from flows.plan import private

    deadline = time.monotonic() + timeout
    try:
        while (
            proc.poll() is None
            and time.monotonic() < deadline
            and not private.ours_answering(proc.pid, local, auth)
        ):
            time.sleep(0.5)
        if proc.poll() is None and not private.ours_answering(proc.pid, local, auth):
            raise ZhpipeError(
                f"ui: the MLflow server did not answer on port {port} within {timeout:.0f} s"
            )
    except ZhpipeError as e:
        proc.terminate()
        proc.wait(30)
        raise ZhpipeError(
            f"ui: {e} (`zhpipe ui --port N`)" if isinstance(e, private.PortTaken) else str(e)
        ) from None
    if proc.poll() is not None:
        raise ZhpipeError(
            f"ui: the MLflow server stopped before it served on port {port} (exit "
            f"{proc.returncode}); "
            f"its lines above say why"
        )


# deprecation warnings MLflow's server prints at every start (starlette's WSGI middleware, an
# SQLAlchemy loader)
THIRD_PARTY_WARNINGS = (
    "ignore:starlette.middleware.wsgi is deprecated",
    "ignore:The ``noload`` loader strategy",
)


def cmd_ui(args) -> int:
    """MLflow's server over the project's store, for its owner only: the project's credentials on
    every request and no writes (flows.track.ui). Fails in one line when it cannot serve on its
    port."""
    import subprocess
    import warnings
    from importlib.metadata import entry_points

    from flows.plan import private, project
    from flows.track.tracker import home_url, private_store, tracking_uri

    for rule in THIRD_PARTY_WARNINGS:  # this process imports MLflow's app too (flows.track.ui)
        warnings.filterwarnings("ignore", message=rule.split(":", 1)[1])
    from flows.track.ui import AUTH_FILE

    if not any(e.name == "zhpipe" for e in entry_points(group="mlflow.app")):
        raise ZhpipeError(
            "ui: zhpipe's MLflow app is not installed (it asks for the project's credentials and "
            "refuses "
            "writes); install zhpipe (`pip install -e .` in a checkout) and try again"
        )
    # the project's own (recorded: its links point there), or the given one
    args.port = project.ui_port(args.port)
    if not private.port_free(args.port, args.host):
        raise ZhpipeError(
            f"ui: port {args.port} on {args.host} is already in use (another server answers "
            "there); "
            f"choose another with `zhpipe ui --port N` (the project's links then point there)"
        )
    project.ensure_prefect_home()
    private_store()
    auth = private.credentials()
    # MLflow's default of 4 uvicorn workers takes many seconds to answer on a small machine: one per
    # 2 cores, up to 4
    workers = str(max(1, min(4, (os.cpu_count() or 2) // 2)))
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        tracking_uri(),
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--workers",
        workers,
        "--app-name",
        "zhpipe",
    ]
    print(
        f"starting the MLflow UI on http://{args.host}:{args.port} (store {tracking_uri()}) ...",
        flush=True,
    )
    # MLflow's job runner serves GenAI jobs (prompt optimisation, scorers) that zhpipe never
    # submits: left on, it starts eight more Python processes (a runner and seven huey consumers)
    # that double the start-up time and the memory
    env = {
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        **os.environ,
        AUTH_FILE: str(private.credentials_file()),
    }
    # MLflow's own imports warn of what its maintainers must replace, not the user: not printed on
    # every start
    env["PYTHONWARNINGS"] = ",".join(
        filter(None, [env.get("PYTHONWARNINGS"), *THIRD_PARTY_WARNINGS])
    )
    proc = subprocess.Popen(cmd, env=env)

    def stop(*_):  # a terminated `zhpipe ui` takes its server (and MLflow's workers) with it
        raise KeyboardInterrupt

    import signal

    signal.signal(signal.SIGTERM, stop)
    local = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    try:
        _served(proc, local, auth, args.port)
        user, password = auth.split(":", 1)
        print(
            f"MLflow UI on {home_url(f'http://{args.host}:{args.port}', True)} (log in as {user}, "
            "password "
            f"{password}; Ctrl-C stops it)",
            flush=True,
        )
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 0


def add_parsers(sub) -> None:
    runs = sub.add_parser(
        "runs", help="list recent pipeline runs (date, commit, source, best model, metrics)"
    )
    runs.add_argument("pipeline", nargs="?", help="one pipeline (default: all)")
    runs.add_argument(
        "--limit", type=int, default=20, help="at most this many runs, newest first (default 20)"
    )
    runs.add_argument(
        "--columns",
        help="these columns, comma-separated, in this order (default: those that fit the "
        "terminal's width, $COLUMNS, keeping run, name and the test metrics first)",
    )
    runs.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per run, every column whole, for scripts",
    )
    runs.set_defaults(handler=cmd_runs)
    compare = sub.add_parser(
        "compare", help="side-by-side table of the parameters and metrics that differ between runs"
    )
    compare.add_argument(
        "runs", nargs="+", metavar="RUN", help="run ids or prefixes (as `zhpipe runs` prints them)"
    )
    compare.add_argument(
        "--all", action="store_true", help="every parameter and metric, not only those that differ"
    )
    compare.set_defaults(handler=cmd_compare)
    predict = sub.add_parser(
        "predict", help="label raw texts with a registered model (default: the pipeline's champion)"
    )
    predict.add_argument(
        "texts",
        nargs="*",
        metavar="TEXT",
        help="texts to label (raw text, cleaned and segmented as the model's pipeline does)",
    )
    predict.add_argument(
        "--model", help="an MLflow model URI (default models:/zhpipe-<pipeline>@champion)"
    )
    predict.add_argument(
        "--pipeline", help="whose champion to use (default: the first pipeline in pipelines.yaml)"
    )
    predict.add_argument(
        "--input", type=Path, help="a .csv, .tsv, .jsonl or .parquet file of texts"
    )
    predict.add_argument(
        "--output",
        type=Path,
        help="where to write the input rows with label and probabilities (same formats)",
    )
    predict.add_argument(
        "--text-column",
        help="with --input: the text column (default: the pipeline's source.text_column)",
    )
    predict.add_argument(
        "--jsonl", action="store_true", help="print one JSON object per text instead of a table"
    )
    predict.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="with --input: predict in chunks on Dask (`local` or a scheduler address)",
    )
    storage_arg(predict)
    predict.set_defaults(handler=cmd_predict)
    ui = sub.add_parser("ui", help="start the MLflow UI on the project's tracking store")
    ui.add_argument(
        "--port",
        type=int,
        help="the port to serve on, recorded as the project's (default: the "
        "project's own, drawn once from 5100-5899 and kept; alert and report links point to it)",
    )
    ui.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to serve on (default 127.0.0.1: this machine only)",
    )
    ui.set_defaults(handler=cmd_ui, needs=Needs(space=True))
