"""Stage `augment`: grow the train split (never validation or test) with a registered augmenter."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

import pandas as pd
import pyarrow as pa

from tasks.classification.augmenters import (
    AUGMENTERS,
    CHUNK_ROWS,
    CHUNKED,
    STREAMED,
    AugmentContext,
    Augmented,
    EdaParams,
)
from tasks.classification.backtranslation import BackTranslationParams
from tasks.core import BuildContext, BuildOutput, Facts
from tasks.errors import ConfigError, DataError
from tasks.util.io import ROW_GROUP_ROWS, PartWriter, Rows, TextSet, chunk_plan, write_parquet
from tasks.util.pool import ChunkPool
from tasks.util.segmenter import SegmenterParams

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output, and the params that name files (counted by content)
# (back-translation's only while it is the method: EDA's and `none`'s keys do not hold them)
BACKTRANSLATION = ("transformers", "torch", "sentencepiece", "sacrebleu")
LIBRARIES = ("jieba", *BACKTRANSLATION)
FILES: tuple[str, ...] = ("backtranslation.pivots.*.forward", "backtranslation.pivots.*.backward")


class Params(EdaParams):
    """The `augment` section: the augmenter and its settings (EDA's are inherited)."""

    # a name in tasks.classification.augment.AUGMENTERS: eda, backtranslation, none
    method: str = "eda"
    # when back-translation models are missing: fail, or run EDA
    fallback: Literal["none", "eda"] = "none"
    device: str = "auto"  # translation models: auto = CUDA when present (bf16), else CPU
    backtranslation: BackTranslationParams = BackTranslationParams()
    LIBRARIES_OF: ClassVar[dict[str, tuple[str, ...]]] = {"backtranslation": BACKTRANSLATION}

    def unused(self) -> tuple[str, ...]:
        # the settings of a method not chosen
        return () if self.method == "backtranslation" else ("backtranslation",)


def check_no_leakage(train: pd.DataFrame, original_ids: set, heldout) -> None:
    """Fail if a held-out (validation/test) text, or a row derived from anything but a train row, is
    in training."""
    leaked = TextSet.coerce(heldout).isin(train["text"])
    if leaked.any():
        raise DataError(
            f"augment: {int(leaked.sum())} training rows equal validation/test texts (first id "
            f"{train.loc[leaked, 'id'].iloc[0]})"
        )
    foreign = ~train["source_id"].isin(original_ids)
    if foreign.any():
        raise DataError(
            f"augment: {int(foreign.sum())} augmented rows come from rows outside the train split"
        )


def _check_method(params) -> None:
    if params.method not in AUGMENTERS:
        raise ConfigError(
            f"augment.method: unknown augmenter '{params.method}' (registered: "
            f"{', '.join(sorted(AUGMENTERS))})"
        )


def marked_original(train: pd.DataFrame) -> pd.DataFrame:
    """Train rows as the augmented split holds them: their own source, `aug_method` original, no POS
    tags (the new rows would have none)."""
    return train.drop(columns=["pos"], errors="ignore").assign(
        source_id=train["id"], aug_method="original", aug_index=0
    )


def augment_frame(train: pd.DataFrame, ctx: AugmentContext) -> tuple[pd.DataFrame, Augmented]:
    """Original rows (aug_method 'original') then the augmenter's new rows, with fresh unique
    ids."""
    params = ctx.params
    _check_method(params)
    original = marked_original(train)
    result = AUGMENTERS[params.method](train, ctx)
    new = result.rows
    if len(new):
        heldout = ctx.heldout.isin(new["text"])  # e.g. EDA turning a train text into a test text
        result.metrics["filtered_heldout"] = int(heldout.sum())
        new = new[~heldout]
        first_id = int(train["id"].max()) + 1
        new = new.assign(id=range(first_id, first_id + len(new)))
    out = pd.concat([original, new], ignore_index=True) if len(new) else original
    check_no_leakage(out, set(train["id"]), ctx.heldout)
    return out, result


def stream_augment(
    src: Rows, ctx: AugmentContext, out: Path
) -> tuple[int, int, Augmented, pd.DataFrame]:
    """A row-wise augmenter (eda, none) over the train split batch by batch, written as it goes: the
    original rows first, then the new rows (ids after the last original id), as `augment_frame`
    orders them; memory is one batch and the held-out texts' digests. Returns (original rows, new
    rows, the result, a sample)."""
    writer, words = (
        PartWriter(out / "train.parquet", ROW_GROUP_ROWS),
        open(out / ".train.words.txt.tmp", "w", encoding="utf-8"),
    )
    kept, last_id = 0, -1
    # a partition with no train rows
    empty = marked_original(pd.read_parquet(src.path).iloc[:0]) if not len(src) else None
    schema = None
    for batch in src.batches():
        rows = marked_original(batch)
        if not len(rows):
            continue
        check_no_leakage(rows, set(batch["id"]), ctx.heldout)
        table = pa.Table.from_pandas(rows, preserve_index=False)
        schema = schema or table.schema
        writer.write(table.cast(schema))
        words.writelines(f"{w}\n" for w in rows["words"])
        kept, last_id = kept + len(rows), max(last_id, int(rows["id"].max()))
    metrics: dict[str, float] = {"filtered_heldout": 0}
    added, sample = 0, []
    chunked = CHUNKED.get(ctx.params.method)
    parts = (
        ctx.pool.map(
            chunked[0],
            chunk_plan(src.path, CHUNK_ROWS),
            chunked[1](ctx.params),
            desc=ctx.params.method,
        )
        if chunked and ctx.pool is not None
        else (AUGMENTERS[ctx.params.method](batch, ctx).rows for batch in src.batches())
    )
    for new in parts:
        if not len(new):
            continue
        heldout = ctx.heldout.isin(new["text"])  # e.g. EDA turning a train text into a test text
        metrics["filtered_heldout"] += int(heldout.sum())
        new = new[~heldout]
        new = new.assign(id=range(last_id + 1 + added, last_id + 1 + added + len(new)))
        writer.write(
            pa.Table.from_pandas(
                new.reindex(columns=schema.names), schema=schema, preserve_index=False
            )
        )
        words.writelines(f"{w}\n" for w in new["words"])
        if sum(len(x) for x in sample) < 200:
            sample.append(new.head(200))
        added += len(new)
    words.close()
    writer.close(empty)
    (out / ".train.words.txt.tmp").replace(out / "train.words.txt")
    return (
        kept,
        added,
        Augmented(pd.DataFrame(), metrics, ctx.params.method),
        (pd.concat(sample).head(200) if sample else pd.DataFrame()),
    )


def build(ctx: BuildContext) -> BuildOutput:
    """Write the augmented `train.parquet` and its segmented corpus `train.words.txt`. New words are
    cut as the segment stage cuts (`ctx.stages.segment`); translations are cached in the store,
    shared by all keys. A row-wise augmenter (eda, none) streams the split; back-translation holds
    it (it translates a sample)."""
    _check_method(ctx.params)
    segment: SegmenterParams = ctx.stages.segment.segmenter()
    cache_file = ctx.store.cache_file("translations.sqlite")
    src = Rows(ctx.file("segment", "train.parquet"))
    heldout = TextSet.of(
        b["text"]
        for split in ("validation", "test")
        for b in Rows(ctx.file("segment", f"{split}.parquet")).batches(["text"])
    )
    pool = ctx.pool(1 if ctx.pool is ChunkPool else 0)  # local: one process; Dask: every worker
    actx = AugmentContext(
        ctx.params, segment, cache_file, heldout, pool, src.path, ctx.root, ctx.store
    )
    tables = {}
    if ctx.params.method in STREAMED:
        kept, added, result, new_sample = stream_augment(src, actx, ctx.out)
        if len(new_sample):
            source = pd.concat(
                b[b["id"].isin(set(new_sample["source_id"]))][["id", "text"]]
                for b in src.batches(["id", "text"])
            )
            sample = new_sample.merge(
                source.rename(columns={"id": "source_id", "text": "source_text"}), on="source_id"
            )
            tables["augment_sample.json"] = sample[
                ["source_id", "source_text", "text", "aug_method"]
            ].astype(str)
    else:
        train = src.frame()
        out, result = augment_frame(train, actx)
        write_parquet(out, ctx.out / "train.parquet")
        (ctx.out / "train.words.txt").write_text("\n".join(out["words"]) + "\n", encoding="utf-8")
        kept, added = len(train), int((out["aug_method"] != "original").sum())
        if result.sample is not None and len(result.sample):
            tables["augment_sample.json"] = result.sample.astype(str)
            result.sample.to_csv(ctx.out / "sample.csv", index=False)
        elif added:
            new = out[out["aug_method"] != "original"]
            sample = new.head(200).merge(
                train[["id", "text"]].rename(columns={"id": "source_id", "text": "source_text"}),
                on="source_id",
            )
            tables["augment_sample.json"] = sample[
                ["source_id", "source_text", "text", "aug_method"]
            ].astype(str)
    return BuildOutput(
        rows=kept + added,
        metrics={"rows_original": kept, "rows_added": added, **result.metrics},
        facts=Facts(augment_method_used=result.method_used),
        artifacts=["sample.csv"] if (ctx.out / "sample.csv").exists() else [],
        tables=tables,
        tags={"zhpipe.augment.method_used": result.method_used},
    )
