"""Text classification (`task: classification`): texts to labels. Its stages, one module each in
this package (download ... evaluate; segment is shared), and its declaration `KIND`."""

from __future__ import annotations

from typing import Any

from tasks.classification import (
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
from tasks.classification.starter import STARTERS
from tasks.graph import SELECTS, SPLITS, TRAINS, Output, Stage, TaskKind, graph
from tasks.shared.segment import SEGMENT

STAGES = graph(
    Stage(
        "download",
        (),
        download.build,
        "find or fetch the corpus (path, file:// or http(s):// URL), verify sha256, read it",
        "rows_raw",
        (Output("data.parquet", "frame"),),
        partitioned=True,
        params=download.Params,
        libraries=download.LIBRARIES,
        files=download.FILES,
    ),
    Stage(
        "clean",
        ("download",),
        clean.build,
        "NFKC, strip HTML/URLs/control chars, optional t2s; quarantine empty/short/long/duplicate "
        "rows",
        "rows_dropped",
        (Output("data.parquet", "frame"),),
        partitioned=True,
        cumulative=True,
        checked=True,
        params=clean.Params,
        libraries=clean.LIBRARIES,
        files=clean.FILES,
    ),
    Stage(
        "split",
        ("clean",),
        split.build,
        "seeded train/validation/test split by a hash of each text (a row keeps its split as the "
        "corpus grows; "
        "split.method: permutation cuts each class by the fractions)",
        "rows_test",
        (SPLITS,),
        partitioned=True,
        params=split.Params,
        libraries=split.LIBRARIES,
        files=split.FILES,
    ),
    SEGMENT,
    Stage(
        "profile",
        ("segment",),
        profile.build,
        "labels per split, lengths per label, top words/adjectives, word clouds, report.html (CJK "
        "font)",
        "suggested_max_len_words",
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
        "grow the train split with a registered augmenter (eda, backtranslation, none)",
        "rows_added",
        (Output("train.parquet", "frame"), Output("train.words.txt", "text")),
        partitioned=True,
        params=augment.Params,
        libraries=augment.LIBRARIES,
        files=augment.FILES,
    ),
    Stage(
        "vocab",
        ("augment", "segment"),
        vocab.build,
        "word and character vocab.txt (BERT-style specials) + frequency tables; validation OOV "
        "rate",
        "words_validation_oov_rate",
        (Output("words/vocab.txt", "vocabulary"), Output("chars/vocab.txt", "vocabulary")),
        partitioned=True,
        part_build=vocab.count,
        gather=vocab.gather,
        content=vocab.CONTENT,
        params=vocab.Params,
        libraries=vocab.LIBRARIES,
        files=vocab.FILES,
    ),
    Stage(
        "embed",
        ("augment",),
        embed.build,
        "gensim Word2Vec and fastText subword vectors; neighbours of probe words, PCA picture, "
        "projector export",
        "word2vec_vocab",
        (Output("word2vec.bin", "vectors"), Output("fasttext.vec", "vectors")),
        content=(("augment", "train.words.txt"),),
        params=embed.Params,
        libraries=embed.LIBRARIES,
        files=embed.FILES,
    ),
    Stage(
        "train",
        ("augment", "segment", "vocab", "embed"),
        train.build,
        "the models in train.models (the registry in tasks/models), checkpointed per epoch, early "
        "stopping",
        "textcnn_val_macro_f1",
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
        "validation picks the best model; test metrics, confusion matrices, PR curves, worst "
        "mistakes; registers the best",
        "best_test_accuracy",
        (Output("comparison.csv", "csv"),),
        models=SELECTS,
        build_model=evaluate.build_model,
        params=evaluate.Params,
        libraries=evaluate.LIBRARIES,
        files=evaluate.FILES,
    ),
)


def check(config: Any) -> None:
    if config.source.splits:
        raise ValueError(
            "source.splits (given validation/test files) is for task ner; a classification corpus "
            "is "
            "split by the split stage"
        )


def check_stages(stages: Any) -> None:
    """train.transformer: d_model (else the size of the vectors it starts from) must divide into its
    heads; a network that starts from fastText vectors needs the embed stage to train them."""
    if stages.train.embeddings == "fasttext" and not stages.embed.fasttext.enabled:
        raise ValueError(
            "train.embeddings: fasttext, but embed.fasttext.enabled is false (the networks start "
            "from "
            "the embed stage's vectors); set embed.fasttext.enabled=true or "
            "train.embeddings=word2vec"
        )
    t = stages.train.transformer
    vectors = (
        stages.embed.fasttext.dim
        if stages.train.embeddings == "fasttext"
        else stages.embed.word2vec.vector_size
    )
    d_model = t.d_model or vectors
    if "transformer" in stages.train.models and d_model % t.num_heads:
        raise ValueError(
            f"train.transformer: d_model {d_model} (d_model, else the size of the train.embeddings "
            f"vectors) must be a multiple of num_heads ({t.num_heads})"
        )


KIND = TaskKind(
    "classification",
    "texts to labels",
    STAGES,
    metric=lambda config: config.stages.evaluate.metric,
    reported=("test_accuracy", "test_macro_f1"),
    flavour="classifier",
    check=check,
    check_stages=check_stages,
    serving=serving,
    models=models.REGISTRY,
    shown=(("test acc", "best_test_accuracy"), ("test macro-F1", "best_test_macro_f1")),
    companions=(("accuracy", "macro_f1"),),
    starters=STARTERS,
)
