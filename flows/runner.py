"""Stage execution: plan the keys of a run, then build or reuse each stage and track it in MLflow."""
from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from flows import project
from flows.chunks import runner_for
from flows.config import STAGE_MODULES, PipelineConfig, flatten
from flows.fingerprint import code_fingerprint, file_fingerprints, library_versions
from flows.store import Manifest, StageStore, file_sha256, stage_key
from flows.tracking import Tracker
from tasks.core import BuildContext, BuildOutput
from tasks.errors import ZhpipeError
from tasks.io import resolve_path

# The pipeline's stages in run order, each with the stages whose outputs it reads.
STAGES: dict[str, tuple[str, ...]] = {
    "download": (),
    "clean": ("download",),
    "split": ("clean",),
    "segment": ("split",),
    "profile": ("segment",),
    "augment": ("segment",),
    "vocab": ("augment", "segment"),
    "embed": ("augment",),
    "train": ("augment", "segment", "vocab", "embed"),
    "evaluate": ("train", "segment"),
}

log = logging.getLogger("zhpipe")


def stage_params(config: PipelineConfig, stage: str) -> dict[str, Any]:
    """The resolved parameters that define one stage's output (the download stage's include the source)."""
    params = getattr(config.stages, stage).model_dump(mode="json")
    if stage == "download":
        params = {"source": config.source.model_dump(mode="json"), **params}
    return params


def source_fingerprint(config: PipelineConfig) -> str:
    """What identifies the raw bytes: the local file's sha256, else the declared sha256 or the URL."""
    src = config.source
    local = resolve_local(src.path) if src.path else None
    if local is not None and local.is_file():
        return file_sha256(local)
    return src.sha256 or src.url or src.path or ""


def resolve_local(location: str) -> Path | None:
    """A local path for `location` (plain path or file:// URL; relative paths from the project folder)."""
    return resolve_path(location, project.current().root)


def key_causes(config: PipelineConfig, stage: str, inputs: dict[str, str]) -> dict[str, Any]:
    """Everything a stage's key hashes: its params, its inputs' keys (the source's sha256 for download), the
    code that computes it, the libraries that shape it and the contents of the files its params name."""
    module = STAGE_MODULES[stage]
    params = stage_params(config, stage)
    return {
        "stage": stage,
        "params": params,
        "inputs": inputs,
        "code": code_fingerprint(module.__name__),
        "libraries": library_versions(module.LIBRARIES),
        "files": file_fingerprints(params, module.FILES, project.current().root),
    }


def plan(config: PipelineConfig) -> dict[str, dict[str, Any]]:
    """Every stage's key causes, computed from the config alone (so `status` needs no run)."""
    causes: dict[str, dict[str, Any]] = {}
    for stage, deps in STAGES.items():
        inputs = {"source": source_fingerprint(config)} if stage == "download" else {d: stage_key(causes[d]) for d in deps}
        causes[stage] = key_causes(config, stage, inputs)
    return causes


def plan_keys(config: PipelineConfig) -> dict[str, str]:
    """Every stage's key, computed from the config alone."""
    return {stage: stage_key(c) for stage, c in plan(config).items()}


@dataclass
class StageResult:
    """What a stage task hands to the next: a path and a few facts, never the data itself."""

    stage: str
    key: str
    path: Path
    cache: str  # "hit" or "miss"
    seconds: float
    rows: int | None
    metrics: dict[str, float]
    info: dict[str, Any]


@dataclass
class RunContext:
    """One pipeline run: config, planned keys, store, MLflow parent run, forced stages."""

    config: PipelineConfig
    store: StageStore
    keys: dict[str, str]
    experiment: str
    parent_run_id: str | None
    force: set[str] = field(default_factory=set)
    executor: str | None = None  # chunked work: None = local processes, "local" = a local Dask cluster, else its address
    causes: dict[str, dict[str, Any]] = field(default_factory=dict)  # per stage, what its key hashed
    verify: bool = False  # hash every file of a reused output, not only the small ones

    def reuse(self, stage: str) -> StageResult:
        """Load a cached stage without tracking it (for stages before --from)."""
        key = self.keys[stage]
        if not self.store.is_done(stage, key):
            raise ZhpipeError(
                f"stage '{stage}' has no cached output for this config (key {key}); run it first, e.g. `zhpipe run --to {stage}`"
            )
        if not self._sound(stage, key):
            raise ZhpipeError(f"stage '{stage}': its cached output {key} failed verification and was removed; "
                              f"rebuild it with `zhpipe run --from {stage}`")
        return self._result(self.store.manifest(stage, key), "hit", 0.0)

    def _sound(self, stage: str, key: str) -> bool:
        """Whether a cached output matches its manifest; a corrupt one is reported in one line and removed."""
        problems = self.store.verify(stage, key, full=self.verify)
        if problems:
            log.warning("%s: cached output %s is corrupt (%s); rebuilding it", stage, key, "; ".join(problems[:3]))
            self.store.discard(stage, key)
        return not problems

    def run(self, stage: str, inputs: dict[str, StageResult], build: Callable[[BuildContext], BuildOutput]) -> StageResult:
        """Reuse the stage's output when its key is in the store, else build it atomically; track either way.
        The key's lock is held throughout, so a concurrent run of the same key waits, then reuses."""
        key = self.keys[stage]
        t0 = time.perf_counter()
        with self.store.lock(stage, key):
            hit = stage not in self.force and self.store.is_done(stage, key) and self._sound(stage, key)
            params_model = getattr(self.config.stages, stage)
            tracker = Tracker.start(
                self.experiment,
                stage,
                parent=self.parent_run_id,
                tags={"zhpipe.stage": stage, "zhpipe.cache": "hit" if hit else "miss", "zhpipe.key": key},
            )
            try:
                tracker.params(flatten(stage_params(self.config, stage)))
                if hit:
                    manifest = self.store.manifest(stage, key)
                    tracker.tags({"zhpipe.artifacts_run_id": manifest.mlflow_run_id or ""})
                    log.info("%s: cached (%s)", stage, key)
                else:
                    manifest = self._build(stage, key, inputs, params_model, tracker, build)
                tracker.metrics({**manifest.metrics, "rows": manifest.rows or 0, "seconds": manifest.seconds})
            except BaseException:
                tracker.finish(ok=False)
                raise
            tracker.finish()
        return self._result(manifest, "hit" if hit else "miss", time.perf_counter() - t0)

    def _build(self, stage, key, inputs, params_model, tracker, build) -> Manifest:
        log.info("%s: building (%s)", stage, key)
        tmp = self.store.begin(stage, key)
        scratch = self.store.scratch(stage, key)
        if stage in self.force:  # --force means from scratch, not from the last checkpoint
            shutil.rmtree(scratch)
            scratch.mkdir()
        t0 = time.perf_counter()
        ctx = BuildContext(
            inputs={name: r.path for name, r in inputs.items()},
            input_info={name: r.info for name, r in inputs.items()},
            out=tmp,
            params=params_model,
            scratch=scratch,
            pipeline=self.config.name,
            root=project.current().root,
            runner=runner_for(self.executor),
            sink=tracker,
        )
        out = build(ctx)
        manifest = Manifest(
            stage=stage,
            key=key,
            params=stage_params(self.config, stage),
            inputs={name: r.key for name, r in inputs.items()},
            rows=out.rows,
            seconds=round(time.perf_counter() - t0, 3),
            metrics=out.metrics,
            info=out.info,
            mlflow_run_id=tracker.run_id,
            causes=self.causes.get(stage, {}),
        )
        final = self.store.publish(tmp, manifest)
        shutil.rmtree(scratch, ignore_errors=True)
        publish(tracker, final, out, self.config.name, stage)
        return manifest

    def _result(self, manifest: Manifest, cache: str, seconds: float) -> StageResult:
        return StageResult(
            stage=manifest.stage,
            key=manifest.key,
            path=self.store.local(manifest.stage, manifest.key),
            cache=cache,
            seconds=round(seconds, 3),
            rows=manifest.rows,
            metrics=manifest.metrics,
            info=manifest.info,
        )


def publish(tracker: Tracker, folder: Path, out: BuildOutput, pipeline: str, stage: str) -> None:
    """What a stage returned, where people look: files, tables, datasets and tags in its MLflow run, Markdown
    and tables as Prefect artifacts."""
    for rel in out.artifacts:  # a folder keeps its name in the run's artifacts, a file its folder
        where = rel if (folder / rel).is_dir() else str(Path(rel).parent) if Path(rel).parent != Path(".") else None
        tracker.artifact(folder / rel, where)
    for name, table in out.tables.items():
        tracker.table(table, name)
    for ds in out.datasets:
        tracker.dataset(ds.frame, source=ds.source, name=ds.name, context=ds.context)
    if out.tags:
        tracker.tags(out.tags)
    if out.markdown or out.records:
        from prefect.artifacts import create_markdown_artifact, create_table_artifact

        for suffix, text in out.markdown.items():
            create_markdown_artifact(text, key=artifact_key(pipeline, suffix), description=f"zhpipe {stage}")
        for suffix, rows in out.records.items():
            create_table_artifact(rows, key=artifact_key(pipeline, suffix), description=f"zhpipe {stage}")


def artifact_key(pipeline: str, suffix: str) -> str:
    """A Prefect artifact key: lower-case letters, digits and dashes."""
    return f"{pipeline}-{suffix}".replace("_", "-").lower()
