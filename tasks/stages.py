"""The stage graph and the task kinds, declared once. Beside the model registry (tasks/models): a stage is one
`Stage` entry (what it needs, the module whose `Params` and `build` compute it, what it writes, its headline
metric and help); a task kind is one `TaskKind` entry (its stage table, the metric that picks its best model,
the metrics a run reports, how its models are logged and served). `flows/` derives the CLI's stage names,
the key plan, the Prefect wiring, `status`, the run summary and `api.load` from these tables.

This module imports nothing heavy: the CLI reads it to parse arguments. A stage's module is imported when
the stage is planned or built (`Stage.module`)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Callable


@dataclass(frozen=True)
class Output:
    """A file (or folder) a stage writes that consumers open by name; `kind` says how `api.load` reads it:
    frame (parquet), splits (one parquet per split, `{split}.parquet`), json, csv, vocabulary (vocab.txt files),
    vectors (gensim KeyedVectors from word2vec's binary `.bin` or text `.vec` format), text (lines)."""

    path: str
    kind: str


@dataclass(frozen=True)
class PerModel:
    """A stage with a unit per model of the pipeline's model list (`<stage>.<model>`, ensembles after the models they
    are built from): each unit is built by the module's `build_model(ctx, model)` and tracked in its model's MLflow
    run, then the stage's `build(ctx)` gathers the units (`ctx.inputs` by unit name)."""

    # its units train the models: the stage's section holds the model list (`models`) and a section per model; a
    # unit's params are the shared settings its model reads and its own section; the saved model is logged to MLflow
    # (registered and served when chosen); an ensemble's unit reads its members' units
    trains: bool = False
    # the per-model stages whose unit of the same model each unit reads (evaluate's unit reads train's), by stage name
    reads: tuple[str, ...] = ()
    # needs a unit reads only when its model says so: need -> the `ModelSpec` flag (`{"embed": "uses_vectors"}`)
    optional: tuple[tuple[str, str], ...] = ()
    # its gathered facts name the best model (`Facts.best_model`) and each model's results: the pipeline registers
    # the best model after it, under the champion rule, on the test split of the needed stage that declares splits
    selects: bool = False


@dataclass(frozen=True)
class Stage:
    """One stage: a unit of the graph with its own key, store folder and MLflow run."""

    name: str
    needs: tuple[str, ...]  # the stages whose outputs it reads, by name (its build sees them as ctx.inputs[name])
    module_name: str  # its `Params` (the config section), `build(ctx)`, `LIBRARIES` and `FILES` (in the key)
    help: str  # one line for `zhpipe stages` and the CLI
    headline: str  # the one metric the run summary shows
    outputs: tuple[Output, ...] = ()
    models: PerModel | None = None  # a unit per model (train, evaluate): how they are made and what they are for
    # with a partitioned source (a folder or glob of files): a unit per partition (`<stage>:<file>`), then the
    # stage gathers them in order (tasks/partitions.py); a night with one new file builds only that file's units
    partitioned: bool = False
    cumulative: bool = False  # a partition unit also reads every earlier partition's output (global deduplication)
    # the module's functions for a partition unit and for gathering them (default: `build`, and concatenating
    # the partitions' files with tasks/partitions.py); vocab counts per partition and merges the counts
    part_build: str = "build"
    gather: str | None = None

    @property
    def per_model(self) -> bool:
        return self.models is not None

    def reads(self, need: str, model: str) -> bool:
        """Whether the unit of `model` reads the need `need` (an optional need is read only by models that say so)."""
        from tasks.models import MODELS

        flag = dict(self.models.optional).get(need) if self.models else None
        return flag is None or bool(getattr(MODELS[model], flag))

    @property
    def module(self) -> ModuleType:
        return importlib.import_module(self.module_name)

    @property
    def params(self) -> type:
        return self.module.Params


@dataclass(frozen=True)
class TaskKind:
    """What a pipeline's `task:` selects: its stages, its config schema (their `Params`), how it chooses and
    reports models. A kind's settings are its stages' sections: another kind's never enter its keys."""

    name: str
    about: str
    stages: dict[str, Stage]  # in graph order: a stage comes after everything it needs
    # the metric (without its split prefix) that picks the best model on validation and that the champion rule
    # compares on test; a callable of the config where a setting chooses it
    metric: Callable[[Any], str]
    reported: tuple[str, ...]  # the best model's test metrics the parent run shows (`best_<metric>`)
    flavour: str  # how a trained model is logged and served: "classifier" (texts -> labels) or "tagger"
    labelled: bool = True  # its splits carry a `label` column
    default_models: tuple[str, ...] = ()  # train.models when a pipeline names none (empty: the train section's default)
    check: Callable[[Any], None] | None = None  # cross-section rules of this kind (raise ValueError)
    check_stages: Callable[[Any], None] | None = None  # rules across its stage sections, on every change (raise ValueError)
    models_of: str = ""  # the task whose registered models it trains (`ModelSpec.task`; default: its own name)

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

    def units_read(self, names) -> set[str]:
        """The per-model stages whose units the per-model stages among `names` read (evaluate's units read train's)."""
        return {r for n in names if n in self.stages and self.stages[n].per_model for r in self.stages[n].models.reads}

    @property
    def training(self) -> Stage | None:
        """The stage whose units train the models (None: the kind trains none)."""
        return next((s for s in self.per_model if s.models.trains), None)

    @property
    def selection(self) -> Stage | None:
        """The stage that picks the best model, after which it is registered (None: nothing is registered)."""
        return next((s for s in self.per_model if s.models.selects), None)

    def test_split(self) -> Stage:
        """The stage whose test split the selection scored on (and the champion rule scores again): the last of its
        needs that declares splits."""
        needs = [self.stages[n] for n in self.selection.needs]
        return [s for s in needs if SPLITS in s.outputs][-1]

    def splits(self, names) -> Stage | None:
        """Of the stages `names`, the first (in graph order) that writes the run's splits: what a run trained,
        validated and tested on."""
        return next((s for s in self.stages.values() if s.name in names and SPLITS in s.outputs), None)


def _graph(*stages: Stage) -> dict[str, Stage]:
    """A stage table in graph order; an unknown or later dependency is an error at import."""
    table: dict[str, Stage] = {}
    for s in stages:
        missing = [d for d in s.needs if d not in table]
        if missing:
            raise ValueError(f"stage {s.name!r} needs {missing[0]!r}, which is not declared before it")
        table[s.name] = s
    return table


SPLITS = Output("{split}.parquet", "splits")
TRAINS = PerModel(trains=True, optional=(("embed", "uses_vectors"),))  # embed: only models that start from word vectors
SELECTS = PerModel(reads=("train",), selects=True)

CLASSIFICATION_STAGES = _graph(
    Stage("download", (), "tasks.download", "find or fetch the corpus (path, file:// or http(s):// URL), verify sha256, read it",
          "rows_raw", (Output("data.parquet", "frame"),), partitioned=True),
    Stage("clean", ("download",), "tasks.clean",
          "NFKC, strip HTML/URLs/control chars, optional t2s; quarantine empty/short/long/duplicate rows", "rows_dropped",
          (Output("data.parquet", "frame"),), partitioned=True, cumulative=True),
    Stage("split", ("clean",), "tasks.split", "stratified, seeded train/validation/test split", "rows_test", (SPLITS,),
          partitioned=True),
    Stage("segment", ("split",), "tasks.segment", "jieba words (+POS) and characters, in parallel processes or on Dask",
          "train_mean_words", (SPLITS,), partitioned=True),
    Stage("profile", ("segment",), "tasks.profile",
          "labels per split, lengths per label, top words/adjectives, word clouds, report.html (CJK font)",
          "suggested_max_len_words", (Output("stats.json", "json"),)),
    Stage("augment", ("segment",), "tasks.augment", "grow the train split with a registered augmenter (eda, backtranslation, none)",
          "rows_added", (Output("train.parquet", "frame"), Output("train.words.txt", "text")), partitioned=True),
    Stage("vocab", ("augment", "segment"), "tasks.vocab",
          "word and character vocab.txt (BERT-style specials) + frequency tables; validation OOV rate",
          "words_validation_oov_rate", (Output("words/vocab.txt", "vocabulary"), Output("chars/vocab.txt", "vocabulary")),
          partitioned=True, part_build="count", gather="gather"),
    Stage("embed", ("augment",), "tasks.embed",
          "gensim Word2Vec and fastText subword vectors; neighbours of probe words, PCA picture, projector export",
          "word2vec_vocab", (Output("word2vec.bin", "vectors"), Output("fasttext.vec", "vectors"))),
    Stage("train", ("augment", "segment", "vocab", "embed"), "tasks.train",
          "the models in train.models (the registry in tasks/models), checkpointed per epoch, early stopping",
          "textcnn_val_macro_f1", (Output("models.json", "json"),), models=TRAINS),
    Stage("evaluate", ("train", "segment"), "tasks.evaluate",
          "validation picks the best model; test metrics, confusion matrices, PR curves, worst mistakes; registers the best",
          "best_test_accuracy", (Output("comparison.csv", "csv"),), models=SELECTS),
)
# every stage name, in graph order: what the CLI's --from/--to/--only/--force accept
STAGE_NAMES = tuple(CLASSIFICATION_STAGES)


def _ner(name: str, help: str, headline: str | None = None, outputs: tuple[Output, ...] | None = None) -> Stage:
    """A ner stage: the classification stage of that name computed by `tasks.ner.<name>`."""
    base = CLASSIFICATION_STAGES[name]
    return replace(base, module_name=f"tasks.ner.{name}", help=help, headline=headline or base.headline, outputs=outputs or base.outputs,
                   partitioned=False)


NER_STAGES = _graph(
    _ner("download", "find or fetch the tagged files (CoNLL char-tag lines or span JSONL), verify sha256, read them"),
    _ner("clean", "NFKC and optional t2s per character, tags kept aligned, as BIOES; quarantine empty/long/duplicate sentences"),
    _ner("split", "the corpus' own train/validation/test files (split.use_given), else a seeded split of sentences"),
    CLASSIFICATION_STAGES["segment"],  # shared: characters and jieba words of the sentences
    _ner("profile", "entity types per split, entity lengths, sentence lengths, report.html", "entities"),
    _ner("augment", "the train split as it is (rewriting text would shift the tags)"),
    _ner("vocab", "character and bigram vocabularies, and the lexicon of jieba words the lexicon adapter matches", "lexicon_size",
         (Output("chars/vocab.txt", "vocabulary"), Output("bigrams/vocab.txt", "vocabulary"))),
    _ner("embed", "Word2Vec vectors of characters, bigrams and words (word2vec binary format)", "chars_vectors",
         (Output("chars.bin", "vectors"), Output("bigrams.bin", "vectors"), Output("words.bin", "vectors"))),
    _ner("train", "the taggers in train.models (CRF, BiLSTM-CRF, lexicon tagger, ensemble), scored by validation entity F1",
         "lexicon_tagger_val_f1"),
    _ner("evaluate", "validation entity F1 picks the best tagger; test precision/recall/F1 per type; registers the best",
         "best_test_f1"),
)


def _mt(name: str, help: str, headline: str | None = None, outputs: tuple[Output, ...] | None = None) -> Stage:
    """A translation stage: the classification stage of that name computed by `tasks.mt.<name>`."""
    base = CLASSIFICATION_STAGES[name]
    return replace(base, module_name=f"tasks.mt.{name}", help=help, headline=headline or base.headline, outputs=outputs or base.outputs,
                   partitioned=False, cumulative=False, part_build="build", gather=None)


TRANSLATION_STAGES = _graph(
    _mt("download", "find or fetch the sentence pairs (tab-separated or JSON lines), verify sha256, read them"),
    _mt("clean", "both sides normalised (t2s on the Chinese side); quarantine empty, over-long, misaligned and repeated pairs"),
    _mt("split", "pairs that share a side (or differ only in punctuation) kept on one side of every split line", "groups"),
    CLASSIFICATION_STAGES["segment"],  # shared: characters and jieba words of the Chinese side
    _mt("profile", "sentence lengths of both sides, their ratio, frequent tokens, example pairs, report.html", "suggested_max_len"),
    _mt("augment", "the train pairs as they are"),
    replace(_mt("vocab", "Chinese (characters or words) and English vocabularies, OOV rates", "zh_vocab_size",
                (Output("zh/vocab.txt", "vocabulary"), Output("en/vocab.txt", "vocabulary"))), needs=("augment", "segment")),
    replace(_mt("train", "the translators in train.models (seq2seq, seq2seq_attention, transformer_mt), in train.direction",
                "transformer_mt_val_bleu"), needs=("augment", "segment", "vocab")),
    _mt("evaluate", "validation BLEU picks the best translator; test BLEU and chrF (sacrebleu), BLEU by length, attention maps; "
        "registers the best", "best_test_bleu"),
)


def _check_ner(config: Any) -> None:
    """A ner pipeline's augment method is none: rewriting text would shift the tags."""
    if config.source.partitioned:
        raise ValueError("source.path: task ner reads one tagged file (and its given splits), not a folder or glob of partitions")
    augment = config.stages.augment
    if "method" not in augment.model_fields_set:
        augment.method = "none"
    if augment.method != "none":
        raise ValueError(f"augment.method {augment.method!r} rewrites text and would shift entity tags; task ner takes none")


def _check_translation(config: Any) -> None:
    """A translation pipeline reads one file of pairs and leaves them as they are."""
    if config.source.partitioned:
        raise ValueError("source.path: task translation reads one file of pairs, not a folder or glob of partitions")
    if config.source.splits:
        raise ValueError("source.splits (given validation/test files) is for task ner; task translation splits its pairs itself")
    augment = config.stages.augment
    if augment.method != "none":
        raise ValueError(f"augment.method {augment.method!r}: task translation takes none (a pair needs both sides rewritten alike)")


def _check_transformer_heads(stages: Any) -> None:
    """train.transformer: d_model (else the size of the vectors it starts from) must divide into its heads."""
    t = stages.train.transformer
    vectors = stages.embed.fasttext.dim if stages.train.embeddings == "fasttext" else stages.embed.word2vec.vector_size
    d_model = t.d_model or vectors
    if "transformer" in stages.train.models and d_model % t.num_heads:
        raise ValueError(f"train.transformer: d_model {d_model} (d_model, else the size of the train.embeddings vectors) "
                         f"must be a multiple of num_heads ({t.num_heads})")


def _check_classification(config: Any) -> None:
    if config.source.splits:
        raise ValueError("source.splits (given validation/test files) is for task ner; a classification corpus is split by the split stage")


KINDS: dict[str, TaskKind] = {kind.name: kind for kind in (
    TaskKind("classification", "texts to labels", CLASSIFICATION_STAGES, metric=lambda config: config.stages.evaluate.metric,
             reported=("test_accuracy", "test_macro_f1"), flavour="classifier", check=_check_classification,
             check_stages=_check_transformer_heads),
    TaskKind("ner", "sequence labelling: tagged corpora, taggers, entity F1", NER_STAGES, metric=lambda config: "f1",
             reported=("test_f1", "test_precision", "test_recall"), flavour="tagger", labelled=False,
             default_models=("crf", "bilstm_crf", "lexicon_tagger", "ner_ensemble"), check=_check_ner),
    TaskKind("translation", "sentence pairs: seq2seq translators, BLEU and chrF", TRANSLATION_STAGES, metric=lambda config: "bleu",
             reported=("test_bleu", "test_chrf"), flavour="translator", labelled=False,
             default_models=("seq2seq", "seq2seq_attention", "transformer_mt"), check=_check_translation),
)}


def kind(name: str) -> TaskKind:
    """The declaration of a task kind; an unknown name is one clear error."""
    from tasks.errors import ConfigError

    if name not in KINDS:
        raise ConfigError(f"unknown task {name!r} (task kinds: {', '.join(KINDS)})")
    return KINDS[name]


__all__ = ["KINDS", "STAGE_NAMES", "Output", "Stage", "TaskKind", "kind"]
