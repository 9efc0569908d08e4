"""The pipeline flow: download -> clean -> split -> segment -> augment -> vocab -> embed -> train -> evaluate."""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow

from flows.config import PROJECT_ROOT, PipelineConfig
from flows.runner import STAGES, RunContext, StageResult, plan_keys, source_fingerprint
from flows.store import StageStore
from flows.tracking import Tracker
from tasks.augment import augment
from tasks.clean import clean
from tasks.download import download
from tasks.embed import embed
from tasks.evaluate import evaluate
from tasks.segment import segment
from tasks.split import split
from tasks.train import train
from tasks.vocab import vocab

DATA_ROOT = Path(os.environ.get("ZHPIPE_DATA", PROJECT_ROOT / "data"))  # the stage store
# the one number per stage that the run summary shows
HEADLINE = {
    "download": "rows_raw", "clean": "rows_dropped", "split": "rows_test", "segment": "train_mean_words",
    "augment": "rows_added", "vocab": "words_validation_oov_rate", "embed": "word2vec_vocab",
    "train": "textcnn_val_macro_f1", "evaluate": "best_test_accuracy",
}


def select_stages(start: str | None = None, stop: str | None = None, only: str | None = None) -> list[str]:
    """Stages to run for --from/--to/--only, in order."""
    names = list(STAGES)
    if only:
        return [only]
    lo = names.index(start) if start else 0
    hi = names.index(stop) if stop else len(names) - 1
    return names[lo : hi + 1]


def forced_stages(force: list[str] | None) -> set[str]:
    """--force STAGE rebuilds that stage and every stage after it; a bare --force rebuilds all."""
    if force is None:
        return set()
    names = list(STAGES)
    if not force:
        return set(names)
    first = min(names.index(s) for s in force)
    return set(names[first:])


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def start_run(config: PipelineConfig, force: set[str], data_root: Path) -> RunContext:
    """Plan keys and open the MLflow parent run of this pipeline run."""
    keys = plan_keys(config)
    experiment = f"zhpipe-{config.name}"
    parent = Tracker.start(
        experiment,
        f"{config.name}-{time.strftime('%m%d-%H%M%S')}",
        tags={
            "zhpipe.pipeline": config.name,
            "zhpipe.git_commit": git_commit(),
            "zhpipe.config_hash": config.config_hash(),
            "zhpipe.source_sha256": source_fingerprint(config),
        },
    )
    parent.params(config.flat_params())
    return RunContext(config, StageStore(data_root), keys, experiment, parent.run_id, force)


def finish_run(run: RunContext, results: dict[str, StageResult], ok: bool) -> None:
    """Parent-run summary metrics and tags, then close it."""
    parent = Tracker(run.parent_run_id)
    evaluation = results.get("evaluate")
    if evaluation is not None:
        best = evaluation.info["best_model"]
        parent.metrics({"best_test_accuracy": evaluation.info["results"][best]["test_accuracy"],
                        "best_test_macro_f1": evaluation.info["results"][best]["test_macro_f1"]})
        parent.tags({"zhpipe.best_model": best})
    parent.metrics({"stages_hit": sum(r.cache == "hit" for r in results.values()),
                    "stages_miss": sum(r.cache == "miss" for r in results.values())})
    parent.finish(ok)


@flow(name="zhpipe", log_prints=True, validate_parameters=False)
def pipeline_flow(
    config: PipelineConfig, stages: list[str] | None = None, force: list[str] | None = None, data_root: str | None = None
) -> dict[str, Any]:
    """Run the selected stages of one pipeline; earlier stages they need are read from the stage store."""
    stages = stages or list(STAGES)
    run = start_run(config, forced_stages(force), Path(data_root) if data_root else DATA_ROOT)
    needed = set(stages) | {d for s in stages for d in STAGES[s]}
    results: dict[str, StageResult] = {}

    def step(name, task, *inputs):
        if name in stages:
            results[name] = task(run, *inputs)
        elif name in needed:
            results[name] = run.reuse(name)
        return results.get(name)

    ok = False
    try:
        d = step("download", download.with_options(retries=config.stages.download.retries))
        c = step("clean", clean, d)
        s = step("split", split, c)
        seg = step("segment", segment, s)
        a = step("augment", augment, seg)
        v = step("vocab", vocab, a, seg)
        e = step("embed", embed, a)
        t = step("train", train, a, seg, v, e)
        step("evaluate", evaluate, t, seg)
        ok = True
    finally:
        finish_run(run, {k: r for k, r in results.items() if k in stages}, ok)
    return {
        "parent_run_id": run.parent_run_id,
        "experiment": run.experiment,
        "stages": [asdict(results[name]) | {"headline": HEADLINE[name]} for name in stages],
    }
