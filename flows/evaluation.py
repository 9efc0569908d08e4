"""The train and evaluate stages as units per model: each model in train.models is trained, cached and scored
as its own unit (`train.<model>`, `evaluate.<model>`) with its own key and its own MLflow run (params,
per-epoch curves, test metrics, the saved model and its plots), so changing one model's params rebuilds
that model and the comparison only. The train and evaluate stages then gather their units; the best
classifier is registered under the champion rule."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from flows.registry import register_best
from flows.runner import RunContext, StageResult, members_of, model_units
from flows.tracking import Tracker, client
from tasks.core import Unit, model_unit
from tasks.io import Rows
from tasks.models import MODELS


def model_dir(run: RunContext, name: str) -> Path:
    """The local folder of a trained model of this run (inside its `train.<name>` unit)."""
    unit = model_unit("train", name)
    return run.store.local(unit, run.keys[unit]) / name


def train_models(run: RunContext, upstream: dict[str, StageResult]) -> StageResult:
    """Every model's train unit (reused or built, each tracked in its model run), then the train stage that
    gathers them; `upstream` holds the train stage's inputs by stage name."""
    units: dict[str, StageResult] = {}
    for unit in model_units(run.config, "train"):
        name = Unit.parse(unit).model
        units[unit] = as_task_run(unit, lambda n=name: train_unit(run, n, upstream, units))
    result = run.run("train", units, run.config.kind.stages["train"].module.build)
    result.parts = units
    return result


def as_task_run(unit: str, fn: Callable[[], StageResult]) -> StageResult:
    """A model unit as a Prefect task run of its own, nested in the train or evaluate task run, so the Prefect UI
    shows each model (outside a flow run it is a plain call)."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return fn()
    return task(name=unit, task_run_name=unit, cache_policy=NO_CACHE)(fn)()


def model_run_name(run: RunContext, model: str) -> str:
    """`textcnn · waimai train.epochs=2 12-02 10:31:05`: the model, then its parent run's name, so that model runs of
    different pipeline runs read apart in a comparison."""
    return f"{model} · {run.title or run.config.identity}"


def train_unit(run: RunContext, name: str, upstream: dict[str, StageResult], built: dict[str, StageResult] | None = None,
               tracker: Tracker | None = None) -> StageResult:
    """One model's train unit, reused or built, tracked in its model run (or in `tracker`'s run); an ensemble
    takes its members from `built`."""
    inputs = {k: v for k, v in upstream.items() if k != "embed" or MODELS[name].uses_vectors}
    inputs |= {model_unit("train", m): (built or {})[model_unit("train", m)] for m in members_of(run.config, name)}
    build = run.config.kind.stages["train"].module.build_model
    result = run.run(model_unit("train", name), inputs, lambda ctx: build(ctx, name), run_name=model_run_name(run, name),
                     tags={"zhpipe.model": name}, tracker=tracker)
    _track_training(run, result, name)
    return result


def _track_training(run: RunContext, result: StageResult, name: str) -> None:
    """The model run (its unit's totals are logged by the runner): per-epoch curves and facts every time; the
    saved model only when it was built now; a reused model points to the run that holds it."""
    tracker = Tracker(result.run_id)
    summary = result.facts.summary
    # a model built now logged its curves live, epoch by epoch (the run's sink); a reused one's run gets them here
    if result.cache == "hit":  # in one write (bert's masked-LM pretraining curves too)
        tracker.curves([({k: v for k, v in row.items() if k != "epoch"}, row["epoch"]) for row in summary.get("history", [])] +
                       [({f"mlm_{k}": v for k, v in row.items() if k != "epoch"}, row["epoch"])
                        for row in summary.get("pretrain_history", [])])
    facts = {k: summary[k] for k in ("parameters", "best_epoch", "resumed_from_epoch") if k in summary}
    if facts:
        tracker.metrics(facts)
    if result.cache == "hit":  # logged with its training: point to it, upload nothing
        source = run.store.manifest(result.stage, result.key).mlflow_run_id
        # the run that logged it may be in another tracking store (this one moved aside or new): then it is logged
        # again when it is registered
        uri = tracker.client.get_run(source).data.tags.get("zhpipe.model_uri") if source in Tracker.existing({source or ""}) else None
        if uri:
            tracker.tags({"zhpipe.model_uri": uri})
        return
    if MODELS[name].is_language_model:
        tracker.artifact(result.path / name, "model")
        return
    tracker.tags({"zhpipe.model_uri": _log_classifier(run, tracker.run_id, name, result.path / name, result.facts.labels)})


def _log_classifier(run: RunContext, run_id: str, name: str, folder: Path, labels: list[str]) -> str:
    """A classifier (or tagger) as an MLflow model that takes raw text (models from code, weights in safe
    formats), cleaned and segmented as this pipeline does; returns its URI."""
    from flows.serving import FLAVOURS  # MLflow's pyfunc machinery: only when a model is logged

    return FLAVOURS[run.config.kind.flavour](run_id, name, folder, labels, run.config).model_uri


def evaluate_models(run: RunContext, train: StageResult, segment: StageResult) -> StageResult:
    """Every model's evaluate unit (scored into its model run), then the evaluate stage that compares them."""
    evaluate_stage = run.config.kind.stages["evaluate"].module
    units = {}
    for unit in model_units(run.config, "evaluate"):
        name = Unit.parse(unit).model
        trained = train.parts.get(model_unit("train", name)) or run.reuse(model_unit("train", name))
        model_run = trained.run_id or _model_run(run, name)
        units[unit] = as_task_run(unit, lambda u=unit, n=name, t=trained, m=model_run: run.run(
            u, {"train": t, "segment": segment}, lambda ctx: evaluate_stage.build_model(ctx, n), tracker=Tracker(m)))
    result = run.run("evaluate", units, evaluate_stage.build)
    result.parts = units
    return result


def _model_run(run: RunContext, name: str) -> str:
    """A model run for a model whose training was reused outside this run's train stage (--from evaluate)."""
    return Tracker.start(run.experiment, model_run_name(run, name), parent=run.parent_run_id, tags={"zhpipe.model": name, "zhpipe.cache": "hit"}).run_id


def register(run: RunContext, evaluation: StageResult, segment: StageResult, model_runs: dict[str, str]) -> None:
    """Register the best classifier (a pyfunc that takes raw text) and apply the champion rule; the parent
    run's tags say what happened and why."""
    best = evaluation.facts.best_model
    metric = run.config.kind.metric(run.config)
    uri = client().get_run(model_runs[best]).data.tags.get("zhpipe.model_uri")
    if not uri:  # trained elsewhere and never logged as a classifier here: log it now
        uri = _log_classifier(run, model_runs[best], best, model_dir(run, best), evaluation.facts.labels)
    from flows.serving import score_served

    flavour = run.config.kind.flavour
    decision = register_best(
        uri, model_runs[best], run.config.identity, best, Rows(segment.path / "test.parquet"), metric,
        evaluation.facts.results[best][f"test_{metric}"], model_key=run.keys[model_unit("train", best)],
        rescore=lambda model_uri, test: score_served(model_uri, test, metric, flavour),
    )
    parent = Tracker(run.parent_run_id)
    parent.tags({"zhpipe.registered": f"{decision.name}/{decision.version}", "zhpipe.test_sha256": decision.test_sha256,
                 "zhpipe.champion": ("yes" if decision.champion else "kept" if decision.holds else "no"),
                 "zhpipe.champion_reason": decision.reason})
    scores = {f"challenger_test_{metric}": decision.score}
    if decision.champion_score is not None:
        scores[f"champion_test_{metric}"] = decision.champion_score
    parent.metrics(scores)
