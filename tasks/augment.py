"""Stage `augment`: grow the train split (never validation or test) with a registered augmenter."""
from __future__ import annotations

from typing import Literal

import pandas as pd

from tasks.augmenters import AUGMENTERS, AugmentContext, Augmented, EdaParams
from tasks.backtranslation import BackTranslationParams
from tasks.core import BuildContext, BuildOutput
from tasks.errors import ConfigError, DataError
from tasks.io import Runner, write_parquet
from tasks.segmenter import SegmenterParams

# what its key sees besides params, inputs and code (flows/fingerprint.py): the libraries that shape
# its output, and the params that name files (counted by content)
LIBRARIES = ("jieba", "transformers", "torch", "sentencepiece", "sacrebleu")
FILES: tuple[str, ...] = ("backtranslation.pivots.*.forward", "backtranslation.pivots.*.backward")


class Params(EdaParams):
    """The `augment` section: the augmenter and its settings (EDA's are inherited)."""

    method: str = "eda"  # a name in tasks.augment.AUGMENTERS: eda, backtranslation, none
    fallback: Literal["none", "eda"] = "none"  # when back-translation models are missing: fail, or run EDA
    device: str = "auto"  # translation models: auto = CUDA when present (bf16), else CPU
    backtranslation: BackTranslationParams = BackTranslationParams()



def check_no_leakage(train: pd.DataFrame, original_ids: set, heldout: set[str]) -> None:
    """Fail if a held-out (validation/test) text, or a row derived from anything but a train row, is in training."""
    leaked = train["text"].isin(heldout)
    if leaked.any():
        raise DataError(f"augment: {int(leaked.sum())} training rows equal validation/test texts (first id {train.loc[leaked, 'id'].iloc[0]})")
    foreign = ~train["source_id"].isin(original_ids)
    if foreign.any():
        raise DataError(f"augment: {int(foreign.sum())} augmented rows come from rows outside the train split")


def augment_frame(train: pd.DataFrame, ctx: AugmentContext) -> tuple[pd.DataFrame, Augmented]:
    """Original rows (aug_method 'original') then the augmenter's new rows, with fresh unique ids."""
    params = ctx.params
    if params.method not in AUGMENTERS:
        raise ConfigError(f"augment.method: unknown augmenter '{params.method}' (registered: {', '.join(sorted(AUGMENTERS))})")
    original = train.drop(columns=["pos"], errors="ignore")  # POS tags of new rows would be missing
    original = original.assign(source_id=original["id"], aug_method="original", aug_index=0)
    result = AUGMENTERS[params.method](train, ctx)
    new = result.rows
    if len(new):
        heldout = new["text"].isin(ctx.heldout)  # e.g. EDA turning a train text into a test text
        result.metrics["filtered_heldout"] = int(heldout.sum())
        new = new[~heldout]
        first_id = int(train["id"].max()) + 1
        new = new.assign(id=range(first_id, first_id + len(new)))
    out = pd.concat([original, new], ignore_index=True) if len(new) else original
    check_no_leakage(out, set(train["id"]), ctx.heldout)
    return out, result


def build(ctx: BuildContext) -> BuildOutput:
    """Write the augmented `train.parquet` and its segmented corpus `train.words.txt`. New words are cut as the
    segment stage cuts (`ctx.stages.segment`); translations are cached in the store, shared by all keys."""
    segment: SegmenterParams = ctx.stages.segment.segmenter()
    cache_file = ctx.store.cache_file("translations.sqlite")
    train = pd.read_parquet(ctx.inputs["segment"] / "train.parquet")
    heldout = set()
    for split in ("validation", "test"):
        heldout |= set(pd.read_parquet(ctx.inputs["segment"] / f"{split}.parquet", columns=["text"])["text"])
    src = ctx.inputs["segment"] / "train.parquet"
    runner = ctx.runner(1 if ctx.runner is Runner else 0)  # local: one process; Dask: every worker
    out, result = augment_frame(train, AugmentContext(ctx.params, segment, cache_file, heldout, runner, src, ctx.root,
                                                          ctx.store.registered if ctx.store else None))
    write_parquet(out, ctx.out / "train.parquet")
    (ctx.out / "train.words.txt").write_text("\n".join(out["words"]) + "\n", encoding="utf-8")
    added = out[out["aug_method"] != "original"]
    tables = {}
    if result.sample is not None and len(result.sample):
        tables["augment_sample.json"] = result.sample.astype(str)
        result.sample.to_csv(ctx.out / "sample.csv", index=False)
    elif len(added):
        sample = added.head(200).merge(train[["id", "text"]].rename(columns={"id": "source_id", "text": "source_text"}), on="source_id")
        tables["augment_sample.json"] = sample[["source_id", "source_text", "text", "aug_method"]].astype(str)
    return BuildOutput(
        rows=len(out),
        metrics={"rows_original": len(train), "rows_added": len(added), **result.metrics},
        facts=ctx.facts["segment"].but(augment_method_used=result.method_used),
        artifacts=["sample.csv"] if (ctx.out / "sample.csv").exists() else [],
        tables=tables,
        tags={"zhpipe.augment.method_used": result.method_used},
    )

