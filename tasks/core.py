"""What every stage shares: the base of its `Params`, the context its `build` receives and the
output it returns. A stage never publishes anything itself: the orchestration layer (flows/) writes
its output to the stage store and its metrics, tables, datasets and pictures to MLflow and
Prefect."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pandas as pd
from pydantic import BaseModel, ConfigDict

from tasks.util.io import sorted_labels
from tasks.util.pool import ChunkPool


class Section(BaseModel):
    """Base of every stage's and model's parameters: unknown keys are errors, values re-validated on
    --set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    # settings that change how the work is spread (processes, chunk sizes), never what it writes:
    # outside its key
    OUTSIDE_KEY: ClassVar[tuple[str, ...]] = ()
    # libraries of its stage's `libraries` that only the code of one of its settings imports (by
    # that setting's key): out of the stage's key while `unused` names the setting
    LIBRARIES_OF: ClassVar[dict[str, tuple[str, ...]]] = {}

    def unused(self) -> tuple[str, ...]:
        """Keys of this section whose settings the chosen options leave unread (a method's section
        when another method is chosen): left out of the parameters a run shows."""
        return ()

    def user_code(self) -> list:
        """The team's functions this section names (`tasks.util.usercode.CodeRef`): their code is in
        its key."""
        return []

    def own_models(self) -> dict:
        """The team's own models a training section declares (`train.<name>: {estimator: ...}`), by
        name."""
        return {}


class MetricSink(Protocol):
    """Where per-epoch curves go while a model trains (an MLflow run, in the pipeline)."""

    def metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...


class Unit(str):
    """The name of a unit of work, typed: a stage (`train`), a model unit of a per-model stage
    (`train.textcnn`), or a partition unit of a partitioned stage (`clean:2026-12-01.csv`), with its
    `stage`, `model` and `part`. It is the string it is written as in keys, manifests and MLflow
    (equal, hashed and serialised as it), so a name read back is parsed once, by `Unit.parse`, and a
    unit made here is never parsed again."""

    __slots__ = ("stage", "model", "part")

    def __new__(cls, stage: str, model: str = "", part: str = "") -> Unit:
        unit = super().__new__(
            cls, stage + (f".{model}" if model else "") + (f":{part}" if part else "")
        )
        unit.stage, unit.model, unit.part = stage, model, part
        return unit

    @classmethod
    def parse(cls, name: str) -> Unit:
        if isinstance(name, Unit):
            return name
        # file names may hold dots: the partition is split off first
        head, _, part = name.partition(":")
        stage, _, model = head.partition(".")
        return cls(stage, model, part)

    def __reduce__(self):  # pickled (to Dask workers, Prefect) as what it is
        return (Unit, (self.stage, self.model, self.part))


def model_unit(stage: str, model: str) -> Unit:
    """The unit of one model in a per-model stage (`train.textcnn`)."""
    return Unit(stage, model)


def partition_unit(stage: str, part: str) -> Unit:
    """The unit of one partition of a partitioned stage (`clean:2026-12-01.csv`)."""
    return Unit(stage, part=part)


def by_model(units: dict[str, Any]) -> dict[str, Any]:
    """Values keyed by model unit name (`train.textcnn`), re-keyed by model (`textcnn`)."""
    return {Unit.parse(name).model: value for name, value in units.items()}


@dataclass(frozen=True)
class Facts:
    """What a stage tells the stages after it, besides its files: each fact is a field (None: not
    known at this stage). A stage returns the facts it establishes; the run engine adds those of the
    stages it read (the nearest wins) and stores them in the output's manifest, so a stage reads
    `ctx.facts[<stage>]` of any stage it needs and never hands facts on by hand."""

    # the label set (classification) or entity types (ner), in a stable order
    labels: list[str] | None = None
    # download: the source's digest (`split=digest ...` for a ner source of several files)
    source_sha256: str | None = None
    # download: where the corpus was read from (relative to the project, redacted)
    source_file: str | None = None
    labelled: bool | None = None  # download: whether the source carries a label column
    # augment: the method that ran (a fallback may replace the configured one)
    augment_method_used: str | None = None
    model: str | None = None  # a model unit: its model
    # a train unit: the model's training summary (best epoch, history, size)
    summary: dict[str, Any] | None = None
    # an evaluate unit: its metrics; the evaluate stage: each model's
    results: dict[str, Any] | None = None
    models: dict[str, Any] | None = None  # the train stage: each model's summary
    best_model: str | None = None  # the evaluate stage: the model chosen on validation
    # what one kind or one stage establishes for itself, by name (ner's `tag_scheme` of each file
    # and the `given_splits` its source came in, profile's `font`): kept and handed on like the
    # others, and written beside them in a manifest, without a field here for every kind's own facts
    own: dict[str, Any] | None = None

    def but(self, **changes: Any) -> Facts:
        """These facts with some replaced."""
        return replace(self, **changes)

    def __getitem__(self, name: str) -> Any:
        """A fact by name, shared or a kind's own (None: not known)."""
        return getattr(self, name) if name in SHARED_FACTS else (self.own or {}).get(name)

    def to_json(self) -> dict[str, Any]:
        shared = {k: v for k, v in asdict(self).items() if v is not None and k != "own"}
        return {**(self.own or {}), **shared}

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> Facts:
        """Facts from a manifest: the shared ones by field, every other key a kind's or a stage's
        own."""
        doc = doc or {}
        own = {k: v for k, v in doc.items() if k not in SHARED_FACTS and v is not None}
        return cls(**{k: v for k, v in doc.items() if k in SHARED_FACTS}, own=own or None)


SHARED_FACTS = frozenset(f.name for f in fields(Facts)) - {"own"}


def established(stage: str, inputs: dict[str, Facts], own: Facts) -> Facts:
    """What a unit's output stands for: the facts it established (`own`) over those of what it read
    (`inputs`, by unit name; the first it names wins, as the nearest). A stage that gathers its own
    units (partitions, models) states what it gathered itself: their facts are not added."""
    known: dict = {}
    for name, facts in reversed(inputs.items()):
        if Unit.parse(name).stage != stage:
            known |= facts.to_json()
    return Facts.from_json(known | own.to_json())


def gathered(parts: list[Facts]) -> Facts:
    """The facts of a stage gathered from its partition units: the last partition's, with every
    partition's labels."""
    facts = parts[-1] if parts else Facts()
    labels = {label for f in parts for label in (f.labels or [])}
    return facts.but(labels=sorted_labels(labels)) if labels else facts


def _declares(template: str, name: str) -> bool:
    """Whether a declared output path (`{split}.parquet`) names `name`."""
    import re

    return re.fullmatch(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(template)), name) is not None


@dataclass
class BuildContext:
    """Everything a stage's `build` may use: its inputs' folders and facts, its output folder, its
    params."""

    inputs: dict[str, Path]
    facts: dict[str, Facts]  # each input's facts, by the same names
    out: Path
    params: Any  # the stage's Params
    # survives a killed build of the same key (checkpoints to resume from)
    scratch: Path | None = None
    pipeline: str = ""
    # the project folder: relative paths in params start here
    root: Path = field(default_factory=Path.cwd)
    # chunk pools: pool(workers) -> ChunkPool (local, or Dask from flows)
    pool: Callable[..., ChunkPool] = ChunkPool
    sink: MetricSink | None = None  # per-epoch curves while training
    # every stage's section of the pipeline, read-only (augment segments as segment does)
    stages: Any = None
    source: Any = None  # the pipeline's source (download)
    # the stage store's shared folders (download cache, translation cache)
    store: StoreAccess | None = None
    # a partition unit's (ordinal, file name); None for a whole-corpus build
    partition: tuple[int, str] | None = None
    # the inputs' metrics (gathering sums them)
    input_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    input_rows: dict[str, int | None] = field(default_factory=dict)
    # the outputs each input's stage declares (tasks/stages.py): `file` opens them by name; empty:
    # not checked
    outputs: dict[str, tuple] = field(default_factory=dict)

    def file(self, stage: str, name: str) -> Path:
        """A file of an input, by the name its stage declares (`validation.parquet` for
        `{split}.parquet`): a stage reads what the stages it needs declare, nothing else they happen
        to write."""
        declared = self.outputs.get(stage)
        if declared is not None and not any(_declares(o.path, name) for o in declared):
            raise KeyError(
                f"stage {stage!r} declares no output {name!r} (it declares "
                f"{', '.join(o.path for o in declared) or 'none'})"
            )
        return self.inputs[stage] / name


class StoreAccess(Protocol):
    """What a stage may ask of the stage store besides its own output folder."""

    def downloads(self, url: str) -> Path: ...  # a folder of the download cache for one URL

    # a file shared by all keys (the translation cache)
    def cache_file(self, name: str) -> Path: ...

    # the validators an unverified http(s) source must still match
    def expect(self, source: Any) -> Any: ...

    # a registered model: (models:/<name>/<version>, its local folder)
    def registered(self, uri: str) -> tuple[str, Path]: ...

    # the `ModelSpec` of a model of any kind (a registered model's loader)
    def model(self, name: str) -> Any: ...


# a file larger than this is recorded as an MLflow dataset by its schema and a digest of its head
# (this many rows)
DATASET_SAMPLE_ROWS = 10_000


@dataclass
class Dataset:
    """A frame to record as a run's input (MLflow 'Datasets used'); when `rows` is more than the
    frame holds, the frame is a sample (the head, DATASET_SAMPLE_ROWS rows) of a larger file at
    `source`."""

    frame: pd.DataFrame
    source: str
    name: str
    context: str
    rows: int | None = None


@dataclass
class BuildOutput:
    """What `build` returns: row count, scalar metrics, facts for later stages, and what to
    publish."""

    rows: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    facts: Facts = field(default_factory=Facts)
    # files or folders of the output to log (relative paths)
    artifacts: list[str] = field(default_factory=list)
    # MLflow table artifacts, by file name
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    datasets: list[Dataset] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)  # tags for the stage's run
    # Prefect markdown artifacts, by key suffix
    markdown: dict[str, str] = field(default_factory=dict)
    # Prefect table artifacts, by key suffix
    records: dict[str, list[dict]] = field(default_factory=dict)

    @classmethod
    def of_model(
        cls, model: str, rows: int, summary: dict, labels: list, totals: dict[str, str]
    ) -> BuildOutput:
        """A model unit's output: its training summary as facts, and the summary's totals as
        metrics under their run names (`totals`: summary key -> metric; the time and the median
        throughput are every model's; a key the summary lacks is left out). The per-epoch curves
        are the summary's history."""
        names = {
            **totals,
            "seconds": "train_seconds",
            "samples_per_second": "median_samples_per_second",
        }
        return cls(
            rows=rows,
            metrics={new: summary[old] for old, new in names.items() if old in summary},
            facts=Facts(labels=labels, model=model, summary=summary),
        )
