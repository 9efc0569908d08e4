"""Stage `augment`: grow the train split (never validation or test) with a registered augmenter."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.chunks import Chunk, Runner, plan, read_chunk, write_parquet
from flows.config import AugmentConfig, SegmentConfig
from flows.errors import ConfigError, DataError
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult

VERSION = "2"
CHUNK_ROWS = 5000


@dataclass
class AugmentContext:
    """What an augmenter may use besides the train rows."""

    params: AugmentConfig
    segment: SegmentConfig  # to segment new texts exactly as the segment stage did
    cache_file: Path  # persistent translation cache, shared across runs and corpora
    heldout: set[str] = field(default_factory=set)  # validation and test texts: never enter training
    runner: Runner | None = None  # row-wise augmenters map chunks of `source` on it (processes or Dask)
    source: Path | None = None  # the train split's Parquet file


@dataclass
class Augmented:
    """An augmenter's new rows (with `source_id`, `aug_method`, `aug_index`), its metrics and a sample."""

    rows: pd.DataFrame
    metrics: dict[str, float]
    method_used: str
    sample: pd.DataFrame | None = None


class Augmenter(Protocol):
    def __call__(self, train: pd.DataFrame, ctx: AugmentContext) -> Augmented: ...


AUGMENTERS: dict[str, Augmenter] = {}


def register(name: str) -> Callable[[Augmenter], Augmenter]:
    """Make an augmenter selectable as `augment.method: <name>`."""

    def deco(fn: Augmenter) -> Augmenter:
        AUGMENTERS[name] = fn
        return fn

    return deco


def eda_words(words: list[str], params: AugmentConfig, rng: random.Random) -> list[str]:
    """EDA on one token list: random swap, random deletion, random insertion of in-sentence words.

    (EDA's synonym replacement needs a thesaurus, which is not bundled.)
    """
    words = list(words)
    n = len(words)
    if n < 2:
        return words
    # 1. random swap: swap round(p_swap * n) pairs
    for _ in range(max(1, round(params.p_swap * n)) if params.p_swap > 0 else 0):
        i, j = rng.randrange(n), rng.randrange(n)
        words[i], words[j] = words[j], words[i]
    # 2. random deletion: each word with p_delete, keeping at least one
    if params.p_delete > 0:
        kept = [w for w in words if rng.random() >= params.p_delete]
        words = kept or [rng.choice(words)]
    # 3. random insertion: re-insert round(p_insert * n) words of the sentence at random positions
    for _ in range(max(1, round(params.p_insert * n)) if params.p_insert > 0 else 0):
        words.insert(rng.randrange(len(words) + 1), rng.choice(words))
    return words


@register("eda")
def eda(train: pd.DataFrame, ctx: AugmentContext) -> Augmented:
    """`num_aug` EDA variants per row; each row's RNG is seeded from (seed, row id), so output is deterministic
    and the same whether the rows are augmented at once or chunk by chunk."""
    if ctx.runner is not None and ctx.source is not None:
        parts = list(ctx.runner.map(eda_chunk, plan(ctx.source, CHUNK_ROWS), ctx.params.model_dump_json(), desc="eda"))
        rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    else:
        rows = eda_rows(train, ctx.params)
    return Augmented(rows, {}, "eda")


def eda_chunk(chunk: Chunk, params_json: str) -> pd.DataFrame:
    """Chunk function: EDA rows of one chunk of the train split."""
    return eda_rows(read_chunk(chunk, columns=None), AugmentConfig.model_validate_json(params_json))


def eda_rows(train: pd.DataFrame, params: AugmentConfig) -> pd.DataFrame:
    """The EDA variants of some train rows."""
    rows = []
    for row in train.itertuples(index=False):
        rng = random.Random(f"{params.seed}-{row.id}")
        for k in range(params.num_aug):
            words = eda_words(row.words.split(), params, rng)
            if " ".join(words) == row.words:
                continue  # an unchanged copy adds nothing but weight
            text = "".join(words)
            new = {"text": text, "words": " ".join(words), "chars": " ".join(c for c in text if not c.isspace())}
            if "label" in train:
                new["label"] = row.label
            rows.append({**new, "source_id": row.id, "aug_method": "eda", "aug_index": k})
    return pd.DataFrame(rows)


@register("none")
def no_augmentation(train: pd.DataFrame, ctx: AugmentContext) -> Augmented:
    """Leave the train split as it is."""
    return Augmented(pd.DataFrame(), {}, "none")


def check_no_leakage(train: pd.DataFrame, original_ids: set, heldout: set[str]) -> None:
    """Fail if a held-out (validation/test) text, or a row derived from anything but a train row, is in training."""
    leaked = train["text"].isin(heldout)
    if leaked.any():
        raise DataError(f"augment: {int(leaked.sum())} training rows equal validation/test texts (first id {train.loc[leaked, 'id'].iloc[0]})")
    foreign = ~train["source_id"].isin(original_ids)
    if foreign.any():
        raise DataError(f"augment: {int(foreign.sum())} augmented rows come from rows outside the train split")


def original_rows(train: pd.DataFrame) -> pd.DataFrame:
    """The train rows as in the corpus, without the augmenter's new ones (language models and pretraining)."""
    return train[train["aug_method"] == "original"] if "aug_method" in train else train


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


def build(ctx: BuildContext, segment: SegmentConfig, cache_file: Path) -> BuildOutput:
    """Write the augmented `train.parquet` and its segmented corpus `train.words.txt`."""
    train = pd.read_parquet(ctx.inputs["segment"] / "train.parquet")
    heldout = set()
    for split in ("validation", "test"):
        heldout |= set(pd.read_parquet(ctx.inputs["segment"] / f"{split}.parquet", columns=["text"])["text"])
    src = ctx.inputs["segment"] / "train.parquet"
    out, result = augment_frame(train, AugmentContext(ctx.params, segment, cache_file, heldout, Runner(ctx.executor, workers=1 if ctx.executor is None else 0), src))
    write_parquet(out, ctx.out / "train.parquet")
    (ctx.out / "train.words.txt").write_text("\n".join(out["words"]) + "\n", encoding="utf-8")
    ctx.tracker.tags({"zhpipe.augment.method_used": result.method_used})
    added = out[out["aug_method"] != "original"]
    if result.sample is not None and len(result.sample):
        ctx.tracker.table(result.sample.astype(str), "augment_sample.json")
        result.sample.to_csv(ctx.out / "sample.csv", index=False)
    elif len(added):
        sample = added.head(200).merge(train[["id", "text"]].rename(columns={"id": "source_id", "text": "source_text"}), on="source_id")
        ctx.tracker.table(sample[["source_id", "source_text", "text", "aug_method"]].astype(str), "augment_sample.json")
    return BuildOutput(
        rows=len(out),
        metrics={"rows_original": len(train), "rows_added": len(added), **result.metrics},
        info={**ctx.input_info["segment"], "augment_method_used": result.method_used},
        artifacts=["sample.csv"] if (ctx.out / "sample.csv").exists() else [],
    )


@task(name="augment", cache_policy=NO_CACHE)
def augment(run: RunContext, segment: StageResult) -> StageResult:
    """Augment the train split only."""
    cache_file = run.store.cache_file("translations.sqlite")
    return run.run("augment", {"segment": segment}, lambda ctx: build(ctx, run.config.stages.segment, cache_file))


from tasks import backtranslation  # noqa: E402,F401 - registers "backtranslation"
