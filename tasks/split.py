"""Stage `split`: stratified, seeded train/validation/test split."""
from __future__ import annotations

import pandas as pd
from pydantic import Field, model_validator
from sklearn.model_selection import train_test_split

from tasks.core import BuildContext, BuildOutput, Section
from tasks.errors import DataError
from tasks.io import SPLITS, write_parquet

# what its key sees besides params, inputs and code (flows/fingerprint.py): the libraries that shape
# its output, and the params that name files (counted by content)
LIBRARIES = ("pandas", "scikit-learn")
FILES: tuple[str, ...] = ()


class Params(Section):
    """The `split` section: stratified train/validation/test fractions."""

    train: float = Field(0.8, gt=0, lt=1)
    validation: float = Field(0.1, gt=0, lt=1)
    test: float = Field(0.1, gt=0, lt=1)
    seed: int = 42

    @model_validator(mode="after")
    def _sums_to_one(self) -> "Params":
        if abs(self.train + self.validation + self.test - 1.0) > 1e-6:
            raise ValueError("split fractions train + validation + test must sum to 1")
        return self



def split_frame(df: pd.DataFrame, params: Params) -> dict[str, pd.DataFrame]:
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
