"""The run engine: one loop over the units a run's keys were planned for (flows/plan/keys.py), in
graph order. For each unit the stage cache restores it, or it is built and saved (`RunContext.run`:
the unit is looked up once, under its lock, where `--force` and verification are decided). What
differs between units is only the kind of build each carries (`Engine.take`):

- a stage's own unit, built here, or beside the training in a process of its own (`Stage.beside`);
- a partition unit (`clean:2026-12-01.csv`), judged by the data checks, which may hold it out: the
  plan changes, and the walk follows it;
- a model unit (`train.textcnn`), raced against the training budget (`ModelStage`);
- a stage's unit that gathers its partitions or its models;
- the training stage on another work pool, whose worker walks this same loop over that stage.

A stage that a selected stage needs but was not selected itself is read from the store. Each stage
and model unit is a Prefect task run of its own; a partition unit is not (a night reuses most)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from flows.orchestrate import night
from flows.orchestrate.execute import RunContext
from flows.orchestrate.model_stages import ModelStage, as_task_run
from flows.orchestrate.parent_run import finish_run
from flows.orchestrate.workers import train_deployment
from flows.plan import project
from flows.plan.cache import StageResult
from flows.plan.keys import unread
from flows.pools.chunks import shutdown as shutdown_cluster
from flows.track.tracker import Tracker, experiment_id
from tasks.core import Unit, model_unit, partition_unit
from tasks.errors import ZhpipeError
from tasks.graph import Stage

log = logging.getLogger("zhpipe")


@dataclass
class Engine:
    """One walk over a run's units; `stages` are the selected stages (graph order)."""

    run: RunContext
    stages: list[str]
    # the walk of a train deployment's worker: the training stage is built here, and nothing else
    worker: bool = False
    results: dict[Unit, StageResult] = field(default_factory=dict)  # every unit taken, by unit
    models: dict[str, ModelStage] = field(default_factory=dict)  # the per-model stages walked
    held: dict = field(default_factory=dict)  # the units to build beside the training: inputs
    beside: dict = field(default_factory=dict)  # those started: their Prefect futures
    checked: int = 0  # the run's replans when the units taken were last checked against its keys

    def __post_init__(self):
        self.kind = self.run.config.kind
        needs = {d for s in self.stages for d in self.kind.stages[s].needs}
        every = [s for s in self.kind.stages if s in needs or s in self.stages]
        # the stages read from the store: embed, when no model reads it, is not even read
        self.read = set(every) - unread(self.run.config, every) - set(self.stages)
        self.remote = not self.worker and self._routed()

    def walk(self) -> dict[str, StageResult]:
        """The run: every unit in graph order, restored or built; then each stage's result (its
        partition or model units in `parts`), in graph order. A run with nothing to build reads them
        all from the cache, and its parent run names the runs that built them."""
        if self.remote:  # what would stop the remote training stops the run before the data stages
            self._check_route()
        elif not self.worker and (reused := self.run.reuse_all(self.stages)) is not None:
            if self._reused(reused):
                self.results.update({Unit.parse(s): r for s, r in reused.items()})
                return reused
        training = self.kind.training
        try:
            for unit in self.units():
                self._raise_beside()
                if training is not None and unit.stage == training.name:
                    self._start_beside()  # beside the training, which leaves cores idle longest
                if not self._taken(unit):
                    self.step(unit)
            self._start_beside()
        except BaseException:
            for future in self.beside.values():  # nothing of a failed run goes on after it ends
                future.wait()
            raise
        self._join_beside()
        return self.stage_results()

    def close(self, ok: bool, error: str) -> None:
        """The run's end, failed or not: the cluster stopped, the night's report, the parent run
        closed, the lease let go."""
        shutdown_cluster()
        results = self.stage_results()
        try:
            night.record(self.run, results, ok, "" if ok else error)
            finish_run(self.run, {k: r for k, r in results.items() if k in self.stages}, ok)
        finally:
            self.run.lease.release()

    def stage_results(self) -> dict[str, StageResult]:
        """The stages taken so far, in graph order, each with its partitions or models (`parts`)."""
        return {s: self.results[Unit(s)] for s in self.kind.stages if Unit(s) in self.results}

    def _reused(self, results: dict[str, StageResult]) -> bool:
        """A run that builds nothing records no run per stage or model (there is nothing new to
        compare): its parent run names the run that built each reused output (tags
        `zhpipe.reused.<unit>`, followed by `zhpipe compare`), and the champion rule is applied as
        after any selection. False (nothing recorded) when a run that built one of them is not in
        this tracking store."""
        run, kind = self.run, self.kind
        # registering reads the trained models' runs
        named = set(results) | kind.units_read(results)
        built_by = {
            u: run.store.manifest(u, run.keys[u]).mlflow_run_id or ""
            for u in run.keys
            if not u.part and u.stage in named
        }
        if set(built_by.values()) - Tracker.existing(set(built_by.values())):
            # built under another tracking store (moved aside, or new): recorded the long way
            return False
        parent = Tracker(run.parent_run_id)
        runs = f"#/experiments/{experiment_id(run.experiment)}/runs"
        parent.tags(
            {
                "zhpipe.reused": "all",
                "mlflow.note.content": "Nothing was built: every output of this run was "
                "reused. The runs that built them: "
                + ", ".join(f"{u} [{r[:8]}]({runs}/{r})" for u, r in built_by.items() if r),
                **{f"zhpipe.reused.{u}": r for u, r in built_by.items()},
            }
        )
        selection = results.get(kind.selection.name) if kind.selection else None
        if selection is not None:
            model_runs = {
                m: built_by[model_unit(kind.training.name, m)]
                for m in {u.model for u in selection.parts}
            }
            ModelStage(run, kind.selection).register(
                selection,
                results.get(kind.test_split().name) or run.reuse(kind.test_split().name),
                model_runs,
            )
        return True

    def units(self) -> Iterator[Unit]:
        """The plan's units in graph order: a stage's partitions or models, then the stage's own
        unit. The plan may change while they are walked (a partition held out, models the budget
        cut), and the walk follows it."""
        for spec in self.kind.stages.values():
            if spec.name in self.stages:
                yield from self.parts(spec)
            if spec.name in self.stages or spec.name in self.read:
                yield Unit(spec.name)

    def parts(self, spec: Stage) -> Iterator[Unit]:
        """A selected stage's partition units (in order; a held-out one's place is the next's) or
        model units (in its `ModelStage`'s order)."""
        if spec.models is not None and not (self.remote and spec is self.kind.training):
            self.models[spec.name] = ModelStage(self.run, spec)
            yield from self.models[spec.name].units()
        elif self.run.config.per_partition(spec):
            i = 0
            while i < len(self.run.partitions):
                unit = partition_unit(spec.name, self.run.partitions[i].name)
                yield unit
                i += unit in self.results

    def step(self, unit: Unit) -> None:
        """Take one unit; then a stage before it whose key the plan no longer holds (a check held a
        partition out) is walked again, in graph order."""
        result = self.take(unit)
        if result is not None:
            self.results[unit] = result
        if self.checked == self.run.replans:  # keys change only when the run plans them again
            return
        self.checked = self.run.replans
        stale = [u for u in self.results if u == u.stage and not self._taken(u)]
        for again in stale:
            spec = self.kind.stages[again]
            for u in [*(self.parts(spec) if self.run.config.per_partition(spec) else ()), again]:
                if not self._taken(u) and (result := self.take(u)) is not None:
                    self.results[u] = result

    def _taken(self, unit: Unit) -> bool:
        """Whether the unit is taken under the key the plan holds for it now."""
        return unit in self.results and self.results[unit].key == self.run.keys.get(unit)

    def take(self, unit: Unit) -> StageResult | None:
        """One unit, by the kind of build it carries; None when it is not (yet) taken: held out by
        a check, cut by the budget, failed among models that go on, or held to run beside."""
        spec, run = self.kind.stages[unit.stage], self.run
        if unit.stage not in self.stages:
            return run.reuse(unit)
        if unit.part:
            return self._partition(spec, unit)
        if unit.model:
            return self.models[spec.name].take(unit, self.inputs(spec), self.results)
        if self.remote and spec is self.kind.training:
            return self._train_remote()
        if spec.beside and run.executor is None and not self.worker:
            self.held[unit] = self.inputs(spec)
            return None
        return as_task_run(unit, lambda: self._stage(spec, self.inputs(spec)), spec.help)

    def inputs(self, spec: Stage) -> dict[str, StageResult]:
        """A stage's inputs by the stage name of each need (one no model reads is left out)."""
        return {d: self.results[Unit(d)] for d in spec.needs if Unit(d) in self.results}

    def gathered(self, spec: Stage) -> dict[Unit, StageResult]:
        """The partition or model units a stage gathers: those of the plan as it is now."""
        if spec.models is not None:
            units = [u for u in self.results if u.stage == spec.name and u.model]
        else:
            units = [partition_unit(spec.name, p.name) for p in self.run.partitions]
        return {u: self.results[u] for u in units if u in self.results and u in self.run.keys}

    def _stage(self, spec: Stage, inputs: dict[str, StageResult], build=None) -> StageResult:
        """A stage's own unit: built from its inputs, or gathering its partitions or models."""
        run = self.run
        if spec.models is not None:
            self.models[spec.name].close([u.model for u in self.gathered(spec)])
            parts = self.gathered(spec)
            result = run.run(spec.name, parts, spec.build)
        elif self.run.config.per_partition(spec):
            from tasks.shared import partitions as gather

            parts = self.gathered(spec)
            built = sum(r.cache == "miss" for r in parts.values())
            log.info(
                "%s: %d partitions, %d cached, %d built",
                *(spec.name, len(parts), len(parts) - built, built),
            )
            result = run.run(spec.name, parts, spec.gather or gather.build)
            # partitions included
            result.seconds = round(result.seconds + sum(r.seconds for r in parts.values()), 3)
        else:
            result, parts = run.run(spec.name, inputs, build or spec.build), {}
            if spec.checked and run.gate is not None:
                run.gate.whole(result)
        result.parts = parts
        if spec.models is not None:
            test = self.kind.test_split().name
            self.models[spec.name].gathered(result, inputs.get(test) or run.reuse(test))
        return result

    def _partition(self, spec: Stage, unit: Unit) -> StageResult | None:
        """A partition unit, from the same partition of each stage it needs (and for a cumulative
        stage, every earlier partition of its own); the data checks judge each partition of the
        checked stage: one held out is planned away (None), and the partitions after it are built
        without it."""
        run, part = self.run, next(p for p in self.run.partitions if p.name == unit.part)
        inputs = {
            d: self.results.get(partition_unit(d, part.name))
            or run.reuse(partition_unit(d, part.name))
            for d in spec.needs
        }
        names = [p.name for p in run.partitions]
        before = set(names[: names.index(part.name)])
        earlier = {u: r for u, r in self.gathered(spec).items() if u.part in before}
        if spec.cumulative:
            inputs |= earlier
        result = run.run(unit, inputs, spec.part_build or spec.build, quiet=True)
        held = (
            spec.checked
            and run.gate is not None
            and run.gate.part(part.name, part.fingerprint(), result, list(earlier.values()))
        )
        if held:
            run.replan()
            return None
        return result

    def _start_beside(self) -> None:
        """The stages held to run beside: each a Prefect task in the flow's thread pool, building in
        a process of its own (`in_a_process`)."""
        from prefect import task
        from prefect.cache_policies import NO_CACHE

        for unit, inputs in self.held.items():
            spec = self.kind.stages[unit.stage]
            work = task(name=unit, task_run_name=unit, cache_policy=NO_CACHE, description=spec.help)
            self.beside[unit] = work(self._elsewhere(spec, inputs)).submit()
        self.held.clear()

    def _elsewhere(self, spec: Stage, inputs: dict[str, StageResult]):
        """A stage's own unit, built in a process of its own: a function of nothing, which Prefect
        submits without walking its arguments."""
        return lambda: self._stage(spec, inputs, in_a_process(spec.build))

    def _raise_beside(self) -> None:
        """The error of one that failed: the run stops at its next unit, not its last."""
        for future in self.beside.values():
            if future.wrapped_future.done():
                future.result()

    def _join_beside(self) -> None:
        """Each one's result once all have ended; the first error raised. One whose key the run
        planned again while it ran (a check held a partition out) is built again."""
        done = {u: f.result(raise_on_failure=False) for u, f in self.beside.items()}
        for unit, outcome in done.items():
            if isinstance(outcome, BaseException):
                raise outcome
            if outcome.key != self.run.keys[unit]:
                spec = self.kind.stages[unit.stage]
                inputs = {d: self.run.reuse(d) for d in spec.needs}
                outcome = as_task_run(unit, lambda s=spec, i=inputs: self._stage(s, i), spec.help)
            self.results[unit] = outcome

    def _routed(self) -> bool:
        """Whether this run's training stage goes to the pipeline's train work pool (into the same
        store and MLflow parent run): when a pool is set and the stage is to be built."""
        training, run = self.kind.training, self.run
        pool = (
            training is not None
            and training.name in self.stages
            and run.config.section(training.name).work_pool
        )
        built = training is not None and run.published(training.name)
        return bool(pool) and (training.name in run.force or not built)

    def _check_route(self) -> None:
        """The train stage goes to another work pool: its deployment exists and the run trains what
        it can train."""
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound

        config = self.run.config
        name, pool = (
            train_deployment(config.name),
            config.section(self.kind.training.name).work_pool,
        )
        if self.run.request.source:
            raise ZhpipeError(
                "train: a run with --source cannot train on another work pool (a deployment "
                "trains what pipelines.yaml declares); declare the source in the pipeline, or "
                "train here with --set train.work_pool=null"
            )
        with get_client(sync_client=True) as client:
            try:
                client.read_deployment_by_name(name)
            except ObjectNotFound:
                raise ZhpipeError(
                    f"train: stages.train.work_pool is '{pool}' but the deployment '{name}' does "
                    f"not exist on the Prefect server; create it with `zhpipe deploy "
                    f"{config.name}`, or train here with --set train.work_pool=null"
                ) from None

    def _train_remote(self) -> StageResult:
        """The training stage as a run of the pipeline's train deployment, waited for; the result is
        read back from the stage store the worker wrote to."""
        from prefect.deployments import run_deployment

        run = self.run
        name, stage = train_deployment(run.config.name), self.kind.training.name
        pool = run.config.section(stage).work_pool
        log.info("train: submitting to work pool '%s' (deployment %s) and waiting", pool, name)
        t0 = time.perf_counter()
        # what the train deployment lets a run set: its overrides (its own, or allowed by the
        # pipeline), never a source or storage (the worker uses the pipeline's, or its
        # ZHPIPE_STORAGE)
        parameters = {
            **run.request.parameters(),
            "parent_run_id": run.parent_run_id,
            "force": stage in run.force,
            "project_dir": str(project.current().root),
            # the worker plans the same keys without the corpus (a worker needs the project's
            # pipelines.yaml, not its data)
            "source_fingerprint": next(
                c["inputs"]["source"] for c in run.causes.values() if "source" in c["inputs"]
            ),
        }
        flow_run = run_deployment(name, parameters=parameters, timeout=None, poll_interval=2)
        if not flow_run.state or not flow_run.state.is_completed():
            state = flow_run.state.name if flow_run.state else "unknown"
            raise ZhpipeError(
                f"train: the run '{flow_run.name}' of {name} on work pool '{pool}' ended {state}: "
                f"{flow_run.state.message if flow_run.state else ''}"
            )
        if not run.published(stage):
            raise ZhpipeError(
                f"train: the run '{flow_run.name}' on work pool '{pool}' completed but "
                f"{run.store.url} has no train output {run.keys[stage]}: does the worker use the "
                "same storage root?"
            )
        result = run.reuse(stage)  # built by the worker, in this run
        result.cache, result.seconds = "miss", round(time.perf_counter() - t0, 3)
        return result


def in_a_process(build):
    """`build` in a process of its own (tasks.util.pool.elsewhere), given the context without
    what stays in this process."""
    from tasks.util.pool import ChunkPool, elsewhere

    def build_elsewhere(ctx):
        alone = replace(ctx, pool=ChunkPool, sink=None, store=None, stages=None, source=None)
        return elsewhere(build, alone)

    return build_elsewhere
