"""A pipeline run's parent run, in MLflow and Prefect: opened with its keys planned (named, tagged
with its source, config and commit), summed up and closed at the end; a run that builds nothing
records what it reused; the Prefect flow run named and linked to it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

import pyarrow.parquet as pq
from prefect.artifacts import create_markdown_artifact

from flows.orchestrate.execute import RunContext
from flows.orchestrate.gate import Gate
from flows.orchestrate.night import attention
from flows.orchestrate.tracking import artifact_key
from flows.plan import project
from flows.plan.cache import StageCache, StageResult
from flows.plan.config import PipelineConfig
from flows.plan.keys import not_trained, planned
from flows.plan.request import RunRequest
from flows.plan.sources import origin_of, record_source_run, source_fingerprint
from flows.plan.store import StageStore
from flows.track.champion import revision
from flows.track.tracker import Tracker, experiment_id, ui_url
from tasks.core import DATASET_SAMPLE_ROWS
from tasks.util.io import SPLITS as SPLIT_NAMES
from tasks.util.io import iter_frames
from tasks.util.urls import redact_text

log = logging.getLogger("zhpipe")


def git_commit() -> str:
    """The project folder's git commit, or "unknown" outside a git checkout."""
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                cwd=project.current().root,
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_name(config: PipelineConfig, changed: str = "") -> str:
    """A parent run's name that reads well truncated: the pipeline, the changed params, the time
    last."""
    return " ".join(p for p in (config.identity, changed, time.strftime("%m-%d %H:%M:%S")) if p)


def source_tags(config: PipelineConfig, origin=None) -> dict[str, str]:
    """MLflow's standard source tags (the UI's Source and User columns) and zhpipe's own."""
    import getpass

    commit = git_commit()
    tags = {
        "mlflow.source.name": redact_text(" ".join(["zhpipe", *sys.argv[1:]]))
        if sys.argv and sys.argv[0].endswith(("zhpipe", "cli.py"))
        else f"zhpipe run {config.name}",
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


def start_run(
    request: RunRequest,
    config: PipelineConfig,
    force: set[str],
    storage: str,
    executor: str | None = None,
    verify: bool = False,
) -> RunContext:
    """Plan keys and open the MLflow parent run of this pipeline run (`config` is the request's)."""
    origin = origin_of(config)
    store = StageStore(storage)
    training = config.kind.training
    config, causes = planned(
        store, config, origin, revision, forced=training is not None and training.name in force
    )
    keys = StageCache.keys(causes)
    record_source_run(config, keys)
    experiment = f"zhpipe-{config.identity}"
    closed = Tracker.close_orphans(experiment)
    if closed:
        log.info(
            "MLflow: %d runs left RUNNING by killed runs of this machine marked KILLED", len(closed)
        )
    title = run_name(config, request.changed())
    parent = Tracker.start(experiment, title, tags=source_tags(config, origin))
    # what a person compares; the whole config is config.json
    parent.params(config.flat_params(used_only=True))
    log_config(parent, experiment, config)
    parent.tags({"zhpipe.task": config.task, "zhpipe.overrides": " ".join(request.overrides)})
    run = RunContext(
        config,
        StageCache(store, full=verify, force=force),
        keys,
        experiment,
        parent.run_id,
        executor,
        causes,
        origin,
        title,
        request=request,
    )
    run.gate = Gate(config, report=ui_url(experiment, parent.run_id))
    return run


def log_config(parent: Tracker, experiment: str, config: PipelineConfig) -> None:
    """The whole resolved config as `config.json`, once per config hash in an experiment: a run
    whose config an earlier run holds points to it (tag `zhpipe.config_json`), so reruns add no
    artifacts."""
    digest = config.config_hash()
    earlier = parent.client.search_runs(
        [experiment_id(experiment)],
        max_results=1,
        filter_string=f"tags.`zhpipe.config_hash` = '{digest}' and "
        f"tags.`zhpipe.config_json` LIKE 'runs:/%'",
    )
    held = [r for r in earlier if r.info.run_id != parent.run_id]
    if held:
        parent.tags({"zhpipe.config_json": held[0].data.tags["zhpipe.config_json"]})
        return
    parent.text(
        json.dumps(config.model_dump(mode="json"), indent=2, ensure_ascii=False), "config.json"
    )
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
    parent.metrics(
        {
            "stages_hit": sum(r.cache == "hit" for r in results.values()),
            "stages_miss": sum(r.cache == "miss" for r in results.values()),
        }
    )
    source = results.get(kind.source.name)
    # what `zhpipe runs` shows a nightly user: rows read, and for partitions those new tonight
    if source is not None:
        counts = {"rows_read": source.rows or 0}
        if source.parts:
            # files (the source stage's partition units), not stage units: a file with any unit
            # built was built
            units = [u for r in results.values() for name, u in r.parts.items() if ":" in name]
            built = {u.stage.part for u in units if u.cache == "miss"}
            counts |= {
                "partitions_hit": sum(u.stage.part not in built for u in source.parts.values()),
                "partitions_miss": sum(u.stage.part in built for u in source.parts.values()),
                "rows_new": sum(u.rows or 0 for u in source.parts.values() if u.cache == "miss"),
            }
        parent.metrics(counts)
    splits = kind.splits(results)
    # the Dataset column: the splits this run trained, validated and tested on
    if splits is not None:
        for name, context in zip(SPLIT_NAMES, ("training", "validation", "testing")):
            path = results[splits.name].path / f"{name}.parquet"
            columns = ["id", "text"] + (["label"] if kind.labelled else [])
            parent.dataset(
                # read only for a split not described before
                lambda path=path, columns=columns: next(
                    iter_frames(path, DATASET_SAMPLE_ROWS, columns=columns)
                ).head(DATASET_SAMPLE_ROWS),
                source=str(path),
                name=f"{run.config.name}-{name}",
                context=context,
                rows=pq.ParquetFile(path).metadata.num_rows,
            )
    parent.finish(ok)


def label_flow_run(run: RunContext) -> None:
    """The Prefect flow run as people look for it: named like the MLflow parent run (pipeline,
    changed settings, time), tagged with the pipeline and task kind, and linked to the MLflow run by
    an artifact."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    from tasks.shared.reports import markdown_text

    if not flow_run.id:
        return
    tags = ["zhpipe", f"pipeline:{run.config.name}", f"task:{run.config.task}"]
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=run.title, tags=tags)
    except Exception as e:  # noqa: BLE001 - a name and tags are a convenience, never a failed run
        log.warning("could not name the Prefect flow run: %s", e)
    link = ui_url(run.experiment, run.parent_run_id)
    create_markdown_artifact(
        markdown=f"MLflow parent run [{run.parent_run_id}]({link}) of experiment "
        f"{markdown_text(run.experiment)} (open the UI with `zhpipe ui`)",
        key=artifact_key(run.config.name, "mlflow-run"),
        description="zhpipe: where this run's metrics and models are",
    )


def run_summary(
    run: RunContext, stages: list[str], results: dict[str, StageResult]
) -> dict[str, Any]:
    """What the flow returns: the parent run, what needs attention, each stage and each model unit
    (the models the training budget left untrained among them, with why)."""
    kind = run.config.kind
    return {
        "parent_run_id": run.parent_run_id,
        "attention": attention(run.gate, run.parent_run_id),
        "experiment": run.experiment,
        "stages": [
            {k: v for k, v in asdict(results[name]).items() if k != "parts"}
            | {"headline": kind.stages[name].headline}
            for name in stages
        ],
        "units": [
            {k: v for k, v in asdict(unit).items() if k != "parts"}
            for name in stages
            for unit in results[name].parts.values()
        ]
        + [
            {
                "stage": f"{kind.training.name}.{model}",
                "cache": "not trained",
                "seconds": 0.0,
                "rows": None,
                "metrics": {},
                "why": why,
            }
            for model, why in not_trained(run.config).items()
        ],
    }
