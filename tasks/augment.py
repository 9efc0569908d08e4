"""Stage `augment`: grow the train split (never validation or test) with a registered augmenter."""
from __future__ import annotations

import random
from typing import Callable, Protocol

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.config import AugmentConfig
from flows.errors import ConfigError
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult

VERSION = "1"


class Augmenter(Protocol):
    """Takes the segmented train rows, returns only the new rows (with `aug_method` and `source_id`)."""

    def __call__(self, train: pd.DataFrame, params: AugmentConfig) -> pd.DataFrame: ...


AUGMENTERS: dict[str, Augmenter] = {}


def register(name: str) -> Callable[[Augmenter], Augmenter]:
    """Make an augmenter selectable as `augment.method: <name>`."""

    def deco(fn: Augmenter) -> Augmenter:
        AUGMENTERS[name] = fn
        return fn

    return deco


def eda_words(words: list[str], params: AugmentConfig, rng: random.Random) -> list[str]:
    """EDA on one token list: random swap, random deletion, random insertion of in-sentence words.

    (EDA's synonym replacement needs a thesaurus, which v1 does not ship.)
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
def eda(train: pd.DataFrame, params: AugmentConfig) -> pd.DataFrame:
    """`num_aug` EDA variants per row; each row's RNG is seeded from (seed, row id), so output is deterministic."""
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
def no_augmentation(train: pd.DataFrame, params: AugmentConfig) -> pd.DataFrame:
    """Leave the train split as it is."""
    return train.iloc[0:0]


def augment_frame(train: pd.DataFrame, params: AugmentConfig) -> pd.DataFrame:
    """Original rows (aug_method 'original') followed by the augmenter's new rows, with fresh unique ids."""
    if params.method not in AUGMENTERS:
        raise ConfigError(f"augment.method: unknown augmenter '{params.method}' (registered: {', '.join(AUGMENTERS)})")
    original = train.drop(columns=["pos"], errors="ignore")  # POS tags of new rows would be missing
    original = original.assign(source_id=original["id"], aug_method="original", aug_index=0)
    new = AUGMENTERS[params.method](train, params) if params.num_aug else None
    if new is None or new.empty:
        return original
    first_id = int(train["id"].max()) + 1
    new = new.assign(id=range(first_id, first_id + len(new)))
    return pd.concat([original, new[original.columns]], ignore_index=True)


def build(ctx: BuildContext) -> BuildOutput:
    """Write the augmented `train.parquet` and its segmented corpus `train.words.txt`."""
    train = pd.read_parquet(ctx.inputs["segment"] / "train.parquet")
    out = augment_frame(train, ctx.params)
    out.to_parquet(ctx.out / "train.parquet", index=False)
    (ctx.out / "train.words.txt").write_text("\n".join(out["words"]) + "\n", encoding="utf-8")
    added = int((out["aug_method"] != "original").sum())
    sample = out[out["aug_method"] != "original"].head(200).merge(
        train[["id", "text"]].rename(columns={"id": "source_id", "text": "source_text"}), on="source_id"
    )
    if len(sample):
        ctx.tracker.table(sample[["source_id", "source_text", "text", "aug_method"]].astype(str), "augment_sample.json")
    return BuildOutput(
        rows=len(out),
        metrics={"rows_original": len(train), "rows_added": added},
        info=dict(ctx.input_info["segment"]),
    )


@task(name="augment", cache_policy=NO_CACHE)
def augment(run: RunContext, segment: StageResult) -> StageResult:
    """Augment the train split only."""
    return run.run("augment", {"segment": segment}, build)
