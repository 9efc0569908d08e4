"""The augment stage of the kinds whose examples a rewrite would break (entity tags, sentence
pairs): the segmented train split as it is."""

from __future__ import annotations

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Facts
from tasks.util.io import write_parquet


def train_as_is(ctx: BuildContext) -> BuildOutput:
    """The segmented train split unchanged (`aug_method` original): the augment stage of the kinds
    whose examples a rewrite would break (entity tags, sentence pairs)."""
    train = pd.read_parquet(ctx.file("segment", "train.parquet")).assign(aug_method="original")
    write_parquet(train, ctx.out / "train.parquet")
    (ctx.out / "train.words.txt").write_text("\n".join(train["words"]) + "\n", encoding="utf-8")
    return BuildOutput(
        rows=len(train),
        metrics={"rows_original": len(train), "rows_added": 0},
        facts=Facts(augment_method_used="none"),
    )


def original_rows(train: pd.DataFrame) -> pd.DataFrame:
    """The train rows as in the corpus, without the augmenter's new ones (language models and
    pretraining)."""
    return train[train["aug_method"] == "original"] if "aug_method" in train else train
