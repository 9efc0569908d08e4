"""The pipeline flow: a pipeline's stages in the graph order of its task kind (tasks/stages.py), each a Prefect
task that reuses its cached output or builds it."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows import project
from flows.chunks import shutdown as shutdown_cluster
from flows.config import DEFAULT_PIPELINE, PipelineConfig, load_pipeline
from flows.model_stages import register, run_model_stage
from flows.registry import revision
from flows.guard import check_run
from flows.keys import plan
from flows.sources import fixed_partitions, origin_of, record_appends, record_source_run, source_fingerprint
from flows.runner import RunContext, StageResult, artifact_key
from flows.store import StageStore, stage_key, storage_root
from flows.tracking import Tracker, experiment_id
from flows.workers import gpu_slot, train_deployment
from tasks.core import DATASET_SAMPLE_ROWS, Unit, model_unit
from tasks.errors import ZhpipeError
from tasks.io import SPLITS as SPLIT_NAMES, iter_frames
from tasks.stages import KINDS, STAGE_NAMES
from tasks.urls import redact_text

log = logging.getLogger("zhpipe")


def select_stages(start: str | None = None, stop: str | None = None, only: str | None = None,
                  order: tuple[str, ...] = STAGE_NAMES) -> list[str]:
    """Stages to run for --from/--to/--only, in `order` (a task kind's graph order); a stage the kind does not
    have is one clear error."""
    names = list(order)
    for given in (start, stop, only):
        if given is not None and given not in names:
            raise ZhpipeError(f"stage {given!r} is not a stage of this pipeline's task (stages: {', '.join(names)})")
    if only:
        return [only]
    lo = names.index(start) if start else 0
    hi = names.index(stop) if stop else len(names) - 1
    return names[lo : hi + 1]


def forced_stages(force: list[str] | None, order: tuple[str, ...] = STAGE_NAMES) -> set[str]:
    """--force STAGE rebuilds that stage and every stage after it (in `order`, the kind's graph order); a bare
    --force rebuilds all."""
    if force is None:
        return set()
    names = list(order)
    if not force:
        return set(names)
    first = min(names.index(s) for s in force)
    return set(names[first:])


def chunk_executor(config: PipelineConfig, explicit: str | None = None) -> str | None:
    """Where chunked stages run: None = this machine's processes, "local" = a local Dask cluster, else a
    Dask scheduler address. --dask beats the pipeline's `runner`/`dask_address`."""
    if explicit:
        return explicit
    if config.runner == "dask":
        return config.dask_address or "local"
    return None


def git_commit() -> str:
    """The project folder's git commit, or "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=project.current().root, capture_output=True, text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_name(config: PipelineConfig, overrides: list[str] | None = None) -> str:
    """A parent run's name that reads well truncated: the pipeline, the changed params, the time last."""
    changed = " ".join(redact_text(o).replace(" ", "") for o in overrides or [])
    return " ".join(p for p in (config.identity, changed, time.strftime("%m-%d %H:%M:%S")) if p)


def source_tags(config: PipelineConfig, origin=None) -> dict[str, str]:
    """MLflow's standard source tags (the UI's Source and User columns) and zhpipe's own."""
    import getpass

    commit = git_commit()
    tags = {
        "mlflow.source.name": redact_text(" ".join(["zhpipe", *sys.argv[1:]])) if sys.argv and sys.argv[0].endswith(("zhpipe", "cli.py")) else f"zhpipe run {config.name}",
        "mlflow.source.type": "LOCAL",
        "mlflow.user": getpass.getuser(),
        "zhpipe.pipeline": config.name,
        "zhpipe.git_commit": commit,
        "zhpipe.config_hash": config.config_hash(),
        "zhpipe.source_sha256": source_fingerprint(config, origin),
    }
    if commit != "unknown":
        tags["mlflow.source.git.commit"] = commit
    return tags


def start_run(config: PipelineConfig, force: set[str], storage: str, executor: str | None = None, verify: bool = False,
              overrides: list[str] | None = None) -> RunContext:
    """Plan keys and open the MLflow parent run of this pipeline run."""
    origin = origin_of(config)
    causes = plan(config, origin, registry=revision)
    keys = {stage: stage_key(c) for stage, c in causes.items()}
    record_source_run(config, keys)
    experiment = f"zhpipe-{config.identity}"
    closed = Tracker.close_orphans(experiment)
    if closed:
        log.info("MLflow: %d runs left RUNNING by killed runs of this machine marked KILLED", len(closed))
    title = run_name(config, overrides)
    parent = Tracker.start(experiment, title, tags=source_tags(config, origin))
    parent.params(config.flat_params(used_only=True))  # what a person compares; the whole config is config.json
    log_config(parent, experiment, config)
    parent.tags({"zhpipe.task": config.task, "zhpipe.overrides": " ".join(redact_text(o) for o in overrides or [])})
    return RunContext(config, StageStore(storage), keys, experiment, parent.run_id, force, executor, causes, verify, origin, title)


def log_config(parent: Tracker, experiment: str, config: PipelineConfig) -> None:
    """The whole resolved config as `config.json`, once per config hash in an experiment: a run whose config an
    earlier run holds points to it (tag `zhpipe.config_json`), so reruns add no artifacts."""
    digest = config.config_hash()
    earlier = parent.client.search_runs([experiment_id(experiment)], max_results=1,
                                        filter_string=f"tags.`zhpipe.config_hash` = '{digest}' and tags.`zhpipe.config_json` LIKE 'runs:/%'")
    held = [r for r in earlier if r.info.run_id != parent.run_id]
    if held:
        parent.tags({"zhpipe.config_json": held[0].data.tags["zhpipe.config_json"]})
        return
    parent.text(json.dumps(config.model_dump(mode="json"), indent=2, ensure_ascii=False), "config.json")
    parent.tags({"zhpipe.config_json": f"runs:/{parent.run_id}/config.json"})


def finish_run(run: RunContext, results: dict[str, StageResult], ok: bool) -> None:
    """Parent-run summary metrics and tags, then close it."""
    parent = Tracker(run.parent_run_id)
    kind = run.config.kind
    selection = results.get(kind.selection.name) if kind.selection else None
    if selection is not None:
        best = selection.facts.best_model
        result = selection.facts.results[best]
        parent.metrics({f"best_{name}": result[name] for name in kind.reported})
        parent.tags({"zhpipe.best_model": best})
    parent.metrics({"stages_hit": sum(r.cache == "hit" for r in results.values()),
                    "stages_miss": sum(r.cache == "miss" for r in results.values())})
    source = results.get(kind.source.name)
    if source is not None:  # what `zhpipe runs` shows a nightly user: rows read, and for partitions those new tonight
        counts = {"rows_read": source.rows or 0}
        if source.parts:
            units = [u for r in results.values() for name, u in r.parts.items() if ":" in name]  # partition units
            counts |= {"partitions_hit": sum(u.cache == "hit" for u in units), "partitions_miss": sum(u.cache == "miss" for u in units),
                       "rows_new": sum(u.rows or 0 for u in source.parts.values() if u.cache == "miss")}
        parent.metrics(counts)
    splits = kind.splits(results)
    if splits is not None:  # the Dataset column: the splits this run trained, validated and tested on
        for name, context in zip(SPLIT_NAMES, ("training", "validation", "testing")):
            path = results[splits.name].path / f"{name}.parquet"
            frame = next(iter_frames(path, DATASET_SAMPLE_ROWS, columns=["id", "text"] + (["label"] if kind.labelled else [])))
            parent.dataset(frame.head(DATASET_SAMPLE_ROWS), source=str(path), name=f"{run.config.name}-{name}", context=context,
                           rows=pq.ParquetFile(path).metadata.num_rows)
    parent.finish(ok)


def _stage_task(stage: str, **options):
    """The Prefect task of one stage: reuse its output when cached, else build it with its module's `build`
    (the pipeline's task kind says which module); a partitioned stage a unit per partition, a per-model stage a
    unit per model; tracked in MLflow either way."""

    def run_stage(run: RunContext, *inputs: StageResult) -> StageResult:
        spec = run.config.kind.stages[stage]
        upstream = {name: result for name, result in zip(spec.needs, inputs) if result is not None}
        if spec.per_model:
            return run_model_stage(run, spec, upstream)
        if spec.partitioned and run.config.source.partitioned:
            return run.run_partitions(spec, upstream)
        return run.run(stage, upstream, spec.module.build)

    run_stage.__doc__ = next((k.stages[stage].help for k in KINDS.values() if stage in k.stages), f"stage {stage}")
    return task(name=stage, cache_policy=NO_CACHE, **options)(run_stage)


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
) -> dict[str, Any]:
    """Run the selected stages of one pipeline; earlier stages they need are read from the stage store.

    Every parameter is a plain value (what Prefect records and a deployment passes): `pipeline` is a name in
    `config_file` (default: the project's `pipelines.yaml`), `overrides` its `--set` lines (secrets redacted: a
    concealed URL is revealed in this process), `source` a `--source` mapping; the config is parsed from them
    once per process (`flows.config.load_pipeline` keeps what it parsed).
    `storage`: the stage store root (folder or fsspec URL); `dask`: "local" or a scheduler address;
    `project_dir`: the project folder (deployments pass it; default: found from the working directory);
    `verify`: hash every file of a reused output against its manifest (sizes and small files always are).
    A run of a deployment may set only what the deployment allows (flows/guard.py).
    """
    check_run({"pipeline": pipeline, "overrides": overrides, "source": source, "storage": storage, "dask": dask,
               "config_file": config_file, "project_dir": project_dir})
    if project_dir:
        project.activate(project.Project(Path(project_dir)))
    if not isinstance(pipeline, str):
        raise ZhpipeError(f"pipeline: expected a pipeline name, got {type(pipeline).__name__}")
    config = _config(pipeline, overrides, source, config_file)
    order = tuple(config.kind.stages)
    for what, names in (("stages", stages), ("force", force)):  # a deployment's parameters come as plain lists
        if names is not None and not (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)):
            raise ZhpipeError(f"{what}: expected a list of stage names ({', '.join(order)}), got {names!r:.80}")
        wrong = [s for s in names or [] if s not in order]
        if wrong:
            raise ZhpipeError(f"{what}: {wrong[0]!r} is not a stage of task {config.task} (stages: {', '.join(order)})")
    stages = list(stages or order)
    with fixed_partitions(config):  # the partitions planned are the ones built, whatever arrives meanwhile
        run = start_run(config, forced_stages(force, tuple(config.kind.stages)), storage_root(config, storage), chunk_executor(config, dask), verify, overrides)
        record_appends(config)  # an appended source: this run's ranges are what the next run checks
        label_flow_run(run, overrides)
        needed = set(stages) | {d for s in stages for d in config.kind.stages[s].needs}
        results: dict[str, StageResult] = {}

        def step(name, *inputs):
            if name in stages:
                # quoted: Prefect would walk the whole run context (config, keys, store) looking for futures, twice a task
                results[name] = stage_task(name)(quote(run), *inputs)
            elif name in needed:
                results[name] = run.reuse(name)
            return results.get(name)

        ok = False
        try:
            reused = None if _routed(run, stages) else run.reuse_all(stages)
            if reused is not None and record_reuse(run, reused):  # nothing to build: the parent run names what was reused
                results.update(reused)
            else:
                reused = None
            for spec in config.kind.stages.values() if reused is None else ():  # graph order
                inputs = [results.get(d) for d in spec.needs]
                if spec is config.kind.training and _routed(run, stages):  # train on another work pool's worker (GPU)
                    results[spec.name] = train_remote(run, overrides, source, config_file)
                else:
                    step(spec.name, *inputs)
            ok = True
        finally:
            shutdown_cluster()
            finish_run(run, {k: r for k, r in results.items() if k in stages}, ok)
        return {
            "parent_run_id": run.parent_run_id,
            "experiment": run.experiment,
            "stages": [{k: v for k, v in asdict(results[name]).items() if k != "parts"} | {"headline": config.kind.stages[name].headline}
                       for name in stages],
            "units": [{k: v for k, v in asdict(unit).items() if k != "parts"} for name in stages for unit in results[name].parts.values()],
        }


def record_reuse(run: RunContext, results: dict[str, StageResult]) -> bool:
    """A run that builds nothing records no run per stage or model (there is nothing new to compare): its parent run
    names the run that built each reused output (tags `zhpipe.reused.<unit>`, followed by `zhpipe compare`), and the
    champion rule is applied as after any selection. False (nothing recorded) when a run that built one of them is
    not in this tracking store."""
    kind = run.config.kind
    named = set(results) | kind.units_read(results)  # registering reads the trained models' runs
    built_by = {u: run.store.manifest(u, run.keys[u]).mlflow_run_id or "" for u in run.keys
                if ":" not in u and Unit.parse(u).stage in named}
    if set(built_by.values()) - Tracker.existing(set(built_by.values())):
        return False  # built under another tracking store (this one moved aside or new): recorded the long way
    parent = Tracker(run.parent_run_id)
    parent.tags({"zhpipe.reused": "all", "mlflow.note.content": "Nothing was built: every output of this run was reused. "
                 "The runs that built them: " + ", ".join(f"{u} [{r[:8]}](#/experiments/{experiment_id(run.experiment)}/runs/{r})"
                                                          for u, r in built_by.items() if r),
                 **{f"zhpipe.reused.{u}": r for u, r in built_by.items()}})
    selection = results.get(kind.selection.name) if kind.selection else None
    if selection is not None:
        model_runs = {m: built_by[model_unit(kind.training.name, m)] for m in {Unit.parse(u).model for u in selection.parts}}
        register(run, selection, results.get(kind.test_split().name) or run.reuse(kind.test_split().name), model_runs)
    return True


def label_flow_run(run: RunContext, overrides: list[str] | None) -> None:
    """The Prefect flow run as people look for it: named like the MLflow parent run (pipeline, changed
    settings, time), tagged with the pipeline and task kind, and linked to the MLflow run by an artifact."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    from flows.tracking import ui_url

    if not flow_run.id:
        return
    tags = ["zhpipe", f"pipeline:{run.config.name}", f"task:{run.config.task}"]
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=run.title or run_name(run.config, overrides), tags=tags)
    except Exception as e:  # noqa: BLE001 - a name and tags are a convenience, never a failed run
        log.warning("could not name the Prefect flow run: %s", e)
    link = ui_url(run.experiment, run.parent_run_id)
    create_markdown_artifact(markdown=f"MLflow parent run [{run.parent_run_id}]({link}) of experiment `{run.experiment}`"
                             f" (open the UI with `zhpipe ui`)", key=artifact_key(run.config.name, "mlflow-run"),
                             description="zhpipe: where this run's metrics and models are")


def _routed(run: RunContext, stages: list[str]) -> bool:
    """Whether this run's training stage goes to the pipeline's train work pool (into the same store and MLflow
    parent run): when a pool is set and the stage is to be built."""
    training = run.config.kind.training
    pool = training is not None and training.name in stages and run.config.section(training.name).work_pool
    return bool(pool) and (training.name in run.force or not run.store.is_done(training.name, run.keys[training.name]))


def _config(name: str, overrides: list[str] | None, source: dict[str, Any] | None, config_file: str | None) -> PipelineConfig:
    return load_pipeline(name, Path(config_file) if config_file else project.current().config_file, overrides or [], source)


def train_remote(run: RunContext, overrides, source, config_file) -> StageResult:
    """Submit the training stage as a run of the pipeline's train deployment and wait for it; the result is
    read back from the stage store the worker wrote to."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    name, stage = train_deployment(run.config.name), run.config.kind.training.name
    pool = run.config.section(stage).work_pool
    log.info("train: submitting to work pool '%s' (deployment %s) and waiting", pool, name)
    t0 = time.perf_counter()
    # what the train deployment lets a run set: its overrides (its own, or allowed by the pipeline), never a
    # source or storage (the worker uses the pipeline's, or its ZHPIPE_STORAGE)
    parameters = {
        "pipeline": run.config.name, "overrides": overrides or [], "config_file": config_file,
        "parent_run_id": run.parent_run_id, "force": stage in run.force, "project_dir": str(project.current().root),
    }
    if source:
        raise ZhpipeError("train: a run with --source cannot train on another work pool (a deployment trains what pipelines.yaml "
                          "declares); declare the source in the pipeline, or train here with --set train.work_pool=null")
    try:
        flow_run = run_deployment(name, parameters=parameters, timeout=None, poll_interval=2)
    except ObjectNotFound:
        raise ZhpipeError(
            f"train: stages.train.work_pool is '{pool}' but the deployment '{name}' does not exist on the Prefect "
            f"server; create it with `zhpipe deploy {run.config.name}`, or train here with --set train.work_pool=null"
        ) from None
    if not flow_run.state or not flow_run.state.is_completed():
        state = flow_run.state.name if flow_run.state else "unknown"
        raise ZhpipeError(f"train: the run '{flow_run.name}' of {name} on work pool '{pool}' ended {state}: {flow_run.state.message if flow_run.state else ''}")
    key = run.keys[stage]
    if not run.store.is_done(stage, key):
        raise ZhpipeError(f"train: the run '{flow_run.name}' on work pool '{pool}' completed but {run.store.url} has no train output {key}: does the worker use the same storage root?")
    return run._result(run.store.manifest(stage, key), "miss", time.perf_counter() - t0)


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
) -> dict[str, Any]:
    """The train stage alone, on a (GPU) worker: inputs from the shared store, one training per GPU at a time
    (a Prefect global concurrency limit per worker machine), logged under the pipeline run's MLflow parent."""
    check_run({"pipeline": pipeline, "overrides": overrides, "source": source, "storage": storage, "config_file": config_file,
               "project_dir": project_dir, "parent_run_id": parent_run_id})
    if project_dir:
        project.activate(project.Project(Path(project_dir)))
    config = _config(pipeline, overrides, source, config_file)
    training = config.kind.training
    causes = plan(config, registry=revision)
    run = RunContext(config, StageStore(storage_root(config, storage)), {s: stage_key(c) for s, c in causes.items()}, f"zhpipe-{config.identity}",
                     parent_run_id, {training.name} if force else set(), causes=causes)
    inputs = [run.reuse(name) for name in training.needs]
    with gpu_slot():
        result = stage_task(training.name)(run, *inputs)
    return {k: v for k, v in asdict(result).items() if k != "path"}
