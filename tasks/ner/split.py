"""Stage `split` (task ner): the corpus' own train/validation/test files where it has them
(`use_given`), else a seeded random split of the sentences by the `split` fractions."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.core import BuildContext, BuildOutput
from tasks.errors import DataError
from tasks.shared.splitting import Fractions, split_sizes
from tasks.util.io import SPLITS, write_parquet

LIBRARIES = ("pandas", "numpy")
FILES: tuple[str, ...] = ()


class Params(Fractions):
    """The `split` section of a ner pipeline."""

    use_given: bool = True  # keep the corpus' own validation/test files (source.splits) as they are


def split_sentences(df: pd.DataFrame, params: Params) -> dict[str, pd.DataFrame]:
    """Given splits kept; a split the corpus lacks is cut from the rest by its fraction."""
    given = (
        {name: df[df["split"] == name] for name in SPLITS}
        if params.use_given and df["split"].notna().any()
        else {}
    )
    rest = df[~df["split"].isin([n for n, part in given.items() if len(part)])] if given else df
    missing = [name for name in SPLITS if not len(given.get(name, ()))]
    parts = {name: part for name, part in given.items() if len(part)}
    if missing:
        fractions = np.array([getattr(params, name) for name in missing], dtype=float)
        if len(rest) < len(missing):
            raise DataError(
                f"split: {len(rest)} sentences cannot fill the {', '.join(missing)} split(s)"
            )
        order = np.random.default_rng(params.seed).permutation(len(rest))
        sizes = split_sizes(len(rest), fractions / fractions.sum(), 1)
        start = 0
        for name, size in zip(missing, sizes):
            parts[name] = rest.iloc[np.sort(order[start : start + size])]
            start += size
    return {name: parts[name].reset_index(drop=True) for name in SPLITS}


def build(ctx: BuildContext) -> BuildOutput:
    """Write `train.parquet`, `validation.parquet`, `test.parquet` (and an empty
    `quarantine.parquet`)."""
    df = pd.read_parquet(ctx.file("clean", "data.parquet"))
    parts = split_sentences(df, ctx.params)
    metrics = {
        "rows_quarantined": 0,
        "given_splits": int(ctx.params.use_given and df["split"].notna().any()),
    }
    for name, part in parts.items():
        write_parquet(part, ctx.out / f"{name}.parquet")
        metrics[f"rows_{name}"] = len(part)
    write_parquet(
        df.head(0).assign(reason=pd.Series(dtype="string")), ctx.out / "quarantine.parquet"
    )
    return BuildOutput(rows=len(df), metrics=metrics)
