"""The pipeline flow: a pipeline's stages in the graph order of its task kind (tasks/stages.py),
each a Prefect task that reuses its cached output or builds it."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows.orchestrate import night
from flows.orchestrate.execute import RunContext, run_partitions
from flows.orchestrate.guard import check_run
from flows.orchestrate.model_stages import run_model_stage
from flows.orchestrate.parent_run import (
    finish_run,
    label_flow_run,
    record_reuse,
    run_summary,
    start_run,
)
from flows.orchestrate.workers import gpu_slot, train_deployment
from flows.plan import leases, project
from flows.plan.cache import StageCache, StageResult
from flows.plan.config import DEFAULT_PIPELINE, PipelineConfig
from flows.plan.keys import plan, unread
from flows.plan.request import RunRequest
from flows.plan.sources import fixed_partitions, record_appends
from flows.plan.store import StageStore, storage_root
from flows.pools.chunks import shutdown as shutdown_cluster
from flows.track.champion import revision
from tasks.errors import ZhpipeError
from tasks.stages import KINDS, STAGE_NAMES

log = logging.getLogger("zhpipe")


def select_stages(
    start: str | None = None,
    stop: str | None = None,
    only: str | None = None,
    order: tuple[str, ...] = STAGE_NAMES,
) -> list[str]:
    """Stages to run for --from/--to/--only, in `order` (a task kind's graph order); a stage the
    kind does not have is one clear error."""
    names = list(order)
    for given in (start, stop, only):
        if given is not None and given not in names:
            raise ZhpipeError(
                f"stage {given!r} is not a stage of this pipeline's task (stages: "
                f"{', '.join(names)})"
            )
    if only:
        return [only]
    lo = names.index(start) if start else 0
    hi = names.index(stop) if stop else len(names) - 1
    return names[lo : hi + 1]


def forced_stages(force: list[str] | None, order: tuple[str, ...] = STAGE_NAMES) -> set[str]:
    """--force STAGE rebuilds that stage and every stage after it (in `order`, the kind's graph
    order); a bare --force rebuilds all."""
    if force is None:
        return set()
    names = list(order)
    if not force:
        return set(names)
    first = min(names.index(s) for s in force)
    return set(names[first:])


def chunk_executor(config: PipelineConfig, explicit: str | None = None) -> str | None:
    """Where chunked stages run: None = this machine's processes, "local" = a local Dask cluster,
    else a Dask scheduler address. --dask beats the pipeline's `executor`/`dask_address`."""
    if explicit:
        return explicit
    if config.executor == "dask":
        return config.dask_address or "local"
    return None


def _stage_task(stage: str, **options):
    """The Prefect task of one stage: reuse its output when cached, else build it with its module's
    `build` (the pipeline's task kind says which module); a partitioned stage a unit per partition,
    a per-model stage a unit per model; tracked in MLflow either way."""

    def run_stage(run: RunContext, *inputs: StageResult) -> StageResult:
        spec = run.config.kind.stages[stage]
        upstream = {name: result for name, result in zip(spec.needs, inputs) if result is not None}
        if spec.per_model:
            return run_model_stage(run, spec, upstream)
        if spec.partitioned and run.config.source.partitioned:
            return run_partitions(run, spec, upstream)
        build = in_a_process(spec.build) if beside(run, spec) else spec.build
        result = run.run(stage, upstream, build)
        if spec.checked and run.gate is not None:
            run.gate.whole(result)
        return result

    run_stage.__doc__ = next(
        (k.stages[stage].help for k in KINDS.values() if stage in k.stages), f"stage {stage}"
    )
    return task(name=stage, cache_policy=NO_CACHE, **options)(run_stage)


def beside(run: RunContext, spec) -> bool:
    """Whether this run builds the stage in a process of its own, beside the stages after it
    (its kind says it may; chunks run on this machine, not on a Dask cluster, whose workers take
    the cores)."""
    return spec.beside and run.executor is None


def in_a_process(build):
    """`build` in a process of its own (tasks.util.pool.elsewhere), given the context without
    what stays in this process."""
    from dataclasses import replace

    from tasks.util.pool import ChunkPool, elsewhere

    def build_elsewhere(ctx):
        alone = replace(ctx, pool=ChunkPool, sink=None, store=None, stages=None, source=None)
        return elsewhere(build, alone)

    return build_elsewhere


STAGE_TASKS: dict[str, Any] = {}


def stage_task(name: str):
    """The Prefect task of a stage by name, made on first use."""
    if name not in STAGE_TASKS:
        STAGE_TASKS[name] = _stage_task(name)
    return STAGE_TASKS[name]


@flow(name="zhpipe", log_prints=True, validate_parameters=False)
def pipeline_flow(
    pipeline: str = DEFAULT_PIPELINE,
    overrides: list[str] | None = None,
    stages: list[str] | None = None,
    force: list[str] | None = None,
    storage: str | None = None,
    dask: str | None = None,
    source: dict[str, Any] | None = None,
    config_file: str | None = None,
    project_dir: str | None = None,
    verify: bool = False,
    parsed: Any = None,
) -> dict[str, Any]:
    """Run the selected stages of one pipeline; earlier stages they need are read from the stage
    store.

    Every parameter is a plain value (what Prefect records and a deployment passes): `pipeline` is a
    name in `config_file` (default: the project's `pipelines.yaml`), `overrides` its `--set` lines
    (secrets redacted: a concealed URL is revealed in this process), `source` a `--source` mapping.
    Those four are the run's request (flows/plan/request.py), parsed once into the typed config;
    below this function only the request and the config travel. `storage`: the stage store root
    (folder or fsspec URL); `dask`: "local" or a scheduler address; `project_dir`: the project
    folder (deployments pass it; default: found from the working directory); `verify`: hash every
    file of a reused output against its manifest (sizes and small files always are); `parsed`: the
    request's typed config, when the caller in this process has parsed it (the command line, the
    Python API): it is not parsed again. A deployment's run, whose parameters arrive as JSON, parses
    the request here. A run of a deployment may set only what the deployment allows
    (flows/orchestrate/guard.py).
    """
    check_run(
        {
            "pipeline": pipeline,
            "overrides": overrides,
            "source": source,
            "storage": storage,
            "dask": dask,
            "config_file": config_file,
            "project_dir": project_dir,
        }
    )
    if project_dir:
        project.activate(project.Project(Path(project_dir)))
    request = RunRequest.of(pipeline, overrides, source, config_file)
    config = request.typed(parsed)
    stages = _stage_list(config, stages, force)
    # the partitions planned are the ones built, whatever arrives meanwhile
    with fixed_partitions(config):
        run = start_run(
            request,
            config,
            forced_stages(force, tuple(config.kind.stages)),
            storage_root(config, storage),
            chunk_executor(config, dask),
            verify,
        )
        # `zhpipe gc` leaves what this run holds alone
        run.lease = leases.Lease(run.store, run.keys)
        stages = _read_only(run, stages)
        record_appends(config)  # an appended source: this run's ranges are what the next run checks
        label_flow_run(run)
        results: dict[str, StageResult] = {}
        ok, error = False, "interrupted"
        try:
            _run_stages(run, stages, results)
            ok = True
        except BaseException as e:
            from flows.track.alerts import emit

            error = str(e).splitlines()[0] if str(e) else type(e).__name__
            emit(
                "zhpipe.run.failed",
                config,
                {"message": f"{config.identity}: the run failed: {error}"},
            )
            raise
        finally:
            _close(run, results, stages, ok, error)
        return run_summary(run, stages, results)


def _read_only(run: RunContext, stages: list[str]) -> list[str]:
    """`stages` less those no model of this run reads (embed, when none starts from word vectors):
    not built."""
    skipped = unread(run.config, stages)
    if skipped:
        log.info("%s: not built: no model of this run reads it", ", ".join(sorted(skipped)))
    return [s for s in stages if s not in skipped]


def _close(
    run: RunContext, results: dict[str, StageResult], stages: list[str], ok: bool, error: str
) -> None:
    """The run's end, failed or not: the cluster stopped, the night's report, the parent run closed,
    the lease let go."""
    shutdown_cluster()
    try:
        night.record(run, results, ok, "" if ok else error)
        finish_run(run, {k: r for k, r in results.items() if k in stages}, ok)
    finally:
        run.lease.release()


def _stage_list(
    config: PipelineConfig, stages: list[str] | None, force: list[str] | None
) -> list[str]:
    """The stages to run (all, in graph order, when none are named); a deployment's parameters come
    as plain lists, checked here."""
    order = tuple(config.kind.stages)
    for what, names in (("stages", stages), ("force", force)):
        if names is not None and not (
            isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)
        ):
            raise ZhpipeError(
                f"{what}: expected a list of stage names ({', '.join(order)}), got {names!r:.80}"
            )
        wrong = [s for s in names or [] if s not in order]
        if wrong:
            raise ZhpipeError(
                f"{what}: {wrong[0]!r} is not a stage of task {config.task} (stages: "
                f"{', '.join(order)})"
            )
    return list(stages or order)


def _run_stages(run: RunContext, stages: list[str], results: dict[str, StageResult]) -> None:
    """Every selected stage in graph order, into `results` (the stages they need, not selected, read
    from the store); nothing to build at all: the parent run names what was reused."""
    routed = _routed(run, stages)
    # what would stop the remote training stops the run before the data stages spend minutes on it
    if routed:
        _check_route(run)
    reused = None if routed else run.reuse_all(stages)
    if reused is not None and record_reuse(run, reused):
        results.update(reused)
        return
    kind = run.config.kind
    every = list(dict.fromkeys([*stages, *(d for s in stages for d in kind.stages[s].needs)]))
    # embed, when no model reads it, is not even read
    needed = set(every) - unread(run.config, every)
    beside_runs = Beside(run)
    try:
        for spec in kind.stages.values():
            beside_runs.check()
            inputs = [results.get(d) for d in spec.needs]
            if spec is kind.training:  # beside the training, which leaves cores idle longest
                beside_runs.start()
            # train on another work pool's worker (GPU)
            if spec.name in stages and spec is kind.training and _routed(run, stages):
                results[spec.name] = train_remote(run)
            elif spec.name in stages and beside(run, spec):
                beside_runs.hold(spec.name, inputs)
            elif spec.name in stages:
                # quoted: Prefect would walk the whole run context (config, keys, store) looking
                # for futures, twice a task
                results[spec.name] = stage_task(spec.name)(quote(run), *inputs)
                # a check held a partition out and the plan changed: a stage before whose key
                # the plan no longer holds gathers its partitions again (in graph order)
                for name in [n for n, r in results.items() if r.key != run.keys[n]]:
                    needs = [results.get(d) for d in kind.stages[name].needs]
                    results[name] = stage_task(name)(quote(run), *needs)
            elif spec.name in needed:
                results[spec.name] = run.reuse(spec.name)
        beside_runs.start()
    except BaseException:
        beside_runs.wait()  # nothing of a failed run goes on after it ends
        raise
    results.update(beside_runs.results())
    order = list(kind.stages)
    for name in sorted(results, key=order.index):  # in graph order, as the run's summary shows
        results[name] = results.pop(name)


class Beside:
    """The stages a run builds beside the others (`beside`): held until the training starts,
    then Prefect tasks in the flow's thread pool, each building in a process of its own
    (`in_a_process`)."""

    def __init__(self, run: RunContext):
        self.run, self.waiting, self.running = run, {}, {}

    def hold(self, name: str, inputs: list) -> None:
        self.waiting[name] = inputs

    def start(self) -> None:
        for name, inputs in self.waiting.items():
            self.running[name] = stage_task(name).submit(quote(self.run), *inputs)
        self.waiting.clear()

    def check(self) -> None:
        """Raise the error of one that failed: the run stops at its next stage, not its last."""
        for future in self.running.values():
            if future.wrapped_future.done():
                future.result()

    def wait(self) -> None:
        for future in self.running.values():
            future.wait()

    def results(self) -> dict[str, StageResult]:
        """Each one's result, once all have ended; the first error raised. One whose key the run
        planned again while it ran (a check held a partition out) is built again."""
        running = self.running.items()
        done = {name: future.result(raise_on_failure=False) for name, future in running}
        for name, outcome in done.items():
            if isinstance(outcome, BaseException):
                raise outcome
            if outcome.key != self.run.keys[name]:
                needs = [self.run.reuse(d) for d in self.run.config.kind.stages[name].needs]
                done[name] = stage_task(name)(quote(self.run), *needs)
        return done


def _routed(run: RunContext, stages: list[str]) -> bool:
    """Whether this run's training stage goes to the pipeline's train work pool (into the same store
    and MLflow parent run): when a pool is set and the stage is to be built."""
    training = run.config.kind.training
    pool = (
        training is not None
        and training.name in stages
        and run.config.section(training.name).work_pool
    )
    built = training is not None and run.cache.published(training.name, run.keys[training.name])
    return bool(pool) and (training.name in run.force or not built)


def _check_route(run: RunContext) -> None:
    """The train stage goes to another work pool: its deployment exists and the run trains what it
    can train."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    name, pool = (
        train_deployment(run.config.name),
        run.config.section(run.config.kind.training.name).work_pool,
    )
    if run.request.source:
        raise ZhpipeError(
            "train: a run with --source cannot train on another work pool (a deployment trains "
            "what "
            "pipelines.yaml declares); declare the source in the pipeline, or train here with "
            "--set "
            "train.work_pool=null"
        )
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise ZhpipeError(
                f"train: stages.train.work_pool is '{pool}' but the deployment '{name}' does not "
                "exist on the Prefect "
                f"server; create it with `zhpipe deploy {run.config.name}`, or train here with "
                "--set "
                f"train.work_pool=null"
            ) from None


def train_remote(run: RunContext) -> StageResult:
    """Submit the training stage as a run of the pipeline's train deployment and wait for it; the
    result is read back from the stage store the worker wrote to."""
    from prefect.deployments import run_deployment

    name, stage = train_deployment(run.config.name), run.config.kind.training.name
    pool = run.config.section(stage).work_pool
    log.info("train: submitting to work pool '%s' (deployment %s) and waiting", pool, name)
    t0 = time.perf_counter()
    # what the train deployment lets a run set: its overrides (its own, or allowed by the pipeline),
    # never a source or storage (the worker uses the pipeline's, or its ZHPIPE_STORAGE)
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
    # checked before the run (_check_route)
    flow_run = run_deployment(name, parameters=parameters, timeout=None, poll_interval=2)
    if not flow_run.state or not flow_run.state.is_completed():
        state = flow_run.state.name if flow_run.state else "unknown"
        raise ZhpipeError(
            f"train: the run '{flow_run.name}' of {name} on work pool '{pool}' ended {state}: "
            f"{flow_run.state.message if flow_run.state else ''}"
        )
    key = run.keys[stage]
    if not run.cache.published(stage, key):
        raise ZhpipeError(
            f"train: the run '{flow_run.name}' on work pool '{pool}' completed but {run.store.url} "
            "has "
            f"no train output {key}: does the worker use the same storage root?"
        )
    return run.cache.restore(run.store.manifest(stage, key), "miss", time.perf_counter() - t0)


@flow(name="zhpipe-train", log_prints=True, validate_parameters=False)
def train_flow(
    pipeline: str,
    parent_run_id: str | None = None,
    overrides: list[str] | None = None,
    source: dict[str, Any] | None = None,
    config_file: str | None = None,
    storage: str | None = None,
    force: bool = False,
    project_dir: str | None = None,
    source_fingerprint: str | None = None,
) -> dict[str, Any]:
    """The train stage alone, on a (GPU) worker: inputs from the shared store, one training per GPU
    at a time (a Prefect global concurrency limit per worker machine), logged under the pipeline
    run's MLflow parent. The worker needs the project's pipelines.yaml (its own checkout:
    ZHPIPE_PROJECT), not the corpus: the keys are planned from `source_fingerprint`, the submitting
    run's (keys are content addresses: a wrong one finds no inputs)."""
    check_run(
        {
            "pipeline": pipeline,
            "overrides": overrides,
            "source": source,
            "storage": storage,
            "config_file": config_file,
            "project_dir": project_dir,
            "parent_run_id": parent_run_id,
        }
    )
    # the worker's own checkout wins over the submitter's path
    folder = os.environ.get("ZHPIPE_PROJECT") or project_dir
    if folder:
        project.activate(project.Project(Path(folder)))
    request = RunRequest.of(pipeline, overrides, source, config_file)
    config = request.config()
    training = config.kind.training
    causes = plan(config, registry=revision, source=source_fingerprint)
    run = RunContext(
        config,
        StageCache(StageStore(storage_root(config, storage))),
        StageCache.keys(causes),
        f"zhpipe-{config.identity}",
        parent_run_id,
        {training.name} if force else set(),
        causes=causes,
        request=request,
    )
    with leases.held(run.store, run.keys) as run.lease:
        # embed, when no model reads it
        unused = unread(run.config, [*training.needs, training.name])
        inputs = [None if name in unused else run.reuse(name) for name in training.needs]
        with gpu_slot():
            result = stage_task(training.name)(run, *inputs)
    return {k: v for k, v in asdict(result).items() if k != "path"}
