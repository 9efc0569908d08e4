"""Stage execution: build or reuse each unit of a run (its keys planned by flows/plan/keys.py) and track it in
MLflow."""
from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

from flows.orchestrate.gate import Gate
from flows.orchestrate.tracking import UnitTracking
from flows.plan import project
from flows.plan.config import PipelineConfig
from flows.plan.keys import unit_params
from flows.plan.leases import Lease
from flows.plan.request import RunRequest
from flows.plan.sources import origin_of, partition_source, partitions
from flows.plan.store import Manifest, StageStore, stage_key
from flows.pools.chunks import pool_for
from flows.pools.slots import global_slot
from flows.track.tracker import Tracker
from tasks.core import BuildContext, BuildOutput, Facts, Unit, established, partition_unit
from tasks.errors import ZhpipeError
from tasks.source.origin import Origin

log = logging.getLogger("zhpipe")


@dataclass
class StoreServices:
    """The store's shared folders as a stage sees them (tasks.core.StoreAccess)."""

    config: PipelineConfig
    store: StageStore
    origin: Origin | None = None  # the run's (the validators its keys were planned with)

    def downloads(self, url: str) -> Path:
        return self.store.downloads(url)

    def cache_file(self, name: str) -> Path:
        return self.store.cache_file(name)

    def expect(self, source):
        """An unverified http(s) source is re-checked against the validators its key was planned with."""
        self.origin = self.origin or origin_of(self.config)
        return self.origin.expect(source)

    def registered(self, uri: str) -> tuple[str, Path]:
        """A registered model (models:/...) downloaded into the store's cache."""
        from flows.track.champion import download

        return download(uri, self.store.cache_file("registered"), self.store)


@dataclass
class StageResult:
    """What a stage task hands to the next: a path and a few facts, never the data itself."""

    stage: Unit  # the unit it is the output of
    key: str
    path: Path
    cache: str  # "hit" or "miss"
    seconds: float
    rows: int | None
    metrics: dict[str, float]
    facts: Facts
    run_id: str | None = None  # the MLflow run this pipeline run tracked it in
    parts: dict[str, "StageResult"] = field(default_factory=dict)  # train/evaluate: their model units


@dataclass
class RunContext:
    """One pipeline run: config, planned keys, store, MLflow parent run, forced stages."""

    config: PipelineConfig
    store: StageStore
    keys: dict[str, str]
    experiment: str
    parent_run_id: str | None
    force: set[str] = field(default_factory=set)
    # chunked work: None = local processes, "local" = a local Dask cluster, else its address
    executor: str | None = None
    causes: dict[str, dict[str, Any]] = field(default_factory=dict)  # per stage, what its key hashed
    verify: bool = False  # hash every file of a reused output, not only the small ones
    origin: Origin | None = None  # the source as the keys were planned (the download re-checks against it)
    title: str = ""  # the parent run's name (pipeline, changed settings, time): its model runs are named after it
    gate: Gate | None = None  # the data checks (flows/orchestrate/gate.py), judged on the checked stage's output
    # the run's hold on its keys in the store (flows/plan/leases.py): `zhpipe gc` leaves them alone
    lease: Lease | None = None
    request: RunRequest | None = None  # what the run was asked to build (a tuning trial's runs have none)
    tracking: Callable[..., UnitTracking] = UnitTracking  # the hooks around each unit (its MLflow run)
    _partitions: list[str] | None = None

    def reuse(self, stage: str) -> StageResult:
        """Load a cached stage without tracking it (for stages before --from)."""
        key = self.keys[stage]
        if not self.store.is_done(stage, key):
            raise ZhpipeError(
                f"stage '{stage}' has no cached output for this config (key {key}); run it first, e.g. `zhpipe run "
                f"--to {stage}`"
            )
        if not self._sound(stage, key):
            raise ZhpipeError(f"stage '{stage}': its cached output {key} failed verification and was removed; "
                              f"rebuild it with `zhpipe run --from {stage}`")
        return self._result(self.store.manifest(stage, key), "hit", 0.0)

    def reuse_all(self, stages: list[str]) -> dict[str, StageResult] | None:
        """The selected stages with their units (models, partitions), all read from the store, when each is there
        and sound and nothing is forced: a run with nothing to build (nothing is tracked per stage). Else None;
        a corrupt output found on the way is removed, for the run that follows to rebuild."""
        wanted = set(stages) | self.config.kind.units_read(stages)  # registering reads the trained models
        units = [u for u in self.keys if u.stage in wanted]
        if self.force or not all(self.store.is_done(u, self.keys[u]) for u in units):
            return None
        if not all(self._sound(u, self.keys[u]) for u in units):
            return None
        found = {u: self._result(self.store.manifest(u, self.keys[u]), "hit", 0.0) for u in units}
        for name in stages:
            found[name].parts = {u: r for u, r in found.items() if u != name and u.stage == name}
        return {name: found[name] for name in stages}

    def _sound(self, stage: str, key: str) -> bool:
        """Whether a cached output matches its manifest; a corrupt one is reported in one line and removed."""
        problems = self.store.verify(stage, key, full=self.verify)
        if problems:
            log.warning("%s: cached output %s is corrupt (%s); rebuilding it", stage, key, "; ".join(problems[:3]))
            self.store.discard(stage, key)
        return not problems

    def run(self, unit: Unit | str, inputs: dict[str, StageResult], build: Callable[[BuildContext], BuildOutput],
            tracker: Tracker | None = None, run_name: str | None = None,
            tags: dict[str, str] | None = None) -> StageResult:
        """One unit: reuse its output when its key is in the store (and sound), else build it and publish it
        atomically; the tracking hooks (flows/orchestrate/tracking.py) around it either way. `unit` is a stage or a
        model unit (`train.textcnn`, `evaluate.textcnn`); by default each gets an MLflow run of its own under the
        parent, and `tracker` logs into an existing run instead (left open). The key's lock is held throughout, so a
        concurrent run of the same key waits, then reuses."""
        stage = Unit.parse(unit)  # a stage's name as its kind declares it, or a unit planned as one
        key = self.keys[stage]
        t0 = time.perf_counter()
        with self.store.lock(stage, key, shared=global_slot):
            hit = not self.forced(stage) and self.store.is_done(stage, key) and self._sound(stage, key)
            manifest = self.store.manifest(stage, key) if hit else None
            hooks = self.tracking(self.experiment, self.parent_run_id, stage, key, manifest, tracker, run_name, tags)
            params = partial(unit_params, self.config, stage)  # asked for by the unit's own run alone
            try:
                if hit:
                    log.info("%s: cached (%s)", stage, key)
                else:
                    manifest = self._build(stage, key, inputs, build, hooks)
                hooks.done(manifest, params)
            except BaseException:
                hooks.failed(params)
                raise
        result = self._result(manifest, "hit" if hit else "miss", time.perf_counter() - t0)
        result.run_id = hooks.run_id
        return result

    def forced(self, unit: Unit) -> bool:
        """Whether --force covers this unit (a model or partition unit follows its stage)."""
        return unit.stage in self.force

    def _digest(self, name: str) -> str:
        return next(p.fingerprint() for p in partitions(self.config) if p.name == name)

    def replan(self) -> None:
        """Plan the keys again (the partitions changed: a check held one out)."""
        from flows.plan.keys import plan
        from flows.track.champion import revision

        self.causes = plan(self.config, self.origin, registry=revision)
        self.keys.clear()
        self.keys.update({unit: stage_key(c) for unit, c in self.causes.items()})
        if self.lease is not None:
            self.lease.update(self.keys)
        self._partitions = None

    def partition_names(self) -> list[str]:
        if self._partitions is None:
            self._partitions = [p.name for p in partitions(self.config)]
        return self._partitions

    def run_partitions(self, spec, upstream: dict[str, StageResult]) -> StageResult:
        """A partitioned stage: each partition's unit (from the same partition of each stage it needs, and for a
        cumulative stage every earlier partition of its own), then the stage that gathers them."""
        from tasks.shared import partitions as gather

        parts: dict[str, StageResult] = {}
        names, i = self.partition_names(), 0
        while i < len(names):
            name = names[i]
            inputs = {d: upstream[d].parts.get(partition_unit(d, name)) or self.reuse(partition_unit(d, name))
                      for d in spec.needs}
            if spec.cumulative:
                inputs |= dict(parts)
            unit = partition_unit(spec.name, name)
            result = self.run_partition(unit, inputs, getattr(spec.module, spec.part_build))
            if spec.checked and self.gate is not None and self.gate.part(name, self._digest(name), result,
                                                                         list(parts.values())):
                self.replan()  # held out: the partitions after it are planned (and built) without it
                names = self.partition_names()
                continue
            parts[unit] = result
            i += 1
        built = sum(r.cache == "miss" for r in parts.values())
        log.info("%s: %d partitions, %d cached, %d built", spec.name, len(parts), len(parts) - built, built)
        result = self.run(spec.name, parts, getattr(spec.module, spec.gather) if spec.gather else gather.build)
        result.parts = parts
        # the stage's time, partitions included
        result.seconds = round(result.seconds + sum(r.seconds for r in parts.values()), 3)
        return result

    def run_partition(self, unit: Unit, inputs: dict[str, StageResult],
                      build: Callable[[BuildContext], BuildOutput]) -> StageResult:
        """A partition unit: reused when cached (no MLflow run: a night reuses most of them), else built and
        tracked in a run of its own under the parent."""
        key = self.keys[unit]
        if not self.forced(unit) and self.store.is_done(unit, key) and self._sound(unit, key):
            log.debug("%s: cached (%s)", unit, key)
            return self._result(self.store.manifest(unit, key), "hit", 0.0)
        return self.run(unit, inputs, build)

    def _build(self, stage: Unit, key: str, inputs: dict[str, StageResult], build, hooks: UnitTracking) -> Manifest:
        """Build the unit into a temporary folder and publish it with its manifest (a failed build leaves nothing
        but what it can resume from)."""
        log.info("%s: building (%s)", stage, key)
        part = stage.part
        params_model = self.config.section(stage.stage)
        tmp = self.store.begin(stage, key)
        scratch = self.store.scratch(stage, key)
        if self.forced(stage):  # --force means from scratch, not from the last checkpoint
            shutil.rmtree(scratch)
            scratch.mkdir()
        t0 = time.perf_counter()
        ctx = BuildContext(
            inputs={name: r.path for name, r in inputs.items()},
            facts={name: r.facts for name, r in inputs.items()},
            out=tmp,
            params=params_model,
            scratch=scratch,
            pipeline=self.config.name,
            root=project.current().root,
            pool=pool_for(self.executor, self.store.remote_url),
            sink=hooks.sink,
            stages=self.config.stages,
            source=self.config.source if not part else partition_source(self.config, part),
            store=StoreServices(self.config, self.store, self.origin),
            partition=(self.partition_names().index(part), part) if part else None,
            input_metrics={name: r.metrics for name, r in inputs.items()},
            input_rows={name: r.rows for name, r in inputs.items()},
            outputs={name: self.config.kind.stages[Unit.parse(name).stage].outputs for name in inputs},
        )
        try:
            training = self.config.kind.training
            with hooks.building(system_metrics=bool(stage.model) and training is not None
                                and stage.stage == training.name):
                out = build(ctx)
            manifest = Manifest(
                stage=stage,
                key=key,
                params=unit_params(self.config, stage),
                inputs={name: r.key for name, r in inputs.items()},
                rows=out.rows,
                seconds=round(time.perf_counter() - t0, 3),
                metrics=out.metrics,
                facts=established(stage.stage, {name: r.facts for name, r in inputs.items()}, out.facts).to_json(),
                mlflow_run_id=hooks.run_id,
                causes=self.causes.get(stage, {}),
                pipeline=self.config.name,
            )
            final = self.store.publish(tmp, manifest)
        except BaseException as e:
            # a failed build leaves no half-written folder (the scratch stays, to resume)
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(OSError):
                scratch.rmdir()  # unless it holds nothing to resume from
            if is_disk_full(e):
                raise disk_full(stage, e, tmp.parent) from None
            raise
        shutil.rmtree(scratch, ignore_errors=True)
        hooks.built(final, out, self.config.name)
        return manifest

    def _result(self, manifest: Manifest, cache: str, seconds: float) -> StageResult:
        return StageResult(
            stage=Unit.parse(manifest.stage),
            key=manifest.key,
            path=self.store.local(manifest.stage, manifest.key),
            cache=cache,
            seconds=round(seconds, 3),
            rows=manifest.rows,
            metrics=manifest.metrics,
            facts=Facts.from_json(manifest.facts),
        )


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` is a write that found no space (pyarrow's and others' wrappers included)."""
    return isinstance(error, OSError) and (error.errno in (errno.ENOSPC, errno.EDQUOT)
                                           or "No space left on device" in str(error))


def disk_full(stage: str, error: OSError, root: Path) -> ZhpipeError:
    """One line for a full disk: the file being written, the space left where the store is."""
    try:
        free = f"{shutil.disk_usage(root).free / 2**20:.1f} MB free"
    except OSError:
        free = "free space unknown"
    return ZhpipeError(f"{stage}: the disk is full writing {error.filename or 'to ' + str(root)} ({free} on the file "
                       f"system of {root}); free space there, or choose another store with --storage or "
                       f"ZHPIPE_STORAGE, and run again")
