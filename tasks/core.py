"""What every stage shares: the base of its `Params`, the context its `build` receives and the output it
returns. A stage never publishes anything itself: the orchestration layer (flows/) writes its output to the
stage store and its metrics, tables, datasets and pictures to MLflow and Prefect."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import pandas as pd
from pydantic import BaseModel, ConfigDict

from tasks.io import Runner


class Section(BaseModel):
    """Base of every stage's and model's parameters: unknown keys are errors, values re-validated on --set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class MetricSink(Protocol):
    """Where per-epoch curves go while a model trains (an MLflow run, in the pipeline)."""

    def metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...


@dataclass
class BuildContext:
    """Everything a stage's `build` may use: its inputs' folders and facts, its output folder, its params."""

    inputs: dict[str, Path]
    input_info: dict[str, dict[str, Any]]
    out: Path
    params: Any  # the stage's Params
    scratch: Path | None = None  # survives a killed build of the same key (checkpoints to resume from)
    pipeline: str = ""
    root: Path = field(default_factory=Path.cwd)  # the project folder: relative paths in params start here
    runner: Callable[..., Runner] = Runner  # chunk runners: runner(workers) -> Runner (local, or Dask from flows)
    sink: MetricSink | None = None  # per-epoch curves while training
    stages: Any = None  # every stage's section of the pipeline, read-only (augment segments as segment does)
    source: Any = None  # the pipeline's source (download)
    store: "StoreAccess | None" = None  # the stage store's shared folders (download cache, translation cache)
    partition: tuple[int, str] | None = None  # a partition unit's (ordinal, file name); None for a whole-corpus build
    input_metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # the inputs' metrics (gathering sums them)
    input_rows: dict[str, int | None] = field(default_factory=dict)


class StoreAccess(Protocol):
    """What a stage may ask of the stage store besides its own output folder."""

    def downloads(self, url: str) -> Path: ...  # a folder of the download cache for one URL

    def cache_file(self, name: str) -> Path: ...  # a file shared by all keys (the translation cache)

    def expect(self, source: Any) -> Any: ...  # the validators an unverified http(s) source must still match

    def registered(self, uri: str) -> tuple[str, Path]: ...  # a registered model: (models:/<name>/<version>, its local folder)


# a file larger than this is recorded as an MLflow dataset by its schema and a digest of its head (this many rows)
DATASET_SAMPLE_ROWS = 10_000


@dataclass
class Dataset:
    """A frame to record as a run's input (MLflow 'Datasets used'); when `rows` is more than the frame holds,
    the frame is a sample (the head, DATASET_SAMPLE_ROWS rows) of a larger file at `source`."""

    frame: pd.DataFrame
    source: str
    name: str
    context: str
    rows: int | None = None


@dataclass
class BuildOutput:
    """What `build` returns: row count, scalar metrics, facts for later stages, and what to publish."""

    rows: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)  # files or folders of the output to log (relative paths)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # MLflow table artifacts, by file name
    datasets: list[Dataset] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)  # tags for the stage's run
    markdown: dict[str, str] = field(default_factory=dict)  # Prefect markdown artifacts, by key suffix
    records: dict[str, list[dict]] = field(default_factory=dict)  # Prefect table artifacts, by key suffix
