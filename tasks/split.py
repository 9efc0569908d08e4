"""Stage `split`: stratified, seeded train/validation/test split."""
from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from tasks.core import BuildContext, BuildOutput, Section
from tasks.errors import DataError
from tasks.io import SPLITS, sorted_labels, write_parquet

# what its key sees besides params, inputs and code (flows/fingerprint.py): the libraries that shape
# its output, and the params that name files (counted by content)
LIBRARIES = ("pandas", "numpy")
FILES: tuple[str, ...] = ()
log = logging.getLogger("zhpipe")


class Params(Section):
    """The `split` section: stratified train/validation/test fractions."""

    train: float = Field(0.8, gt=0, lt=1)
    validation: float = Field(0.1, gt=0, lt=1)
    test: float = Field(0.1, gt=0, lt=1)
    seed: int = 42
    # classes with fewer than 3 rows cannot be in every split: set aside in quarantine.parquet, or merged into
    # one class named `merge_label`
    small_classes: Literal["quarantine", "merge"] = "quarantine"
    merge_label: str = "other"
    use_given: bool = True  # task ner: keep the corpus' own validation/test files (source.splits) as they are

    @model_validator(mode="after")
    def _sums_to_one(self) -> "Params":
        if abs(self.train + self.validation + self.test - 1.0) > 1e-6:
            raise ValueError("split fractions train + validation + test must sum to 1")
        return self


MIN_CLASS_ROWS = 3  # one row in each split


def _none_set_aside(df: pd.DataFrame) -> pd.DataFrame:
    """An empty quarantine with the corpus's columns and `reason`."""
    return df.iloc[:0].assign(reason=pd.Series(dtype="string"))


def set_aside_small(df: pd.DataFrame, params: Params) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """(rows to split, quarantined rows with `reason`, the small classes and their sizes)."""
    counts = df["label"].value_counts()
    small = counts[counts < MIN_CLASS_ROWS]
    if small.empty:
        return df, _none_set_aside(df), {}
    in_small = df["label"].isin(small.index)
    if params.small_classes == "merge":
        merged = df.copy()
        merged.loc[in_small, "label"] = params.merge_label
        if (merged["label"] == params.merge_label).sum() >= MIN_CLASS_ROWS:
            return merged, _none_set_aside(df), small.to_dict()
        in_small = merged["label"] == params.merge_label
        df = merged
    quarantine = df[in_small].assign(reason=f"class_under_{MIN_CLASS_ROWS}_rows")
    return df[~in_small], quarantine.reset_index(drop=True), small.to_dict()


def split_frame(df: pd.DataFrame, params: Params) -> dict[str, pd.DataFrame]:
    """Split rows into train/validation/test, stratified by label when there is one: each class is shuffled
    with the seed and cut by the fractions, with at least one row in every split (classes need 3 rows)."""
    rng = np.random.default_rng(params.seed)
    fractions = np.array([params.train, params.validation, params.test])
    groups = [df] if "label" not in df else [g for _, g in df.groupby("label", sort=True)]
    parts: list[list[pd.DataFrame]] = [[], [], []]
    for group in groups:
        n = len(group)
        order = rng.permutation(n)
        if "label" in df and n < MIN_CLASS_ROWS:
            raise DataError(f"split: class {group['label'].iloc[0]!r} has {n} rows; each split needs one of every class")
        sizes = split_sizes(n, fractions, minimum=1 if "label" in df else 0)
        bounds = np.cumsum([0, *sizes])
        for i in range(3):
            parts[i].append(group.iloc[order[bounds[i] : bounds[i + 1]]])
    return {name: pd.concat(chunks).sort_values("id").reset_index(drop=True) for name, chunks in zip(SPLITS, parts)}


def split_sizes(n: int, fractions: np.ndarray, minimum: int) -> list[int]:
    """Rows per split for `n` rows: the largest-remainder rounding of n * fractions, each at least `minimum`
    (taken from the largest split)."""
    exact = n * fractions
    sizes = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - sizes), kind="stable")[: n - sizes.sum()]:
        sizes[i] += 1
    for i in range(len(sizes)):
        while sizes[i] < minimum:
            sizes[int(np.argmax(sizes))] -= 1
            sizes[i] += 1
    return sizes.tolist()


def build(ctx: BuildContext) -> BuildOutput:
    """Write `train.parquet`, `validation.parquet`, `test.parquet` (and `quarantine.parquet`: small classes)."""
    df = pd.read_parquet(ctx.inputs["clean"] / "data.parquet")
    quarantine = _none_set_aside(df)
    info = dict(ctx.input_info["clean"])
    if "label" in df:
        df, quarantine, small = set_aside_small(df, ctx.params)
        if small:
            shown = ", ".join(f"{k!r}: {v}" for k, v in list(small.items())[:5]) + (" ..." if len(small) > 5 else "")
            what = (f"merged into {ctx.params.merge_label!r}" if quarantine.empty else f"{len(quarantine)} rows quarantined")
            log.warning("split: %d classes have fewer than %d rows (%s); %s (split.small_classes)", len(small), MIN_CLASS_ROWS, shown, what)
        counts = df["label"].value_counts()
        if len(counts) < 2:
            only = f" ({counts.index[0]!r}, {counts.iloc[0]} rows)" if len(counts) else ""
            raise DataError(f"split: {len(counts)} class{only} left with at least {MIN_CLASS_ROWS} rows "
                            f"({len(quarantine)} rows of smaller classes quarantined); a classifier needs at least 2")
        info["labels"] = sorted_labels(df["label"])
    parts = split_frame(df, ctx.params)
    metrics = {"rows_quarantined": len(quarantine)}
    for name, part in parts.items():
        write_parquet(part, ctx.out / f"{name}.parquet")
        metrics[f"rows_{name}"] = len(part)
    write_parquet(quarantine, ctx.out / "quarantine.parquet")
    return BuildOutput(rows=len(df), metrics=metrics, info=info)
