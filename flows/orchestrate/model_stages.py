"""Per-model stages (declared with `PerModel` in tasks/stages.py: train and evaluate): each model of
the model list is trained, cached and scored as its own unit (`train.<model>`, `evaluate.<model>`)
with its own key and one MLflow run per model (params, per-epoch curves, test metrics, the saved
model and its plots), so changing one model's params rebuilds that model and the comparison only.
Each stage then gathers its units; after the stage that selects, the best model is registered under
the champion rule."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from flows.orchestrate.execute import RunContext
from flows.orchestrate.tracking import artifact_key
from flows.plan.cache import StageResult
from flows.plan.keys import members_of, model_units, record_cut, training_order, without_models
from flows.track.champion import register_best
from flows.track.tracker import Tracker, client
from tasks.core import model_unit
from tasks.errors import ZhpipeError
from tasks.models.racing import NOT_TRAINED, Budget, BudgetCut, from_history, racing
from tasks.stages import MODELS, Stage
from tasks.util.io import Rows

log = logging.getLogger("zhpipe")


def model_dir(run: RunContext, name: str) -> Path:
    """The local folder of a trained model of this run (inside its unit of the training stage)."""
    unit = model_unit(run.config.kind.training.name, name)
    return run.store.local(unit, run.keys[unit]) / name


def run_model_stage(run: RunContext, spec: Stage, upstream: dict[str, StageResult]) -> StageResult:
    """A per-model stage: every model's unit (reused or built, each tracked in its model run), then
    the stage that gathers them; `upstream` holds the stage's inputs by stage name. After the stage
    that selects, the best model is registered (every run: a best model a killed run did not
    register is registered now)."""
    units: dict[str, StageResult] = {}
    clock = budget_of(run, spec)
    # with a budget, cheapest first (the ensembles last): the baselines lead before a network races
    # them
    order = (
        model_units(run.config, spec.name)
        if clock is None
        else training_order(run.config, spec.name)
    )
    failed: dict[str, str] = {}
    for unit in order:
        name = unit.model
        if lost := [
            m for m in members_of(run.config, name) if m in failed or clock and m in clock.cut
        ]:
            if clock is not None and lost[0] in clock.cut:
                clock.skipped(name, f"{NOT_TRAINED} (its member {lost[0]} was not trained)")
            else:
                failed[name] = f"its member {lost[0]} failed"
            continue
        try:
            units[unit] = as_task_run(
                unit, lambda n=name: model_unit_run(run, spec, n, upstream, units, clock=clock)
            )
        # not started, or stopped in its first epoch: no model, no row, no registry
        except BudgetCut as e:
            clock.skipped(name, str(e))
            log.warning("%s: %s", unit, e)
            continue
        # a model that cannot train (a team's estimator that raises): the others still do
        except ZhpipeError as e:
            if not spec.models.trains or MODELS[name].members is not None:
                raise
            failed[name] = str(e)
            log.error("%s: failed: %s; the other models go on", unit, e)
            continue
        if clock is not None:
            clock.finished(name, units[unit].facts.summary or {})
    if clock is not None:
        budget_said(run, clock)
    if failed:
        trained = [u.model for u in units]
        raise ZhpipeError(
            f"{spec.name}: {len(failed)} model{'s' if len(failed) > 1 else ''} failed: "
            f"{'; '.join(f'{m}: {why}' for m, why in failed.items())}; "
            f"{'trained and kept: ' + ', '.join(trained) if trained else 'none trained'} (the next "
            "run "
            f"reuses them)"
        )
    result = run.run(spec.name, units, spec.build)
    result.parts = units
    if spec.models.selects:
        test = upstream.get(run.config.kind.test_split().name) or run.reuse(
            run.config.kind.test_split().name
        )
        register(run, result, test, {unit.model: r.run_id for unit, r in result.parts.items()})
        comparison = result.path / "comparison.md"
        if comparison.is_file():
            from prefect.artifacts import create_markdown_artifact

            markdown = (
                f"# {run.config.name}: model comparison (test split)\n\n"
                + comparison.read_text(encoding="utf-8")
            )
            create_markdown_artifact(
                markdown=markdown,
                key=artifact_key(run.config.name, "comparison"),
                description=f"zhpipe {spec.name}",
            )
    return result


def budget_of(run: RunContext, spec: Stage) -> Budget | None:
    """The training stage's clock (`train.budget`, `train.model_budget`; tasks/models/racing.py),
    None without one."""
    if not spec.models.trains:
        return None
    section = run.config.section(spec.name)
    budget, per_model = getattr(section, "budget", None), getattr(section, "model_budget", None)
    if budget is None and per_model is None:
        return None
    return Budget(
        budget,
        per_model,
        [u.model for u in model_units(run.config, spec.name) if MODELS[u.model].races],
        f"val_{run.config.kind.metric(run.config)}",
    )


def budget_said(run: RunContext, clock: Budget) -> None:
    """After the training stage's models under a budget: the models it left no time for leave this
    run's model list (the stages that gather, compare and register are planned without them, and
    name them); what the budget did is a tag on the parent run, which the report and `zhpipe run`
    show."""
    if clock.cut:
        # a rerun of the same training keeps the decision
        record_cut(run.store, run.config, run.keys, clock.cut)
        run.config = without_models(run.config, clock.cut)
        run.replan()
    said = clock.said()
    if clock.budget is not None:
        log.info(
            "%s: the models took %.0f s of the %.0f s budget%s",
            run.config.kind.training.name,
            clock.spent(),
            clock.budget,
            f"; {said}" if said else "",
        )
    if said and run.parent_run_id:
        Tracker(run.parent_run_id).tags({"zhpipe.budget": said[:5000]})


def history(
    run: RunContext, name: str, upstream: dict[str, StageResult], spec: Stage
) -> float | None:
    """A model's estimated training seconds from its earlier builds in the store (any key; a build
    the budget cut short left out), scaled by the rows of the stage's first input."""
    unit = model_unit(spec.name, name)
    builds = []
    for key in run.store.others(unit, run.keys[unit]):
        try:
            m = run.store.manifest(unit, key)
        except (OSError, ValueError):
            continue
        if not m.metrics.get("cut_short"):
            builds.append((m.created, m.seconds, m.rows))
    first = upstream.get(spec.needs[0]) if spec.needs else None
    if not builds or first is None or not first.rows:
        return None
    return from_history(
        [(seconds, rows) for _, seconds, rows in sorted(builds, reverse=True)], first.rows
    )


def _raced(
    clock: Budget, build: Callable, name: str, estimate: Callable[[], float | None] | None = None
) -> Callable:
    """A model's build in its race: its share is taken when it starts, and it starts only when its
    estimate (asked then) fits (`Race.admit`); a cut says so in its summary and metrics."""

    def raced(ctx):
        with racing(clock.race(name, MODELS[name].races, estimate() if estimate else None)) as race:
            if race is not None:
                race.admit()
            out = build(ctx, name)
        if race is not None and race.cut:
            log.info("%s: cut short by the budget: %s", name, race.cut)
            out.facts.summary["cut_short"] = race.cut
            out.metrics["cut_short"] = 1.0
        return out

    return raced


def model_unit_run(
    run: RunContext,
    spec: Stage,
    name: str,
    upstream: dict[str, StageResult],
    built: dict[str, StageResult] | None = None,
    tracker: Tracker | None = None,
    clock: Budget | None = None,
) -> StageResult:
    """One model's unit of a per-model stage, reused or built. A unit that trains opens the model's
    run (or logs into `tracker`'s), its ensemble reads its members' units from `built`; a unit that
    reads another per-model stage's unit of the same model (evaluate reads train's) logs into that
    unit's model run. `clock`: the training budget, which races the models that train through the
    shared loop."""
    inputs = {k: v for k, v in upstream.items() if spec.reads(k, MODELS[name])}
    # in place of that stage's gathered output: this model's unit of it
    for stage in spec.models.reads:
        inputs[stage] = (
            upstream[stage].parts.get(model_unit(stage, name)) if stage in upstream else None
        )
        inputs[stage] = inputs[stage] or run.reuse(model_unit(stage, name))
    if spec.models.trains:
        inputs |= {
            model_unit(spec.name, m): (built or {})[model_unit(spec.name, m)]
            for m in members_of(run.config, name)
        }
    elif tracker is None:
        tracker = Tracker(
            next((inputs[s].run_id for s in spec.models.reads if inputs[s].run_id), None)
            or _model_run(run, name)
        )
    build = spec.build_model
    # called only when the unit is built (a reused one takes no time and asks none); a network's
    # history is of all its epochs, and in a race it may train fewer, judged from its first batches
    estimate = None if MODELS[name].races else (lambda: history(run, name, upstream, spec))
    raced = _raced(clock, build, name, estimate) if clock is not None else None
    result = run.run(
        model_unit(spec.name, name),
        inputs,
        raced or (lambda ctx: build(ctx, name)),
        run_name=model_run_name(run, name),
        tags={"zhpipe.model": name},
        tracker=tracker,
    )
    if spec.models.trains:
        _track_training(run, result, name)
    return result


def as_task_run(unit: str, fn: Callable[[], StageResult]) -> StageResult:
    """A model unit as a Prefect task run of its own, nested in the train or evaluate task run, so
    the Prefect UI shows each model (outside a flow run it is a plain call)."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return fn()
    return task(name=unit, task_run_name=unit, cache_policy=NO_CACHE)(fn)()


def model_run_name(run: RunContext, model: str) -> str:
    """`textcnn · waimai train.epochs=2 12-02 10:31:05`: the model, then its parent run's name, so
    that model runs of different pipeline runs read apart in a comparison."""
    return f"{model} · {run.title or run.config.identity}"


def _track_training(run: RunContext, result: StageResult, name: str) -> None:
    """The model run (its unit's totals are logged by the run engine): per-epoch curves and facts
    every time; the saved model only when it was built now; a reused model points to the run that
    holds it."""
    tracker = Tracker(result.run_id)
    summary = result.facts.summary
    # a model built now logged its curves live, epoch by epoch (the run's sink); a reused one's run
    # gets them here
    if result.cache == "hit":  # in one write (bert's masked-LM pretraining curves too)
        tracker.curves(
            [
                ({k: v for k, v in row.items() if k != "epoch"}, row["epoch"])
                for row in summary.get("history", [])
            ]
            + [
                ({f"mlm_{k}": v for k, v in row.items() if k != "epoch"}, row["epoch"])
                for row in summary.get("pretrain_history", [])
            ]
        )
    facts = {
        k: summary[k] for k in ("parameters", "best_epoch", "resumed_from_epoch") if k in summary
    }
    if facts:
        tracker.metrics(facts)
    if summary.get("cut_short"):  # the budget stopped it: the model run says so beside its curves
        tracker.tags({"zhpipe.cut_short": summary["cut_short"]})
    if result.cache == "hit":  # logged with its training: point to it, upload nothing
        uri = _logged_by_builder(run, result.stage, result.key)
        if uri:
            tracker.tags({"zhpipe.model_uri": uri})
        return
    if MODELS[name].is_language_model:
        tracker.artifact(result.path / name, "model")
        return
    tracker.tags(
        {
            "zhpipe.model_uri": _log_model(
                run, tracker.run_id, name, result.path / name, result.facts.labels
            )
        }
    )


def _logged_by_builder(run: RunContext, stage: str, key: str) -> str | None:
    """The model URI the run that built a reused unit logged it under (its model run's tag: a
    pointer only, the files are checked against the stage store's record when loaded); None when
    that run is in another tracking store (this one moved aside or new) or has not logged it yet: it
    is then logged again when it is registered."""
    source = run.store.manifest(stage, key).mlflow_run_id
    if source not in Tracker.existing({source or ""}):
        return None
    return client().get_run(source).data.tags.get("zhpipe.model_uri")


def _log_model(run: RunContext, run_id: str, name: str, folder: Path, labels: list[str]) -> str:
    """A classifier (or tagger) as an MLflow model that takes raw text (models from code, weights in
    safe formats), cleaned and segmented as this pipeline does; returns its URI. The digest of its
    files goes into the stage store (`trust.vouch`): only files that match it are ever loaded
    again."""
    # MLflow's pyfunc machinery: only when a model is logged
    from flows.track.serving import log_model

    return log_model(run_id, name, folder, labels, run.config, store=run.store).model_uri


def _model_run(run: RunContext, name: str) -> str:
    """A model run for a model whose training was reused outside this run's train stage (--from
    evaluate)."""
    return Tracker.start(
        run.experiment,
        model_run_name(run, name),
        parent=run.parent_run_id,
        tags={"zhpipe.model": name, "zhpipe.cache": "hit"},
    ).run_id


def register(
    run: RunContext, evaluation: StageResult, segment: StageResult, model_runs: dict[str, str]
) -> None:
    """Register the best classifier (a pyfunc that takes raw text) and apply the champion rule; the
    parent run's tags say what happened and why."""
    best = evaluation.facts.best_model
    metric = run.config.kind.metric(run.config)
    unit = model_unit(run.config.kind.training.name, best)
    # by this run's model run; else by the run that built it, which may have logged it since this
    # run reused the unit
    uri = client().get_run(model_runs[best]).data.tags.get(
        "zhpipe.model_uri"
    ) or _logged_by_builder(run, unit, run.keys[unit])
    if not uri:  # trained elsewhere and never logged as a classifier here: log it now
        uri = _log_model(run, model_runs[best], best, model_dir(run, best), evaluation.facts.labels)
    from flows.track.serving import served_outcomes

    decision = register_best(
        uri,
        model_runs[best],
        run.config.identity,
        best,
        Rows(segment.path / "test.parquet"),
        metric,
        evaluation.facts.results[best][f"test_{metric}"],
        model_key=run.keys[model_unit(run.config.kind.training.name, best)],
        rescore=lambda model_uri, test: served_outcomes(model_uri, test, metric, store=run.store),
        rule=run.config.section(run.config.kind.selection.name).champion,
        store=run.store,
    )
    _say_cut(evaluation, decision, best)
    parent = Tracker(run.parent_run_id)
    note = parent.client.get_run(run.parent_run_id).data.tags.get("mlflow.note.content", "")
    parent.tags(
        {
            "zhpipe.registered": f"{decision.name}/{decision.version}",
            "zhpipe.test_sha256": decision.test_sha256,
            "zhpipe.champion": (
                "yes" if decision.champion else "already" if decision.holds else "no"
            ),
            "zhpipe.champion_reason": decision.reason,
            # the run page's description: MLflow lists under "Registered models" only versions
            # logged by the run itself, and a version comes from its model's run
            "mlflow.note.content": (note + "\n\n" if note else "")
            + f"Registered **{decision.name} version "
            f"{decision.version}** ({best}){' @champion' if decision.holds else ''}: "
            f"{decision.reason}",
        }
    )
    scores = {f"challenger_test_{metric}": decision.score}
    if decision.champion_score is not None:
        scores[f"champion_test_{metric}"] = decision.champion_score
    parent.metrics(scores)
    # promoted, or kept out now (a reread decision is no news)
    if not decision.settled and (decision.champion or not decision.holds):
        from flows.track.alerts import emit

        emit(
            "zhpipe.champion.promoted" if decision.champion else "zhpipe.champion.kept",
            run.config,
            {
                "message": f"{run.config.identity}: version {decision.version} ({best}): "
                f"{decision.reason}",
                "version": decision.version,
                "model": best,
                "score": decision.score,
                "champion_score": decision.champion_score,
            },
        )


def _say_cut(evaluation: StageResult, decision, best: str) -> None:
    """A registered model the training budget cut short says so: a line, and a tag on its registered
    version."""
    import json

    chosen = evaluation.path / "chosen.json"
    cut = (
        json.loads(chosen.read_text(encoding="utf-8")).get("cut_short", "")
        if chosen.is_file()
        else ""
    )
    if cut:
        log.warning(
            "registry: %s version %s (%s) was cut short by the training budget: %s",
            decision.name,
            decision.version,
            best,
            cut,
        )
        client().set_model_version_tag(
            decision.name, str(decision.version), "zhpipe.cut_short", cut
        )
