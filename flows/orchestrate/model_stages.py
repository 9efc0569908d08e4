"""Per-model stages (declared with `PerModel` in tasks/stages.py: train and evaluate): each model of
the model list is trained, cached and scored as its own unit (`train.<model>`, `evaluate.<model>`)
with its own key and one MLflow run per model (params, per-epoch curves, test metrics, the saved
model and its plots), so changing one model's params rebuilds that model and the comparison only.
The run engine (flows/orchestrate/engine.py) walks the units; a `ModelStage` is what one such stage
adds to each: the budget that races them, the members an ensemble reads, the failures the other
models outlive, and after the stage that selects, the best model registered under the champion
rule."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from flows.orchestrate.execute import RunContext
from flows.orchestrate.tracking import artifact_key
from flows.plan.cache import StageResult
from flows.plan.keys import members_of, model_units, record_cut, training_order, without_models
from flows.plan.store import Manifest
from flows.track.champion import kept_test_sha256, register_best
from flows.track.tracker import Tracker, client
from tasks.core import Unit, model_unit
from tasks.errors import ZhpipeError
from tasks.models.racing import NOT_TRAINED, Budget, BudgetCut, from_history, racing
from tasks.stages import MODELS, Stage
from tasks.util.io import Rows

log = logging.getLogger("zhpipe")


class ModelStage:
    """One per-model stage of a run: the order its model units are walked in (cheapest first under
    a training budget, ensembles last), the clock that races them, and the models that failed."""

    def __init__(self, run: RunContext, spec: Stage, budget: bool = True):
        self.run, self.spec = run, spec
        # a tuning trial's unit is not raced (Optuna prunes it)
        self.clock = self._budget() if budget else None
        self.failed: dict[str, str] = {}

    def units(self) -> list[Unit]:
        """Its model units in the order they are walked: with a budget, cheapest first (the
        baselines lead before a network races them)."""
        config, name = self.run.config, self.spec.name
        return model_units(config, name) if self.clock is None else training_order(config, name)

    def take(
        self, unit: Unit, upstream: dict[str, StageResult], built: dict[str, StageResult]
    ) -> StageResult | None:
        """One model's unit as a Prefect task run of its own, reused or built; None when the budget
        left it no time or it failed (the other models go on: a team's estimator that raises)."""
        name, clock = unit.model, self.clock
        cut = clock.cut if clock is not None else {}
        lost = [m for m in members_of(self.run.config, name) if m in self.failed or m in cut]
        if lost:
            if lost[0] in cut:
                clock.skipped(name, f"{NOT_TRAINED} (its member {lost[0]} was not trained)")
            else:
                self.failed[name] = f"its member {lost[0]} failed"
            return None
        try:
            result = as_task_run(unit, lambda: self.unit_run(name, upstream, built))
        # not started, or stopped in its first epoch: no model, no row, no registry
        except BudgetCut as e:
            clock.skipped(name, str(e))
            log.warning("%s: %s", unit, e)
            return None
        except ZhpipeError as e:
            if not self.spec.models.trains or MODELS[name].members is not None:
                raise
            self.failed[name] = str(e)
            log.error("%s: failed: %s; the other models go on", unit, e)
            return None
        if clock is not None:
            clock.finished(name, result.facts.summary or {})
        return result

    def close(self, trained: list[str]) -> None:
        """After its model units, before the stage gathers them: what the budget did is said (the
        models it cut leave the run's plan), and the models that failed fail the stage."""
        if self.clock is not None:
            self._said()
        if self.failed:
            n = len(self.failed)
            raise ZhpipeError(
                f"{self.spec.name}: {n} model{'s' if n > 1 else ''} failed: "
                f"{'; '.join(f'{m}: {why}' for m, why in self.failed.items())}; "
                f"{'trained and kept: ' + ', '.join(trained) if trained else 'none trained'} "
                "(the next run reuses them)"
            )

    def gathered(self, result: StageResult, test: StageResult) -> None:
        """After the stage that selects: the best model registered (every run: a best model a
        killed run did not register is registered now), the comparison shown in Prefect."""
        if not self.spec.models.selects:
            return
        self.register(result, test, {unit.model: r.run_id for unit, r in result.parts.items()})
        comparison = result.path / "comparison.md"
        if comparison.is_file():
            from prefect.artifacts import create_markdown_artifact

            create_markdown_artifact(
                markdown=f"# {self.run.config.name}: model comparison (test split)\n\n"
                + comparison.read_text(encoding="utf-8"),
                key=artifact_key(self.run.config.name, "comparison"),
                description=f"zhpipe {self.spec.name}",
            )

    def _budget(self) -> Budget | None:
        """The training stage's clock (`train.budget`, `train.model_budget`;
        tasks/models/racing.py), None without one."""
        if not self.spec.models or not self.spec.models.trains:
            return None
        config = self.run.config
        section = config.section(self.spec.name)
        budget, per_model = getattr(section, "budget", None), getattr(section, "model_budget", None)
        if budget is None and per_model is None:
            return None
        return Budget(
            budget,
            per_model,
            [u.model for u in model_units(config, self.spec.name) if MODELS[u.model].races],
            f"val_{config.kind.metric(config)}",
        )

    def _said(self) -> None:
        """The models the budget left no time for leave this run's model list (the stages that
        gather, compare and register are planned without them, and name them); what the budget did
        is a tag on the parent run, which the report and `zhpipe run` show."""
        run, clock = self.run, self.clock
        if clock.cut:
            # a rerun of the same training keeps the decision
            record_cut(run.store, run.config, run.keys, clock.cut)
            run.config = without_models(run.config, clock.cut)
            run.replan()
        said = clock.said()
        if clock.budget is not None:
            log.info(
                "%s: the models took %.0f s of the %.0f s budget%s",
                self.spec.name,
                clock.spent(),
                clock.budget,
                f"; {said}" if said else "",
            )
        if said and run.parent_run_id:
            Tracker(run.parent_run_id).tags({"zhpipe.budget": said[:5000]})

    def _history(self, name: str, upstream: dict[str, StageResult]) -> float | None:
        """A model's estimated training seconds from its earlier builds in the store (any key; a
        build the budget cut short left out), scaled by the rows of the stage's first input."""
        unit, store = model_unit(self.spec.name, name), self.run.store
        builds = []
        for key in store.others(unit, self.run.keys[unit]):
            try:
                m = store.manifest(unit, key)
            except (OSError, ValueError):
                continue
            if not m.metrics.get("cut_short"):
                builds.append((m.created, m.seconds, m.rows))
        first = upstream.get(self.spec.needs[0]) if self.spec.needs else None
        if not builds or first is None or not first.rows:
            return None
        return from_history(
            [(seconds, rows) for _, seconds, rows in sorted(builds, reverse=True)], first.rows
        )

    def unit_run(
        self,
        name: str,
        upstream: dict[str, StageResult],
        built: dict[str, StageResult] | None = None,
        tracker: Tracker | None = None,
    ) -> StageResult:
        """One model's unit, reused or built. A unit that trains opens the model's run (or logs into
        `tracker`'s: a tuning trial's), its ensemble reads its members' units from `built`; a unit
        that reads another per-model stage's unit of the same model (evaluate reads train's) logs
        into that unit's model run."""
        run, spec, built = self.run, self.spec, built or {}
        inputs = {k: v for k, v in upstream.items() if spec.reads(k, MODELS[name])}
        # in place of that stage's gathered output: this model's unit of it
        for stage in spec.models.reads:
            unit = model_unit(stage, name)
            inputs[stage] = built.get(unit) or run.reuse(unit)
        if spec.models.trains:
            inputs |= {
                model_unit(spec.name, m): built[model_unit(spec.name, m)]
                for m in members_of(run.config, name)
            }
        elif tracker is None:
            tracker = Tracker(
                next((inputs[s].run_id for s in spec.models.reads if inputs[s].run_id), None)
                or self._model_run(name)
            )
        result = run.run(
            model_unit(spec.name, name),
            inputs,
            self._build(name, upstream),
            run_name=model_run_name(run.title or run.config.identity, name),
            tags={"zhpipe.model": name},
            tracker=tracker,
        )
        if spec.models.trains:
            self._track_training(result, name)
        return result

    def _build(self, name: str, upstream: dict[str, StageResult]) -> Callable:
        """A model's build; under a budget, in its race: its share is taken when it starts, and it
        starts only when its estimate (asked then: a reused unit asks none) fits (`Race.admit`); a
        network's history is of all its epochs, and in a race it may train fewer, judged from its
        first batches. A cut says so in its summary and metrics."""
        build, clock = self.spec.build_model, self.clock
        if clock is None:
            return lambda ctx: build(ctx, name)
        races = MODELS[name].races

        def raced(ctx):
            estimate = None if races else self._history(name, upstream)
            with racing(clock.race(name, races, estimate)) as race:
                if race is not None:
                    race.admit()
                out = build(ctx, name)
            if race is not None and race.cut:
                log.info("%s: cut short by the budget: %s", name, race.cut)
                out.facts.summary["cut_short"] = race.cut
                out.metrics["cut_short"] = 1.0
            return out

        return raced

    def _track_training(self, result: StageResult, name: str) -> None:
        """The model run (its unit's totals are logged by the run engine): per-epoch curves and
        facts every time; the saved model only when it was built now; a reused model points to the
        run that holds it."""
        tracker = Tracker(result.run_id)
        summary = result.facts.summary
        # a model built now logged its curves live, epoch by epoch (the run's sink); a reused one's
        # run gets them here
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
            k: summary[k]
            for k in ("parameters", "best_epoch", "resumed_from_epoch")
            if k in summary
        }
        if facts:
            tracker.metrics(facts)
        if summary.get("cut_short"):  # the budget stopped it: the model run says so
            tracker.tags({"zhpipe.cut_short": summary["cut_short"]})
        if result.cache == "hit":  # logged with its training: point to it, upload nothing
            uri = self._logged_by_builder(result.stage, result.key)
            if uri:
                tracker.tags({"zhpipe.model_uri": uri})
            return
        if MODELS[name].is_language_model:
            tracker.artifact(result.path / name, "model")
            return
        uri = self._log_model(tracker.run_id, name, result.path / name, result.facts.labels)
        tracker.tags({"zhpipe.model_uri": uri})

    def _logged_by_builder(self, stage: str, key: str) -> str | None:
        """The model URI the run that built a reused unit logged it under (its model run's tag: a
        pointer only, the files are checked against the stage store's record when loaded); None
        when that run is in another tracking store (this one moved aside or new) or has not logged
        it yet: it is then logged again when it is registered."""
        source = self.run.store.manifest(stage, key).mlflow_run_id
        if source not in Tracker.existing({source or ""}):
            return None
        return client().get_run(source).data.tags.get("zhpipe.model_uri")

    def _log_model(self, run_id: str, name: str, folder: Path, labels: list[str]) -> str:
        """A classifier (or tagger) as an MLflow model that takes raw text (models from code,
        weights in safe formats), cleaned and segmented as this pipeline does; returns its URI. The
        digest of its files goes into the stage store (`trust.vouch`): only files that match it are
        ever loaded again."""
        # MLflow's pyfunc machinery: only when a model is logged
        from flows.track.serving import log_model

        return log_model(
            run_id, name, folder, labels, self.run.config, store=self.run.store
        ).model_uri

    def _model_run(self, name: str) -> str:
        """A model run for a model whose training was reused outside this run's train stage (--from
        evaluate)."""
        run = self.run
        return Tracker.start(
            run.experiment,
            model_run_name(run.title or run.config.identity, name),
            parent=run.parent_run_id,
            tags={"zhpipe.model": name, "zhpipe.cache": "hit"},
        ).run_id

    def register(
        self, evaluation: StageResult, segment: StageResult, model_runs: dict[str, str]
    ) -> None:
        """Register the best classifier (a pyfunc that takes raw text) and apply the champion rule;
        the parent run's tags say what happened and why."""
        run = self.run
        best, kind = evaluation.facts.best_model, run.config.kind
        metric = kind.metric(run.config)
        unit = model_unit(kind.training.name, best)
        # by this run's model run; else by the run that built it, which may have logged it since
        # this run reused the unit
        uri = client().get_run(model_runs[best]).data.tags.get(
            "zhpipe.model_uri"
        ) or self._logged_by_builder(unit, run.keys[unit])
        if not uri:  # trained elsewhere and never logged as a classifier here: log it now
            folder = run.store.local(unit, run.keys[unit]) / best
            uri = self._log_model(model_runs[best], best, folder, evaluation.facts.labels)
        from flows.track.serving import served_outcomes

        test = Rows(segment.path / "test.parquet")
        written = Manifest.read(segment.path).files.get("test.parquet") or {}
        decision = register_best(
            uri,
            model_runs[best],
            run.config.identity,
            best,
            test,
            metric,
            evaluation.facts.results[best][f"test_{metric}"],
            model_key=run.keys[unit],
            rescore=lambda model_uri, test: served_outcomes(
                model_uri, test, metric, store=run.store
            ),
            rule=run.config.section(kind.selection.name).champion,
            store=run.store,
            test_digest=kept_test_sha256(test, written.get("sha256"), run.store),
        )
        _say_cut(evaluation, decision, best)
        _tell(run.config, run.parent_run_id, decision, best, metric)


def _tell(config, parent_run_id: str, decision, best: str, metric: str) -> None:
    """What the champion rule decided: tags and scores on the parent run (its description names the
    registered version), and an alert when the champion changed or a worse version was kept out."""
    parent = Tracker(parent_run_id)
    note = parent.client.get_run(parent_run_id).data.tags.get("mlflow.note.content", "")
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
            config,
            {
                "message": f"{config.identity}: version {decision.version} ({best}): "
                f"{decision.reason}",
                "version": decision.version,
                "model": best,
                "score": decision.score,
                "champion_score": decision.champion_score,
            },
        )


def as_task_run(unit: str, fn: Callable[[], StageResult], description: str | None = None):
    """A unit as a Prefect task run of its own, named after it, so the Prefect UI shows each stage
    and each model (outside a flow run it is a plain call)."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return fn()
    return task(name=unit, task_run_name=unit, cache_policy=NO_CACHE, description=description)(fn)()


def model_run_name(title: str, model: str) -> str:
    """`textcnn · waimai train.epochs=2 12-02 10:31:05`: the model, then its parent run's name
    (`title`), so that model runs of different pipeline runs read apart in a comparison."""
    return f"{model} · {title}"


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
