"""The vocabulary of the plan of the house: a `Stage` (what it needs, the function that computes it,
what it writes, its headline metric, a unit per partition or per model), a `TaskKind` (its stage
table, how it chooses and reports models). Each kind declares its table in its own package
(tasks/classification, tasks/ner, tasks/translation), with the functions of its stage modules; the
stage every kind shares (segment) is declared in tasks/shared/segment.py; tasks/stages.py gathers
them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Output:
    """A file (or folder) a stage writes that consumers open by name; `kind` says how `api.load`
    reads it: frame (parquet), splits (one parquet per split, `{split}.parquet`), json, csv,
    vocabulary (vocab.txt files), vectors (gensim KeyedVectors from word2vec's binary `.bin` or text
    `.vec` format), text (lines)."""

    path: str
    kind: str


@dataclass(frozen=True)
class PerModel:
    """A stage with a unit per model of the pipeline's model list (`<stage>.<model>`, ensembles
    after the models they are built from): each unit is built by the module's `build_model(ctx,
    model)` and tracked in its model's MLflow run, then the stage's `build(ctx)` gathers the units
    (`ctx.inputs` by unit name)."""

    # its units train the models: the stage's section holds the model list (`models`) and a section
    # per model; a unit's params are the shared settings its model reads and its own section; the
    # saved model is logged to MLflow (registered and served when chosen); an ensemble's unit reads
    # its members' units
    trains: bool = False
    # the per-model stages whose unit of the same model each unit reads (evaluate's unit reads
    # train's), by stage name
    reads: tuple[str, ...] = ()
    # needs a unit reads only when its model says so: need -> the `ModelSpec` flag (`{"embed":
    # "uses_vectors"}`)
    optional: tuple[tuple[str, str], ...] = ()
    # its gathered facts name the best model (`Facts.best_model`) and each model's results: the
    # pipeline registers the best model after it, under the champion rule, on the test split of the
    # needed stage that declares splits
    selects: bool = False


@dataclass(frozen=True)
class Stage:
    """One stage: a unit of the graph with its own key, store folder and MLflow run."""

    name: str
    # the stages whose outputs it reads, by name (its build sees them as ctx.inputs[name])
    needs: tuple[str, ...]
    # build(ctx) -> BuildOutput; every function named here is of the one module
    build: Callable[[Any], Any]
    help: str  # one line for `zhpipe stages` and the CLI
    headline: str  # the one metric the run summary shows
    outputs: tuple[Output, ...] = ()
    # its config section: a pydantic model, or a function that makes it when the config is read (the
    # training stage's: the shared settings and a section per model registered by then, the team's
    # own included)
    params: Any = None
    # the distributions that shape its output: their versions are in its key
    libraries: tuple[str, ...] = ()
    # dotted paths into its params that name files: their contents are in its key
    files: tuple[str, ...] = ()
    # a unit per model (train, evaluate): how they are made and what they are for
    models: PerModel | None = None
    # with a partitioned source (a folder or glob of files): a unit per partition
    # (`<stage>:<file>`), then the stage gathers them in order (tasks/shared/partitions.py); a night
    # with one new file builds only that file's units
    partitioned: bool = False
    # a partition unit also reads every earlier partition's output (global deduplication)
    cumulative: bool = False
    # a partition unit's function and the one that gathers them (default: `build`, and concatenating
    # the partitions' files with tasks/shared/partitions.py); vocab counts per partition and merges
    # the counts
    part_build: Callable[[Any], Any] | None = None
    gather: Callable[[Any], Any] | None = None
    # a per-model stage's unit: build_model(ctx, model)
    build_model: Callable[[Any, str], Any] | None = None
    # the data checks (tasks/shared/checks.py) are judged on its output: per partition, or whole
    checked: bool = False
    # no stage needs it and its build keeps one core busy: a run on this machine builds it in a
    # process of its own while the models train (its build then reads its own section only: no
    # `stages`, `source`, `store` or `sink`)
    beside: bool = False
    # the files of its needs (`(need, file)`, or `(need, file, columns)` for the columns of a
    # Parquet file it reads) that its output is a function of, with its params, code, libraries
    # and files: nothing else of those needs (embed reads the train split's words, never its
    # labels). An output built from the same content is reused under a new key, as DVC's run
    # cache does: a pipeline that differs upstream only in what this stage does not read (the
    # label column) reuses it. A stage built per partition is reused so only when it is built
    # whole (its gathering merges the partitions' work, not these files)
    content: tuple[tuple[str, str] | tuple[str, str, tuple[str, ...]], ...] = ()

    def __post_init__(self):
        """A stage's functions are its module's, and the module declares what its key needs: checked
        when its kind is declared, so a wrong entry fails at import, not in a run."""
        where = f"stage {self.name!r}"
        functions = [
            f for f in (self.build, self.part_build, self.gather, self.build_model) if f is not None
        ]
        if not all(
            callable(f) and getattr(f, "__module__", None) == self.module_name for f in functions
        ):
            raise TypeError(
                f"{where}: build, part_build, gather and build_model must be functions of one "
                "module "
                f"({self.module_name})"
            )
        if self.params is None or not (isinstance(self.params, type) or callable(self.params)):
            raise TypeError(
                f"{where}: params= must be its config section (a pydantic model, or a function "
                "that "
                f"makes one)"
            )
        if not all(
            isinstance(t, tuple) and all(isinstance(x, str) for x in t)
            for t in (self.libraries, self.files)
        ):
            raise TypeError(f"{where}: libraries= and files= must be tuples of names")
        if self.per_model != (self.build_model is not None):
            raise TypeError(
                f"{where}: a stage has build_model exactly when it has a unit per model "
                "(models=...)"
            )
        if any(need not in self.needs for need, *_ in self.content):
            raise TypeError(f"{where}: content= names files of the stages it needs only")
        if any(len(c) == 3 and not (c[2] and isinstance(c[2], tuple)) for c in self.content):
            raise TypeError(f"{where}: content= columns are a tuple of column names")
        if self.content and self.per_model:
            raise TypeError(f"{where}: content= is for a stage of one unit or of partitions")
        if self.beside and (self.per_model or self.partitioned or self.checked):
            raise TypeError(f"{where}: a stage built beside the others is one unit and unchecked")

    @property
    def per_model(self) -> bool:
        return self.models is not None

    def reads(self, need: str, spec: Any) -> bool:
        """Whether the unit of a model (its `ModelSpec`) reads the need `need` (an optional need is
        read only by models that say so)."""
        flag = dict(self.models.optional).get(need) if self.models else None
        return flag is None or bool(getattr(spec, flag))

    @property
    def module_name(self) -> str:
        return self.build.__module__

    def section(self) -> type:
        """The class of its config section (made now when `params` is a function)."""
        return self.params if isinstance(self.params, type) else self.params()


@dataclass(frozen=True)
class Starter:
    """How `zhpipe init --<option> PATH` starts a project for a corpus of a kind (the default
    kind's first starter is what a plain `zhpipe init` writes). `template` is its pipelines.yaml,
    formatted with name, description, path, sha256 (the pin line; empty for a folder or the
    example), format (`format_of(path)`), text_column and label_column (JSON-quoted), each of
    `options` (flag, default, help: a comma-separated list, given to the template as a JSON list)
    and what `sized(rows)` gives for the corpus' size (None: the example)."""

    option: str
    help: str
    template: str
    format_of: Callable[[Any], str] = lambda path: ""
    options: tuple[tuple[str, str, str], ...] = ()
    # a CSV corpus: its header must name the text column (and the label column, when "label" is
    # here), as --text-column and --label-column say
    columns: tuple[str, ...] = ()
    # the corpus is a folder of CSV files, one per night (brought into data/raw/<folder>/)
    folder: bool = False
    # the corpus a project given none starts from (a frame); None: a corpus must be given
    example: Callable[[], Any] | None = None
    sized: Callable[[int | None], dict[str, str]] = lambda rows: {}

    def defaults(self) -> dict[str, str]:
        """Its options by their argument names (`--columns` -> `columns`), with their defaults."""
        return {flag.removeprefix("--").replace("-", "_"): d for flag, d, _ in self.options}


@dataclass(frozen=True)
class TaskKind:
    """What a pipeline's `task:` selects: its stages, its config schema (their `Params`), how it
    chooses and reports models. A kind's settings are its stages' sections: another kind's never
    enter its keys."""

    name: str
    about: str
    stages: dict[str, Stage]  # in graph order: a stage comes after everything it needs
    # the metric (without its split prefix) that picks the best model on validation and that the
    # champion rule compares on test; a callable of the config where a setting chooses it
    metric: Callable[[Any], str]
    # the best model's test metrics the parent run shows (`best_<metric>`)
    reported: tuple[str, ...]
    # what its models are, as `zhpipe models` lists them: "classifier", "tagger", "translator"
    flavour: str
    labelled: bool = True  # its splits carry a `label` column
    # train.models when a pipeline names none (empty: the train section's default)
    default_models: tuple[str, ...] = ()
    # cross-section rules of this kind (raise ValueError)
    check: Callable[[Any], None] | None = None
    # rules across its stage sections, on every change (raise ValueError)
    check_stages: Callable[[Any], None] | None = None
    # the task whose registered models it trains (`ModelSpec.task`; default: its own name)
    models_of: str = ""
    # the module that serves its registered models on raw text and scores them for the champion
    # rule, itself (see tasks/serving.py for what it holds); None: the kind registers no model of
    # its own (it serves as `models_of`'s)
    serving: ModuleType | None = None
    # its models by name (`ModelSpec`s); none: trains another's
    models: Mapping[str, Any] = field(default_factory=dict)
    # the columns of its test split, besides id and text, that score a model
    scored: tuple[str, ...] = ("label",)
    # its `zhpipe runs` columns: (heading, the parent run's metric)
    shown: tuple[tuple[str, str], ...] = ()
    # `zhpipe init --<option> PATH` for the corpora of this kind
    starters: tuple[Starter, ...] = ()
    # metrics the end-of-run table shows beside a headline that names the first (accuracy alone
    # hides a class left behind)
    companions: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        needed = {need for s in self.stages.values() for need in s.needs}
        wrong = [s.name for s in self.stages.values() if s.beside and s.name in needed]
        if wrong:
            raise TypeError(
                f"task kind {self.name!r}: stage {wrong[0]!r} is built beside the "
                f"others, yet another stage needs it"
            )

    @property
    def model_task(self) -> str:
        return self.models_of or self.name

    def stage(self, name: str) -> Stage:
        return self.stages[name]

    @property
    def per_model(self) -> tuple[Stage, ...]:
        """Its stages with a unit per model, in graph order."""
        return tuple(s for s in self.stages.values() if s.per_model)

    @property
    def source(self) -> Stage:
        """The stage that reads the pipeline's source (it needs no other stage)."""
        return next(s for s in self.stages.values() if not s.needs)

    @property
    def checked(self) -> Stage | None:
        """The stage whose output the data checks judge (its kind's cleaned rows), None: no
        checks."""
        return next((s for s in self.stages.values() if s.checked), None)

    def units_read(self, names) -> set[str]:
        """The per-model stages whose units the per-model stages among `names` read (evaluate's
        units read train's)."""
        return {
            r
            for n in names
            if n in self.stages and self.stages[n].per_model
            for r in self.stages[n].models.reads
        }

    @property
    def training(self) -> Stage | None:
        """The stage whose units train the models (None: the kind trains none)."""
        return next((s for s in self.per_model if s.models.trains), None)

    @property
    def selection(self) -> Stage | None:
        """The stage that picks the best model, after which it is registered (None: nothing is
        registered)."""
        return next((s for s in self.per_model if s.models.selects), None)

    def test_split(self) -> Stage:
        """The stage whose test split the selection scored on (and the champion rule scores again):
        the last of its needs that declares splits."""
        needs = [self.stages[n] for n in self.selection.needs]
        return [s for s in needs if SPLITS in s.outputs][-1]

    def splits(self, names) -> Stage | None:
        """Of the stages `names`, the first (in graph order) that writes the run's splits: what a
        run trained, validated and tested on."""
        return next(
            (s for s in self.stages.values() if s.name in names and SPLITS in s.outputs), None
        )


def graph(*stages: Stage) -> dict[str, Stage]:
    """A stage table in graph order; an unknown or later dependency is an error at import."""
    table: dict[str, Stage] = {}
    for s in stages:
        missing = [d for d in s.needs if d not in table]
        if missing:
            raise ValueError(
                f"stage {s.name!r} needs {missing[0]!r}, which is not declared before it"
            )
        table[s.name] = s
    return table


SPLITS = Output("{split}.parquet", "splits")
# embed: only models that start from word vectors
TRAINS = PerModel(trains=True, optional=(("embed", "uses_vectors"),))
SELECTS = PerModel(reads=("train",), selects=True)
