"""The pipeline flow: a pipeline's stages in the graph order of its task kind (tasks/stages.py),
each a Prefect task that reuses its cached output or builds it."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow

from flows.orchestrate.engine import Engine
from flows.orchestrate.execute import RunContext
from flows.orchestrate.guard import check_run
from flows.orchestrate.parent_run import label_flow_run, run_summary, start_run
from flows.orchestrate.workers import gpu_slot
from flows.plan import leases, project
from flows.plan.cache import StageCache
from flows.plan.config import DEFAULT_PIPELINE, PipelineConfig
from flows.plan.keys import plan, unread
from flows.plan.request import RunRequest
from flows.plan.sources import fixed_partitions, record_appends
from flows.plan.store import StageStore, storage_root
from flows.track.champion import revision
from tasks.errors import ZhpipeError
from tasks.stages import STAGE_NAMES

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
        stages = _read_only(run.config, stages)
        record_appends(config)  # an appended source: this run's ranges are what the next run checks
        label_flow_run(run)
        engine = Engine(run, stages)
        ok, error = False, "interrupted"
        try:
            engine.walk()
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
            engine.close(ok, error)
        return run_summary(run, stages, engine.stage_results())


def _read_only(config: PipelineConfig, stages: list[str]) -> list[str]:
    """`stages` less those no model of this run reads (embed, when none starts from word vectors):
    not built."""
    skipped = unread(config, stages)
    if skipped:
        log.info("%s: not built: no model of this run reads it", ", ".join(sorted(skipped)))
    return [s for s in stages if s not in skipped]


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
        StageCache(
            StageStore(storage_root(config, storage)), force={training.name} if force else set()
        ),
        StageCache.keys(causes),
        f"zhpipe-{config.identity}",
        parent_run_id,
        causes=causes,
        request=request,
    )
    with leases.held(run.store, run.keys) as run.lease, gpu_slot():
        # its needs read from the store (embed, when no model reads it, is not)
        result = Engine(run, [training.name], worker=True).walk()[training.name]
    return {k: v for k, v in asdict(result).items() if k != "path"}
