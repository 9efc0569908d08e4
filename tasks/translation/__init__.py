"""Translation (`task: translation`): sentence pairs, a Chinese side in `text` (segmented by the
shared segment stage) and an English side in `en`, translated either way by the seq2seq models of
tasks/translation/models.py. Its stages, one module each in this package (no embed), and its
declaration `KIND`."""

from __future__ import annotations

from typing import Any

from tasks.graph import SELECTS, SPLITS, TRAINS, Output, Stage, Starter, TaskKind, graph
from tasks.shared.segment import SEGMENT
from tasks.translation import (
    augment,
    clean,
    download,
    evaluate,
    models,
    profile,
    serving,
    split,
    train,
    vocab,
)

STAGES = graph(
    Stage(
        "download",
        (),
        download.build,
        "find or fetch the sentence pairs (tab-separated or JSON lines), verify sha256, read them",
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
        "both sides normalised (t2s on the Chinese side); quarantine empty, over-long, misaligned "
        "and repeated pairs",
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
        "pairs that share a side (or differ only in punctuation) kept on one side of every split "
        "line",
        "groups",
        (SPLITS,),
        params=split.Params,
        libraries=split.LIBRARIES,
        files=split.FILES,
    ),
    SEGMENT,  # characters and jieba words of the Chinese side
    Stage(
        "profile",
        ("segment",),
        profile.build,
        "sentence lengths of both sides, their ratio, frequent tokens, example pairs, report.html",
        "suggested_max_len",
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
        "the train pairs as they are",
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
        "Chinese (characters or words) and English vocabularies, OOV rates",
        "zh_vocab_size",
        (Output("zh/vocab.txt", "vocabulary"), Output("en/vocab.txt", "vocabulary")),
        params=vocab.Params,
        libraries=vocab.LIBRARIES,
        files=vocab.FILES,
    ),
    Stage(
        "train",
        ("augment", "segment", "vocab"),
        train.build,
        "the translators in train.models (seq2seq, seq2seq_attention, transformer_mt), in "
        "train.direction",
        "transformer_mt_val_bleu",
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
        "validation BLEU picks the best translator; test BLEU and chrF (sacrebleu), BLEU by "
        "length, attention maps; "
        "registers the best",
        "best_test_bleu",
        (Output("comparison.csv", "csv"),),
        models=SELECTS,
        build_model=evaluate.build_model,
        params=evaluate.Params,
        libraries=evaluate.LIBRARIES,
        files=evaluate.FILES,
    ),
)


def check(config: Any) -> None:
    """A translation pipeline reads one file of pairs and leaves them as they are."""
    if config.source.partitioned:
        raise ValueError(
            "source.path: task translation reads one file of pairs, not a folder or glob of "
            "partitions"
        )
    if config.source.splits:
        raise ValueError(
            "source.splits (given validation/test files) is for task ner; task translation "
            "splits its pairs itself"
        )
    augment = config.stages.augment
    if augment.method != "none":
        raise ValueError(
            f"augment.method {augment.method!r}: task translation takes none (a pair needs both "
            "sides "
            f"rewritten alike)"
        )


# `zhpipe init --pairs FILE`: the starter pipelines.yaml
TEMPLATE = """\
# zhpipe pipelines: `zhpipe run` runs the first one, `zhpipe run NAME` another.
pipelines:
  {name}:
    description: {description}
    task: translation
    source:
      path: {path}
{sha256}      # tsv: one pair per line, fields in download.columns order;
      # jsonl: {{"zh": ..., "en": ...}}
      format: {format}
    stages:
      download: {{columns: {columns}}}
      clean: {{traditional_to_simplified: true}}
      train:
        direction: zh-en
        # seq2seq, seq2seq_attention compare the course's GRU encoder-decoders
        models: [transformer_mt]
"""
STARTER = Starter(
    "pairs",
    "Chinese-English sentence pairs: tab-separated or JSON lines (task translation)",
    TEMPLATE,
    format_of=lambda path: "jsonl" if path.suffix in (".jsonl", ".json") else "tsv",
    options=(
        (
            "--columns",
            "en,zh",
            "with --pairs, tab-separated: the fields of a line in order (default en,zh)",
        ),
    ),
)


KIND = TaskKind(
    "translation",
    "sentence pairs: seq2seq translators, BLEU and chrF",
    STAGES,
    metric=lambda config: "bleu",
    serving=serving,
    models=models.MODELS,
    scored=("en",),
    shown=(("test BLEU", "best_test_bleu"),),
    reported=("test_bleu", "test_chrf"),
    flavour="translator",
    labelled=False,
    default_models=("seq2seq", "seq2seq_attention", "transformer_mt"),
    check=check,
    starters=(STARTER,),
)
