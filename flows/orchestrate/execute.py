"""Stage execution: build or reuse each unit of a run (its keys planned by flows/plan/keys.py) and
track it in MLflow."""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from flows.orchestrate.gate import Gate
from flows.orchestrate.tracking import UnitTracking
from flows.plan import project
from flows.plan.cache import StageCache, StageResult
from flows.plan.config import PipelineConfig
from flows.plan.keys import unit_params
from flows.plan.leases import Lease
from flows.plan.request import RunRequest
from flows.plan.sources import origin_of, partition_source, partitions
from flows.plan.store import Manifest, StageStore
from flows.pools.chunks import pool_for
from flows.pools.slots import global_slot
from flows.track.tracker import Tracker
from tasks.core import BuildContext, BuildOutput, Unit, established
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
        """An unverified http(s) source is re-checked against the validators its key was planned
        with."""
        self.origin = self.origin or origin_of(self.config)
        return self.origin.expect(source)

    def registered(self, uri: str) -> tuple[str, Path]:
        """A registered model (models:/...) downloaded into the store's cache."""
        from flows.track.champion import download

        return download(uri, self.store.cache_file("registered"), self.store)

    def model(self, name: str):
        """The spec of a model of any kind (a registered translator's, read by another kind's
        stage)."""
        from tasks.stages import model

        return model(name)


@dataclass
class RunContext:
    """One pipeline run, the short loop around the stage cache: for each unit, look its key up in
    the cache and restore it, or build it and save it; the hooks around each unit are its MLflow
    tracking (`tracking`), the data checks (`gate`) and the run's hold on its keys (`lease`)."""

    config: PipelineConfig
    cache: StageCache
    keys: dict[str, str]  # per unit, its planned key (flows/plan/keys.py)
    experiment: str
    parent_run_id: str | None
    # chunked work: None = local processes, "local" = a local Dask cluster, else its address
    executor: str | None = None
    causes: dict[str, dict[str, Any]] = field(default_factory=dict)  # per unit, what its key hashed
    # the source as the keys were planned (the download re-checks against it)
    origin: Origin | None = None
    # the parent run's name (pipeline, changed settings, time): its model runs are named after it
    title: str = ""
    # the data checks (flows/orchestrate/gate.py), judged on the checked stage's output
    gate: Gate | None = None
    # the run's hold on its keys in the store (flows/plan/leases.py): gc leaves them
    lease: Lease | None = None
    # what the run was asked to build (a tuning trial's runs have none)
    request: RunRequest | None = None
    # the hooks around each unit (its MLflow run)
    tracking: Callable[..., UnitTracking] = UnitTracking
    _partitions: list | None = None  # the source's partitions as planned: listed once per plan
    replans: int = 0  # how often the keys were planned again (what was taken before may be stale)

    @property
    def store(self) -> StageStore:
        return self.cache.store

    def reuse(self, unit: str) -> StageResult:
        """A unit's output read from the cache without tracking it (stages before --from)."""
        return self.cache.reuse(unit, self.keys[unit])

    def published(self, unit: str) -> bool:
        """Whether the unit's planned key is in the store (not verified: a status)."""
        return self.cache.published(unit, self.keys[unit])

    def reuse_all(self, stages: list[str]) -> dict[str, StageResult] | None:
        """The selected stages with their units (models, partitions), all read from the cache, when
        each is there and sound and nothing is forced: a run with nothing to build (nothing is
        tracked per stage). Else None."""
        # registering reads the trained models
        wanted = set(stages) | self.config.kind.units_read(stages)
        units = [u for u in self.keys if u.stage in wanted]
        if self.force or not all(self.cache.published(u, self.keys[u]) for u in units):
            return None
        checked = [self.keys[u] for u in units if self.config.kind.stages[u.stage].checked]
        # a check of the team's changed since: judged in a real run
        if checked and self.config.checks.custom:
            from flows.orchestrate.gate import unjudged

            if unjudged(self.config, checked):
                return None
        found = {u: self.cache.lookup(u, self.keys[u]) for u in units}
        if not all(found.values()):
            return None
        found = {u: self.cache.restore(m) for u, m in found.items()}
        for name in stages:
            found[name].parts = {u: r for u, r in found.items() if u != name and u.stage == name}
        return {name: found[name] for name in stages}

    @property
    def force(self) -> set[str]:
        """The stages --force rebuilds (the cache's: it alone decides reuse)."""
        return self.cache.force

    def by_content(self, unit: Unit, inputs: dict[str, StageResult]) -> Manifest | None:
        """An output built under another key from the same content (its stage's `content=`),
        reused."""
        return self.cache.reuse_content(
            unit,
            self.keys[unit],
            self.causes.get(unit),
            inputs,
            self.content_of(unit),
            self.config.name,
        )

    def content_of(self, unit: Unit) -> tuple:
        """What `unit` is reused by (its stage's `content=`): nothing for a stage built per
        partition (its gathering merges the partitions' work, not those files)."""
        spec = self.config.kind.stages[unit.stage]
        return () if self.config.per_partition(spec) else spec.content

    def run(
        self,
        unit: Unit | str,
        inputs: dict[str, StageResult],
        build: Callable[[BuildContext], BuildOutput],
        tracker: Tracker | None = None,
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
        quiet: bool = False,
    ) -> StageResult:
        """One unit: restored from the cache when its key is there (and sound), else built and
        saved; the tracking hooks around it either way. `unit` is a stage or a model unit
        (`train.textcnn`); by default each gets an MLflow run of its own under the parent, and
        `tracker` logs into an existing run instead (left open). The key's lock is held throughout,
        so a concurrent run of the same key waits, then reuses. `quiet`: a reused unit is restored
        untracked (a partition unit: a night reuses most of them)."""
        unit = Unit.parse(unit)
        key = self.keys[unit]
        t0 = time.perf_counter()
        with self.store.lock(unit, key, shared=global_slot):
            manifest = self.cache.lookup(unit, key) or self.by_content(unit, inputs)
            hit = manifest is not None
            if hit and quiet:
                log.debug("%s: cached (%s)", unit, key)
                return self.cache.restore(manifest)
            hooks = self.tracking(
                self.experiment, self.parent_run_id, unit, key, manifest, tracker, run_name, tags
            )
            # asked for by the unit's own run alone
            params = partial(unit_params, self.config, unit)
            try:
                if hit:
                    log.info("%s: cached (%s)", unit, key)
                else:
                    manifest = build_unit(self, unit, inputs, build, hooks)
                hooks.done(manifest, params)
            except BaseException:
                hooks.failed(params)
                raise
        result = self.cache.restore(manifest, "hit" if hit else "miss", time.perf_counter() - t0)
        result.run_id = hooks.run_id
        return result

    @property
    def partitions(self) -> list:
        """The source's partitions as the keys were planned (listed once per plan)."""
        if self._partitions is None:
            self._partitions = partitions(self.config)
        return self._partitions

    def partition_names(self) -> list[str]:
        return [p.name for p in self.partitions]

    def replan(self) -> None:
        """Plan the keys again (the partitions changed: a check held one out)."""
        from flows.plan.keys import plan
        from flows.track.champion import revision

        self.causes = plan(self.config, self.origin, registry=revision)
        self.keys.clear()
        self.keys.update(self.cache.keys(self.causes))
        if self.lease is not None:
            self.lease.update(self.keys)
        self._partitions = None
        self.replans += 1


def build_unit(
    run: RunContext, unit: Unit, inputs: dict[str, StageResult], build, hooks: UnitTracking
) -> Manifest:
    """Build the unit into a temporary folder and save it in the cache with its manifest (a failed
    build leaves nothing but what it can resume from)."""
    key, part = run.keys[unit], unit.part
    log.info("%s: building (%s)", unit, key)
    tmp, scratch = run.cache.begin(unit, key)
    t0 = time.perf_counter()
    ctx = BuildContext(
        inputs={name: r.path for name, r in inputs.items()},
        facts={name: r.facts for name, r in inputs.items()},
        out=tmp,
        params=run.config.section(unit.stage),
        scratch=scratch,
        pipeline=run.config.name,
        root=project.current().root,
        pool=pool_for(run.executor, run.store.remote_url),
        sink=hooks.sink,
        stages=run.config.stages,
        source=run.config.source if not part else partition_source(run.config, part),
        store=StoreServices(run.config, run.store, run.origin),
        partition=(run.partition_names().index(part), part) if part else None,
        input_metrics={name: r.metrics for name, r in inputs.items()},
        input_rows={name: r.rows for name, r in inputs.items()},
        outputs={name: run.config.kind.stages[Unit.parse(name).stage].outputs for name in inputs},
    )
    try:
        training = run.config.kind.training
        with hooks.building(
            system_metrics=bool(unit.model) and training is not None and unit.stage == training.name
        ):
            out = build(ctx)
        manifest = Manifest(
            stage=unit,
            key=key,
            params=unit_params(run.config, unit),
            inputs={n: r.key for n, r in inputs.items()},
            rows=out.rows,
            seconds=round(time.perf_counter() - t0, 3),
            metrics=out.metrics,
            facts=established(
                unit.stage, {name: r.facts for name, r in inputs.items()}, out.facts
            ).to_json(),
            mlflow_run_id=hooks.run_id,
            causes=run.causes.get(unit, {}),
            pipeline=run.config.name,
        )
        final = run.cache.save(tmp, manifest)
        content = run.content_of(unit)
        if content and manifest.causes:
            run.cache.remember_content(manifest, inputs, content, out.facts)
    except BaseException as e:
        # a failed build leaves no half-written folder (the scratch stays, to resume)
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            scratch.rmdir()  # unless it holds nothing to resume from
        if is_disk_full(e):
            raise disk_full(unit, e, tmp.parent) from None
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    hooks.built(final, out, run.config.name)
    return manifest


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` is a write that found no space (pyarrow's and others' wrappers included)."""
    return isinstance(error, OSError) and (
        error.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(error)
    )


def disk_full(stage: str, error: OSError, root: Path) -> ZhpipeError:
    """One line for a full disk: the file being written, the space left where the store is."""
    try:
        free = f"{shutil.disk_usage(root).free / 2**20:.1f} MB free"
    except OSError:
        free = "free space unknown"
    return ZhpipeError(
        f"{stage}: the disk is full writing {error.filename or 'to ' + str(root)} ({free} on the "
        "file "
        f"system of {root}); free space there, or choose another store with --storage or "
        f"ZHPIPE_STORAGE, and run again"
    )
