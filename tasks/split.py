"""Stage `split`: stratified, seeded train/validation/test split."""
from __future__ import annotations

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE
from sklearn.model_selection import train_test_split

from flows.chunks import write_parquet
from flows.config import SplitConfig
from flows.errors import DataError
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult

VERSION = "1"
SPLITS = ("train", "validation", "test")


def split_frame(df: pd.DataFrame, params: SplitConfig) -> dict[str, pd.DataFrame]:
    """Split rows into train/validation/test, stratified by label when there is one."""
    if "label" in df:
        counts = df["label"].value_counts()
        if len(counts) < 2:
            raise DataError(f"split: the corpus has a single class ({counts.index[0]!r}, {counts.iloc[0]} rows); a classifier needs at least 2")
        rare = counts[counts < 3]
        if len(rare):
            raise DataError(f"split: classes {rare.to_dict()} have fewer than 3 rows; each split needs one of every class")
    strat = df["label"] if "label" in df else None
    rest_frac = params.validation + params.test
    train, rest = train_test_split(df, test_size=rest_frac, random_state=params.seed, stratify=strat)
    strat_rest = rest["label"] if "label" in df else None
    validation, test = train_test_split(
        rest, test_size=params.test / rest_frac, random_state=params.seed, stratify=strat_rest
    )
    return {name: part.sort_values("id").reset_index(drop=True) for name, part in zip(SPLITS, (train, validation, test))}


def build(ctx: BuildContext) -> BuildOutput:
    """Write `train.parquet`, `validation.parquet`, `test.parquet`."""
    df = pd.read_parquet(ctx.inputs["clean"] / "data.parquet")
    parts = split_frame(df, ctx.params)
    metrics = {}
    for name, part in parts.items():
        write_parquet(part, ctx.out / f"{name}.parquet")
        metrics[f"rows_{name}"] = len(part)
    return BuildOutput(rows=len(df), metrics=metrics, info=dict(ctx.input_info["clean"]))


@task(name="split", cache_policy=NO_CACHE)
def split(run: RunContext, clean: StageResult) -> StageResult:
    """Stratified train/validation/test split."""
    return run.run("split", {"clean": clean}, build)
