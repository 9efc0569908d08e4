"""Stage `split` (task translation): train/validation/test without leakage. Pairs that share a side
(one English sentence with several translations, one Chinese sentence with several) or that differ
only in case, punctuation or white space form one group, and a group goes to one split whole, by a
hash of its key and the seed: a group keeps its split when the corpus grows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.core import BuildContext, BuildOutput
from tasks.shared.splitting import Fractions, hash_units
from tasks.translation.text import pair_key
from tasks.util.io import SPLITS, write_parquet

LIBRARIES = ("pandas", "numpy")
FILES: tuple[str, ...] = ()


class Params(Fractions):
    """The `split` section of a translation pipeline."""


def groups(df: pd.DataFrame) -> np.ndarray:
    """A group id per pair: the connected components of pairs linked by an equal (normalised)
    side."""
    zh = pd.factorize(df["text"].map(pair_key))[0]
    en = pd.factorize(df["en"].map(pair_key))[0] + zh.max() + 1
    parent = np.arange(en.max() + 1)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(zh, en):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(a) for a in zh])


def split_pairs(df: pd.DataFrame, p: Params) -> tuple[dict[str, pd.DataFrame], int]:
    """The three splits (id order) and the number of groups."""
    group = groups(df)
    # a group's key: its first pair's normalised English side, which does not change when pairs join
    # the group
    first = pd.Series(df["en"].map(pair_key).to_numpy()).groupby(group).transform("first")
    unit = hash_units(first.tolist(), p.seed)
    edges = np.cumsum([p.train, p.validation])
    where = np.searchsorted(edges, unit, side="right")
    return {name: df[where == i].reset_index(drop=True) for i, name in enumerate(SPLITS)}, int(
        len(set(group))
    )


def build(ctx: BuildContext) -> BuildOutput:
    df = pd.read_parquet(ctx.file("clean", "data.parquet"))
    parts, n_groups = split_pairs(df, ctx.params)
    metrics = {"groups": n_groups, "rows_quarantined": 0}
    for name, part in parts.items():
        write_parquet(part, ctx.out / f"{name}.parquet")
        metrics[f"rows_{name}"] = len(part)
    write_parquet(
        df.head(0).assign(reason=pd.Series(dtype="string")), ctx.out / "quarantine.parquet"
    )
    return BuildOutput(rows=len(df), metrics=metrics)
