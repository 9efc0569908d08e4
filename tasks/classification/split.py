"""Stage `split`: stratified, seeded train/validation/test split.

`method: hash` (the default) puts each row in a split by a hash of its text and the seed: a row's
split does not depend on its position or on the other rows, so when a corpus grows every old row
keeps its split and new rows fall into the splits in the configured proportions (per class, in
expectation). `method: permutation` shuffles each class with the seed and cuts it by the fractions:
exact proportions, but an appended row moves others."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from tasks.core import BuildContext, BuildOutput, Facts
from tasks.errors import ConfigError, DataError
from tasks.shared.splitting import Fractions, hash_units, split_sizes
from tasks.util.io import ROW_GROUP_ROWS, SPLITS, PartWriter, iter_frames, sorted_labels

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output, and the params that name files (counted by content)
LIBRARIES = ("pandas", "numpy", "pyarrow")
FILES: tuple[str, ...] = ()
log = logging.getLogger("zhpipe")


class Params(Fractions):
    """The `split` section: stratified train/validation/test fractions."""

    # hash: a row's split is a function of its text and the seed (stable when the corpus grows);
    # permutation: each class shuffled and cut by the fractions (exact sizes; rows move when rows
    # are added)
    method: Literal["hash", "permutation"] = "hash"
    # classes with fewer than 3 rows cannot be in every split: set aside in quarantine.parquet, or
    # merged into one class named `merge_label`
    small_classes: Literal["quarantine", "merge"] = "quarantine"
    merge_label: str = "other"


MIN_CLASS_ROWS = 3  # one row in each split


def _none_set_aside(df: pd.DataFrame) -> pd.DataFrame:
    """An empty quarantine with the corpus's columns and `reason`."""
    return df.iloc[:0].assign(reason=pd.Series(dtype="string"))


SMALL_REASON = f"class_under_{MIN_CLASS_ROWS}_rows"


def class_plan(
    counts: dict[str, int], params: Params
) -> tuple[dict[str, str], dict[str, int], set[str]]:
    """From rows per label: (label -> the label it is split under, the small classes and their
    sizes, labels whose rows are set aside). Small classes are quarantined, or merged into
    `merge_label` when that makes a class of at least MIN_CLASS_ROWS rows (else the merged rows are
    set aside under it)."""
    small = {k: n for k, n in counts.items() if n < MIN_CLASS_ROWS}
    rename = {k: k for k in counts}
    if not small:
        return rename, {}, set()
    if params.small_classes == "merge":
        rename.update({k: params.merge_label for k in small})
        merged = sum(n for k, n in counts.items() if rename[k] == params.merge_label)
        return rename, small, set() if merged >= MIN_CLASS_ROWS else {params.merge_label}
    return rename, small, set(small)


def apply_plan(
    df: pd.DataFrame, rename: dict[str, str], aside: set[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`class_plan` applied to rows: (rows to split, under their new labels; rows set aside, with
    `reason`)."""
    df = df.assign(label=df["label"].map(rename).astype(df["label"].dtype))
    out = df["label"].isin(aside)
    return df[~out], df[out].assign(reason=SMALL_REASON).reset_index(drop=True)


def assignments(counts: dict, params: Params, labelled: bool) -> dict:
    """Which split each row of each class goes to, by its place in the class (in id order): the
    class is shuffled with the seed and cut by the fractions, at least one row in every split when
    labelled. Classes are drawn in sorted order; one byte per row."""
    rng = np.random.default_rng(params.seed)
    fractions = np.array([params.train, params.validation, params.test])
    out = {}
    for key in sorted(counts):
        n = counts[key]
        order = rng.permutation(n)
        if labelled and n < MIN_CLASS_ROWS:
            raise DataError(
                f"split: class {key!r} has {n} rows; each split needs one of every class"
            )
        bounds = np.cumsum([0, *split_sizes(n, fractions, minimum=1 if labelled else 0)])
        where = np.empty(n, dtype=np.uint8)
        for i in range(3):
            where[order[bounds[i] : bounds[i + 1]]] = i
        out[key] = where
    return out


def route(df: pd.DataFrame, plan: dict, seen: dict) -> np.ndarray:
    """The split of each row of `df` (rows in id order, following the rows of earlier batches
    counted in `seen`, which is updated)."""
    keys = (
        df["label"].to_numpy(dtype=object)
        if "label" in df
        else np.full(len(df), None, dtype=object)
    )
    split = np.empty(len(df), dtype=np.uint8)
    for key in pd.unique(keys):
        rows = np.flatnonzero(keys == key)
        start = seen.get(key, 0)
        split[rows] = plan[key][start : start + len(rows)]
        seen[key] = start + len(rows)
    return split


def stable_assignment(
    classes: np.ndarray, units: np.ndarray, params: Fractions, labelled: bool
) -> np.ndarray:
    """The split of each row from its hash unit: [0, train) train, then validation, then test. At
    the edges, a class (of at least MIN_CLASS_ROWS rows) that leaves a split empty gets one row
    moved into it: the row nearest that split's interval among the splits holding two rows or more.
    So a small class's rows may move while it is small; once every split holds one of its rows, the
    assignment is the hash alone."""
    cuts = np.array([params.train, params.train + params.validation])
    split = np.searchsorted(cuts, units, side="right").astype(np.uint8)
    if not labelled:
        return split
    bounds = [(0.0, cuts[0]), (cuts[0], cuts[1]), (cuts[1], 1.0)]
    for c in np.unique(classes):
        rows = np.flatnonzero(classes == c)
        for target in (2, 1, 0):  # the small splits first
            counts = np.bincount(split[rows], minlength=3)
            if counts[target]:
                continue
            donors = rows[np.isin(split[rows], np.flatnonzero(counts >= 2))]
            lo, hi = bounds[target]
            distance = np.where(units[donors] < lo, lo - units[donors], units[donors] - hi)
            split[donors[np.lexsort((units[donors], distance))[0]]] = target
    return split


BATCH_ROWS = 5_000


def _stable_plan(
    path, rename: dict, aside: set, labels: list, params: Params, labelled: bool
) -> np.ndarray:
    """method hash, streamed: the split of every kept row in file order, from one pass over the
    texts (and labels). Memory: 8 bytes of hash and 4 of class per row."""
    index = {label: i for i, label in enumerate(labels)}
    units, classes = [], []
    for df in iter_frames(path, BATCH_ROWS, columns=["text", "label"] if labelled else ["text"]):
        if labelled:
            df = df.assign(label=df["label"].map(rename))
            df = df[~df["label"].isin(aside)]
            classes.append(df["label"].map(index).to_numpy(dtype=np.int32))
        units.append(hash_units(df["text"].tolist(), params.seed))
    u = np.concatenate(units) if units else np.empty(0)
    c = np.concatenate(classes) if classes else np.zeros(len(u), dtype=np.int32)
    return stable_assignment(c, u, params, labelled)


def build(ctx: BuildContext) -> BuildOutput:
    """Write `train.parquet`, `validation.parquet`, `test.parquet` (and `quarantine.parquet`: small
    classes), streaming: one pass counts the classes, a second routes each batch of rows to its
    split's file. Memory is one batch plus one byte per row (`assignments`)."""
    path = ctx.file("clean", "data.parquet")
    src = pq.ParquetFile(path)
    labelled = "label" in src.schema_arrow.names
    facts = Facts()
    counts: dict = Counter()
    if labelled:
        for labels in iter_frames(path, BATCH_ROWS, columns=["label"]):
            counts.update(labels["label"].value_counts().to_dict())
    else:
        counts[None] = src.metadata.num_rows
    partition = ctx.partition is not None
    if partition and ctx.params.method != "hash":
        raise ConfigError(
            "split.method permutation moves rows whenever rows are added; a partitioned source "
            "takes "
            "split.method hash"
        )
    # a partition is split by the hash alone: its classes are counted over the whole corpus, not
    # here
    rename, small, aside = (
        class_plan(dict(counts), ctx.params)
        if labelled and not partition
        else ({k: k for k in counts}, {}, set())
    )
    kept: dict = Counter()
    for label, n in counts.items():
        if rename[label] not in aside:
            kept[rename[label]] += n
    set_aside = sum(counts.values()) - sum(kept.values())
    if small:
        shown = ", ".join(f"{k!r}: {v}" for k, v in list(small.items())[:5]) + (
            " ..." if len(small) > 5 else ""
        )
        what = (
            f"merged into {ctx.params.merge_label!r}"
            if not set_aside
            else f"{set_aside} rows quarantined"
        )
        log.warning(
            "split: %d classes have fewer than %d rows (%s); %s (split.small_classes)",
            len(small),
            MIN_CLASS_ROWS,
            shown,
            what,
        )
    if labelled and not partition:
        if len(kept) < 2:
            only = f" ({next(iter(kept))!r}, {next(iter(kept.values()))} rows)" if kept else ""
            raise DataError(
                f"split: {len(kept)} class{only} left with at least {MIN_CLASS_ROWS} rows "
                f"({set_aside} rows of smaller classes quarantined); a classifier needs at least 2"
            )
    if labelled:
        facts = Facts(labels=sorted_labels(kept))
    metrics = _write_splits(ctx, path, (rename, aside, small), kept, labelled)
    return BuildOutput(rows=sum(kept.values()), metrics=metrics, facts=facts)


def _write_splits(
    ctx: BuildContext, path: Path, classes: tuple, kept: Counter, labelled: bool
) -> dict[str, int]:
    """The second pass: each batch of rows routed to its split's file (small classes to the
    quarantine)."""
    rename, aside, small = classes
    src = pq.ParquetFile(path)
    if ctx.params.method == "hash":
        stable = _stable_plan(
            path,
            rename,
            aside,
            sorted(kept, key=str),
            ctx.params,
            labelled and ctx.partition is None,
        )
    else:
        plan = assignments(dict(kept), ctx.params, labelled)
    writers = {name: PartWriter(ctx.out / f"{name}.parquet", ROW_GROUP_ROWS) for name in SPLITS}
    quarantine = PartWriter(ctx.out / "quarantine.parquet", ROW_GROUP_ROWS)
    seen: dict = {}
    position = 0
    empty = src.schema_arrow.empty_table().to_pandas()
    for df in iter_frames(path, BATCH_ROWS):
        if labelled and small:
            df, set_apart = apply_plan(df, rename, aside)
            if len(set_apart):
                quarantine.write(set_apart)
        if ctx.params.method == "hash":
            split, position = stable[position : position + len(df)], position + len(df)
        else:
            split = route(df, plan, seen)
        for i, name in enumerate(SPLITS):
            part = df[split == i]
            if len(part):
                writers[name].write(part.reset_index(drop=True))
    metrics = {"rows_quarantined": quarantine.rows}
    for name, writer in writers.items():
        writer.close(empty)
        metrics[f"rows_{name}"] = writer.rows
    quarantine.close(_none_set_aside(empty))
    return metrics
