"""Named-entity recognition (`task: ner`): tagged sentences to entities. Its stages, one module each
in this package (segment is shared), the tag schemes and readers (tagging.py), and its declaration
`KIND`."""

from __future__ import annotations

from typing import Any

from tasks.graph import SELECTS, SPLITS, TRAINS, Output, Stage, Starter, TaskKind, graph
from tasks.ner import (
    augment,
    clean,
    download,
    embed,
    evaluate,
    models,
    profile,
    serving,
    split,
    train,
    vocab,
)
from tasks.shared.segment import SEGMENT

STAGES = graph(
    Stage(
        "download",
        (),
        download.build,
        "find or fetch the tagged files (CoNLL char-tag lines or span JSONL), "
        "verify sha256, read them",
        "rows_raw",
        (Output("data.parquet", "frame"),),
        params=download.Params,
        libraries=download.LIBRARIES,
        files=download.FILES,
    ),
    Stage(
        "clean",
        ("download",),
        clean.build,
        "NFKC and optional t2s per character, tags kept aligned, as BIOES; quarantine "
        "empty/long/duplicate sentences",
        "rows_dropped",
        (Output("data.parquet", "frame"),),
        checked=True,
        params=clean.Params,
        libraries=clean.LIBRARIES,
        files=clean.FILES,
    ),
    Stage(
        "split",
        ("clean",),
        split.build,
        "the corpus' own train/validation/test files (split.use_given), else "
        "a seeded split of sentences",
        "rows_test",
        (SPLITS,),
        params=split.Params,
        libraries=split.LIBRARIES,
        files=split.FILES,
    ),
    SEGMENT,  # characters and jieba words of the sentences
    Stage(
        "profile",
        ("segment",),
        profile.build,
        "entity types per split, entity lengths, sentence lengths, report.html",
        "entities",
        (Output("stats.json", "json"),),
        beside=True,
        params=profile.Params,
        libraries=profile.LIBRARIES,
        files=profile.FILES,
    ),
    Stage(
        "augment",
        ("segment",),
        augment.build,
        "the train split as it is (rewriting text would shift the tags)",
        "rows_added",
        (Output("train.parquet", "frame"), Output("train.words.txt", "text")),
        params=augment.Params,
        libraries=augment.LIBRARIES,
        files=augment.FILES,
    ),
    Stage(
        "vocab",
        ("augment", "segment"),
        vocab.build,
        "character and bigram vocabularies, and the lexicon of jieba words the lexicon adapter "
        "matches",
        "lexicon_size",
        (Output("chars/vocab.txt", "vocabulary"), Output("bigrams/vocab.txt", "vocabulary")),
        params=vocab.Params,
        libraries=vocab.LIBRARIES,
        files=vocab.FILES,
    ),
    Stage(
        "embed",
        ("augment",),
        embed.build,
        "Word2Vec vectors of characters, bigrams and words (word2vec binary format)",
        "chars_vectors",
        (
            Output("chars.bin", "vectors"),
            Output("bigrams.bin", "vectors"),
            Output("words.bin", "vectors"),
        ),
        params=embed.Params,
        libraries=embed.LIBRARIES,
        files=embed.FILES,
    ),
    Stage(
        "train",
        ("augment", "segment", "vocab", "embed"),
        train.build,
        "the taggers in train.models (CRF, BiLSTM-CRF, lexicon tagger, ensemble), scored by "
        "validation entity F1",
        "lexicon_tagger_val_f1",
        (Output("models.json", "json"),),
        models=TRAINS,
        build_model=train.build_model,
        params=train.params,
        libraries=train.LIBRARIES,
        files=train.FILES,
    ),
    Stage(
        "evaluate",
        ("train", "segment"),
        evaluate.build,
        "validation entity F1 picks the best tagger; test precision/recall/F1 per type; registers "
        "the best",
        "best_test_f1",
        (Output("comparison.csv", "csv"),),
        models=SELECTS,
        build_model=evaluate.build_model,
        params=evaluate.Params,
        libraries=evaluate.LIBRARIES,
        files=evaluate.FILES,
    ),
)


def check(config: Any) -> None:
    """A ner pipeline reads one tagged file (and its given splits); its augment method is none:
    rewriting text would shift the tags."""
    if config.source.partitioned:
        raise ValueError(
            "source.path: task ner reads one tagged file (and its given splits), not a folder "
            "or glob of partitions"
        )
    augment = config.stages.augment
    if "method" not in augment.model_fields_set:
        augment.method = "none"
    if augment.method != "none":
        raise ValueError(
            f"augment.method {augment.method!r} rewrites text and would shift entity "
            f"tags; task ner takes none"
        )


# `zhpipe init --ner FILE`: the starter pipelines.yaml
TEMPLATE = """\
# zhpipe pipelines: `zhpipe run` runs the first one, `zhpipe run NAME` another.
pipelines:
  {name}:
    description: {description}
    task: ner
    source:
      path: {path}
{sha256}      # conll: one `char TAG` per line, a blank line between sentences (BIO, BIOES, BMES)
      format: {format}
    stages:
      train:
        # on 2 CPU cores the CRF trains in about 30 s on Resume NER's 3,800 sentences and
        # 10-15 min on 20,000 longer news sentences (its progress is logged every 30 s);
        # bilstm_crf and lexicon_tagger (networks) take minutes to an hour: add them with
        # --set 'train.models=[crf, bilstm_crf]' (--set train.budget=10min bounds them)
        models: [crf]
"""
STARTER = Starter(
    "ner",
    "a tagged NER corpus: CoNLL `char TAG` lines or span JSON lines (task ner)",
    TEMPLATE,
    format_of=lambda path: "jsonl" if path.suffix in (".jsonl", ".json") else "conll",
)


KIND = TaskKind(
    "ner",
    "sequence labelling: tagged corpora, taggers, entity F1",
    STAGES,
    metric=lambda config: "f1",
    serving=serving,
    models=models.MODELS,
    scored=("tags",),
    shown=(("test entity F1", "best_test_f1"),),
    reported=("test_f1", "test_precision", "test_recall"),
    flavour="tagger",
    labelled=False,
    default_models=("crf", "bilstm_crf", "lexicon_tagger", "ner_ensemble"),
    check=check,
    starters=(STARTER,),
)
