"""`zhpipe run`, `status` and `tune`: build a pipeline (or a study of one model), and see what a run
would build."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import time
from dataclasses import replace

from flows.cli.common import console, load, number, request_of
from flows.needs import BUILDS, Needs, server_ready
from tasks.errors import ZhpipeError, say

log = logging.getLogger("zhpipe")


def cmd_run(args) -> int:
    from flows.cli.doctor import preflight
    from flows.orchestrate.pipeline import pipeline_flow, select_stages
    from tasks.util.urls import conceal

    fail_on(args.fail_on)  # a wrong policy is said before the run, not after it
    preflight()  # a tracking server that does not answer: one line now, not after the data stages
    request = request_of(args)
    config = request.config()
    stages = select_stages(args.start, args.stop, args.only, tuple(config.kind.stages))
    force = None if args.force is None else ([args.force] if args.force else [])
    t0 = time.perf_counter()
    # what the flow run records in Prefect: URLs redacted (the config already holds the redacted
    # forms)
    _store_opened_while_the_server_starts()
    with _heartbeats():
        out = pipeline_flow(
            **request.parameters(),
            stages=stages,
            force=force,
            storage=conceal(args.storage),
            dask=args.dask,
            verify=args.verify,
            parsed=config,
        )
    shown = console()
    shown.print(
        summary_table(out["stages"], time.perf_counter() - t0, config.name, out.get("units", []))
    )
    from flows.track.tracker import tracking_server, ui_url

    where = (
        f"see it at {ui_url(out['experiment'], out['parent_run_id'])}"
        if tracking_server()
        else "see it with `zhpipe ui`"
    )
    shown.print(
        f"MLflow: experiment [bold]{out['experiment']}[/], parent run {out['parent_run_id']}  "
        f"({where}; "
        f"the night's report is its report.html)"
    )
    print_held(config)
    return attention_code(out.get("attention") or {}, args.fail_on)


# `zhpipe run` completed, and something in --fail-on happened: cron's MAILTO hears of it
ATTENTION = 4
FAIL_ON = ("held", "warned", "kept-worse")


def fail_on(text: str) -> tuple[str, ...]:
    """`--fail-on` (or ZHPIPE_FAIL_ON): a comma list of held, warned, kept-worse; `none` for always
    0."""
    chosen = tuple(w.strip() for w in text.split(",") if w.strip())
    wrong = [w for w in chosen if w not in (*FAIL_ON, "none")]
    if wrong:
        raise ZhpipeError(
            f"--fail-on {text}: {wrong[0]!r} is not one of {', '.join(FAIL_ON)}, none"
        )
    return () if "none" in chosen else chosen


def attention_code(attention: dict, wanted: str) -> int:
    """0, or ATTENTION with one line per reason when this run did something `wanted` names (a
    completed run that held a partition, warned, or kept the champion over a worse version)."""
    reasons = []
    chosen = fail_on(wanted)
    if "held" in chosen and attention.get("held"):
        reasons.append(f"held out of the corpus tonight: {', '.join(attention['held'])}")
    if "warned" in chosen and attention.get("warned"):
        reasons.append(f"checks warned: {', '.join(attention['warned'])}")
    if "kept-worse" in chosen and attention.get("kept_worse"):
        reasons.append(f"the champion decision needs a look: {attention['kept_worse']}")
    for reason in reasons:
        say("attention", f"{reason} (exit {ATTENTION}: --fail-on {wanted})")
    return ATTENTION if reasons else 0


def _store_opened_while_the_server_starts() -> None:
    """A temporary Prefect server started with the command (flows/runtime/temporary.py) boots in its
    own process while this one imports and opens the MLflow store (a new one: about 2 s of
    migrations); the flow starts once the server answers."""
    from flows.track import tracker

    try:
        tracker.client()
    # a store that does not open is reported by the run, which opens it again
    except Exception:  # noqa: BLE001
        log.debug("the MLflow store did not open ahead of the run", exc_info=True)
    server_ready()


def _heartbeats():
    """A run started from the command line sends no flow-run heartbeats unless
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY is set: their only use is a zombie-run automation on the
    server, and stopping Prefect's heartbeat thread holds every run up to a second at its end.
    Deployment runs (workers, `zhpipe serve`) keep Prefect's default."""
    if any(
        k in os.environ
        for k in ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")
    ):
        return contextlib.nullcontext()
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    # settings read again from the environment, which a warm process's fork has just taken on from
    # its client (the project's login, the server's address): not a copy of the current ones
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def companion_of(headline: str | None) -> str:
    """The metric the end-of-run table shows beside a headline (a kind's `companions`); the headline
    itself if none."""
    from tasks.stages import KINDS

    for kind in KINDS.values():
        for first, second in kind.companions:
            if headline and first in headline:
                return headline.replace(first, second)
    return headline or ""


def summary_table(rows: list[dict], wall: float, name: str, units: list[dict] = ()):
    """The end-of-run table: stage, cache, seconds, rows, headline metric; each model unit under its
    stage."""
    from rich.table import Table

    table = Table(title=f"zhpipe run {name}: {wall:.1f} s wall")
    for col in ("stage", "cache", "seconds", "rows", "metric"):
        table.add_column(col, justify="right" if col in ("seconds", "rows") else "left")
    for r in rows:
        models = [u for u in units if u["stage"].startswith(r["stage"] + ".")]
        value = r["metrics"].get(r["headline"])
        metric = f"{r['headline']}={number(value)}" if value is not None else ""
        companion = companion_of(r["headline"])
        if metric and companion != r["headline"] and r["metrics"].get(companion) is not None:
            metric += f" {companion}={number(r['metrics'][companion])}"
        # a per-model stage: the chosen model (selection), else the best on validation (training)
        if models:
            metric = _models_metric(r, models, metric)
        table.add_row(
            r["stage"],
            "[green]hit[/]" if r["cache"] == "hit" else "[yellow]miss[/]",
            f"{r['seconds']:.1f}",
            str(r["rows"] if r["rows"] is not None else ""),
            metric,
        )
        partitions = [u for u in units if u["stage"].startswith(r["stage"] + ":")]
        if partitions:  # a partitioned source: one line for all of a stage's partitions
            built = [u for u in partitions if u["cache"] == "miss"]
            table.add_row(
                f"  {len(partitions)} partitions",
                f"{len(partitions) - len(built)} hit, {len(built)} built",
                f"{sum(u['seconds'] for u in built):.1f}",
                str(sum(u["rows"] or 0 for u in built)),
                "rows built",
            )
        for u in models:
            if u.get("why"):  # a model the training budget left no time for
                table.add_row(
                    f"  {u['stage'].partition('.')[2]}",
                    "[red]not trained[/]",
                    "",
                    "",
                    u["why"].removeprefix("not trained: "),
                )
                continue
            key = _unit_metric(u["metrics"], r["headline"])
            cut = " (cut short by the budget)" if u["metrics"].get("cut_short") else ""
            note = ((u.get("facts") or {}).get("summary") or {}).get("fit_note")
            cut += f" ({note})" if note else ""
            table.add_row(
                f"  {u['stage'].partition('.')[2]}",
                "[green]hit[/]" if u["cache"] == "hit" else "[yellow]miss[/]",
                f"{u['seconds']:.1f}",
                "",
                f"{key}={number(u['metrics'][key])}{cut}" if key else cut,
            )
    return table


def _models_metric(row: dict, models: list[dict], metric: str) -> str:
    """A per-model stage's line: `chosen tfidf_lr: best_test_accuracy=...` after the selection; for
    training, the model ahead on validation (a training stage's own metrics are one model's,
    whichever it names)."""
    chosen = (row.get("facts") or {}).get("best_model")
    if chosen:
        return f"chosen {chosen}: {metric}" if metric else f"chosen {chosen}"
    scored = [
        (u["metrics"][k], u["stage"].partition(".")[2], k)
        for u in models
        for k in ("val_accuracy_best", "val_macro_f1_best", "val_f1_best", "val_bleu")
        if k in u["metrics"]
    ]
    if not scored:
        return metric
    key = scored[0][2]
    value, model, _ = max(s for s in scored if s[2] == key)
    return f"ahead on validation: {model} {key}={number(value)}"


def _unit_metric(metrics: dict, headline: str | None) -> str | None:
    """A model unit's metric for the summary, whatever the task kind: its stage's headline without
    `best_` (each model's test F1, BLEU or accuracy), else a validation or test metric it has."""
    preferred = ([headline.removeprefix("best_")] if headline else []) + [
        "val_macro_f1_best",
        "test_accuracy",
        "val_perplexity_best",
        "test_perplexity",
    ]
    return next((k for k in preferred if k in metrics), None) or next(
        (k for k in sorted(metrics) if k.startswith(("test_", "val_"))), None
    )


# `zhpipe status` (and `run --dry-run`) read a pipeline and its store: handed to the warm process,
# which was started with the background server's URL in its environment, so the command names it too
READS = Needs(warm=True, server="use")


class _DryRun(argparse.Action):
    """`zhpipe run --dry-run`: the run's plan, as `zhpipe status` shows it (no server started,
    nothing built)."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.handler, namespace.needs = cmd_status, READS


def cmd_status(args) -> int:
    from rich.table import Table

    from flows.plan.keys import not_trained, planned, unread
    from flows.plan.status import stage_states
    from flows.plan.store import StageStore, stage_key, storage_root
    from flows.track.champion import revision

    config = load(args)
    store = StageStore(storage_root(config, args.storage))
    config, causes = planned(store, config, registry=revision)  # as a run plans it
    keys = {stage: stage_key(c) for stage, c in causes.items()}
    table = Table(title=f"zhpipe status {config.name}")
    for col in ("stage", "state", "key", "rows", "built seconds", "why"):
        table.add_column(col)
    colour = {
        "cached": "green",
        "stale": "yellow",
        "missing": "red",
        "corrupt": "red",
        "not needed": "dim",
    }
    rows = stage_states(store, causes, keys, config.name)
    unused = unread(config, list(config.kind.stages))
    for row in rows:  # a stage a run leaves unbuilt (embed, when no model starts from word vectors)
        if row["stage"] in unused and row["state"] != "cached":
            row.update(
                state="not needed",
                why=["no model of this pipeline reads it; a run leaves it unbuilt"],
            )
    parts: dict[str, list[dict]] = {}
    for row in rows:  # a partitioned source: its partition units, one line per stage
        if ":" in row["stage"]:
            parts.setdefault(row["stage"].split(":", 1)[0], []).append(row)
    for row in (r for r in rows if ":" not in r["stage"]):
        table.add_row(
            row["stage"],
            f"[{colour[row['state']]}]{row['state']}[/]",
            row["key"],
            "" if row["rows"] is None else str(row["rows"]),
            "" if row["seconds"] is None else f"{row['seconds']:.1f}",
            "\n".join(row["why"]),
        )
        if row["stage"] in parts:
            units = parts[row["stage"]]
            new = [u["stage"].split(":", 1)[1] for u in units if u["state"] != "cached"]
            table.add_row(
                f"  {len(units)} partitions",
                f"{len(units) - len(new)} cached, {len(new)} to build",
                "",
                str(sum(u["rows"] or 0 for u in units)),
                "",
                (
                    "to build: "
                    + ", ".join(new[:3])
                    + (f" and {len(new) - 3} more" if len(new) > 3 else "")
                )
                if new
                else "",
            )
    for model, why in not_trained(config).items():
        table.add_row(
            f"{config.kind.training.name}.{model}",
            "[yellow]not trained[/]",
            "",
            "",
            "",
            f"{why}; `zhpipe run --force {config.kind.training.name}` tries it again",
        )
    console().print(table)
    print_held(config)
    return 0


def print_held(config) -> None:
    """The partitions (or corpus) the data checks hold out of the corpus, each with its line and how
    to put it back."""
    from rich.markup import escape

    from flows.plan import held

    out = held.held(config.identity)
    for name, why in out.items():
        command = (
            f"zhpipe accept {shlex.quote(config.name)} "
            f"{shlex.quote(name) if name != held.CORPUS else '--all'}"
        )
        console().print(
            f"[red]held out[/]: {escape(why.get('line', name))}; put it back with "
            f"`{escape(command)}`"
        )


def cmd_tune(args) -> int:
    from flows.orchestrate.tune import tune

    if args.source:
        raise ZhpipeError(
            "tune: tune on the corpus a pipeline declares (add a pipeline for another corpus to "
            "pipelines.yaml)"
        )
    if args.trials < 1:
        raise ZhpipeError(f"tune: --trials must be at least 1, got {args.trials}")
    server_ready()
    result = tune(request_of(args), args.model, args.trials, args.seed, args.storage)
    print(
        f"best of {result['complete']} complete trials ({result['trials']} in the study): "
        f"{result['metric']} "
        f"{result['value']:.4f} (trial {result['trial']}); MLflow tune run {result['run_id']}"
    )
    print("as --set lines:  " + " ".join(f"--set {s}" for s in result["sets"]))
    print(f"as YAML (also in {result['file']}):\n{result['yaml']}", end="")
    return 0


def add_parsers(sub) -> None:
    from flows.cli.common import StageNames, pipeline_args, storage_arg

    stage_names = StageNames()

    run = sub.add_parser("run", help="run a pipeline (cached stages are reused)")
    pipeline_args(run)
    storage_arg(run)
    run.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run the chunked stages (clean, segment, augment) on Dask: "
        "`local` for a local cluster, or a scheduler address such as tcp://10.0.0.5:8786",
    )
    named = (
        run.add_argument(
            "--from", dest="start", choices=stage_names, metavar="STAGE", help="first stage to run"
        ),
        run.add_argument(
            "--to", dest="stop", choices=stage_names, metavar="STAGE", help="last stage to run"
        ),
        run.add_argument(
            "--only",
            choices=stage_names,
            metavar="STAGE",
            help="run just this stage (its inputs must be cached)",
        ),
    )
    for action in named:  # argparse formats a metavar as an option is added; usage lists the names
        action.metavar = None
    run.add_argument(
        "--force",
        nargs="?",
        const="",
        choices=StageNames(""),
        metavar="STAGE",
        help="rebuild STAGE and every later stage even if cached (all stages without STAGE)",
    )
    run.add_argument(
        "--verify",
        action="store_true",
        help="hash every file of a reused output against its manifest "
        "(file sizes, and files up to 8 MB, are always checked)",
    )
    run.add_argument(
        "--fail-on",
        default=os.environ.get("ZHPIPE_FAIL_ON", "held,kept-worse"),
        metavar="WHAT",
        help="exit 4 when the run completed but one of these happened: held (a data check held a "
        "partition out), warned (a check warned), kept-worse (the new model is worse than the "
        "champion "
        "beyond the noise); `none`: exit 0 (default: held,kept-worse, or ZHPIPE_FAIL_ON)",
    )
    run.add_argument(
        "--dry-run",
        nargs=0,
        action=_DryRun,
        help="build nothing: say what a run would build and why (what `zhpipe status` says)",
    )
    run.set_defaults(handler=cmd_run, needs=replace(BUILDS, warm=True, leaves_warm=True))
    status = sub.add_parser("status", help="show each stage as cached, stale or missing")
    pipeline_args(status)
    storage_arg(status)
    status.set_defaults(handler=cmd_status, needs=READS)
    tune = sub.add_parser(
        "tune",
        help="an Optuna study of one model's settings (TPE, pruning, "
        "resumable; nested MLflow runs)",
    )
    pipeline_args(tune)
    storage_arg(tune)
    tune.add_argument("--model", required=True, help="the model of train.models to tune")
    tune.add_argument(
        "--trials", type=int, default=20, help="trials to add to the study (default 20)"
    )
    tune.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    tune.set_defaults(handler=cmd_tune, needs=BUILDS)
