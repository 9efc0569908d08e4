"""Augmenters: a registry of functions that make new train rows (`augment.method` picks one), EDA
and the no-op; back-translation registers itself from tasks.classification.backtranslation."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
from pydantic import Field

from tasks.core import Section
from tasks.util.io import Chunk, TextSet, chunk_plan, read_chunk
from tasks.util.pool import ChunkPool
from tasks.util.segmenter import SegmenterParams

CHUNK_ROWS = 5000


class EdaParams(Section):
    """EDA (easy data augmentation) settings: random swap, deletion and insertion of in-sentence
    words."""

    num_aug: int = Field(1, ge=0)  # EDA: new rows per source row
    p_swap: float = Field(0.1, ge=0, le=1)  # EDA: fraction of words swapped
    p_delete: float = Field(0.1, ge=0, le=1)  # EDA: each word deleted with this probability
    p_insert: float = Field(0.1, ge=0, le=1)  # EDA: fraction of words re-inserted at random places
    seed: int = 13


def eda_json(params: Section) -> str:
    """The EDA part of the augment params, as chunk workers receive it."""
    return EdaParams(**params.model_dump(include=set(EdaParams.model_fields))).model_dump_json()


@dataclass
class AugmentContext:
    """What an augmenter may use besides the train rows."""

    params: Any  # the augment stage's Params
    segment: SegmenterParams  # to segment new texts exactly as the segment stage did
    cache_file: Path  # persistent translation cache, shared across runs and corpora
    # validation and test texts (digests): never enter training
    heldout: TextSet = field(default_factory=TextSet)
    # row-wise augmenters map chunks of `source` on it (processes or Dask)
    pool: ChunkPool | None = None
    source: Path | None = None  # the train split's Parquet file
    # the project folder (relative dictionary and model paths)
    root: Path = field(default_factory=Path.cwd)
    # the store's services (tasks.core.StoreAccess): registered translators (backend zhpipe) and
    # their models' specs
    store: Any = None

    def __post_init__(self):
        self.heldout = TextSet.coerce(self.heldout)


@dataclass
class Augmented:
    """An augmenter's new rows (with `source_id`, `aug_method`, `aug_index`), its metrics and a
    sample."""

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


def eda_words(words: list[str], params: EdaParams, rng: random.Random) -> list[str]:
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
    """`num_aug` EDA variants per row; each row's RNG is seeded from (seed, row id), so output is
    deterministic and the same whether the rows are augmented at once or chunk by chunk."""
    if ctx.pool is not None and ctx.source is not None:
        parts = list(
            ctx.pool.map(
                eda_chunk, chunk_plan(ctx.source, CHUNK_ROWS), eda_json(ctx.params), desc="eda"
            )
        )
        rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    else:
        rows = eda_rows(train, ctx.params)
    return Augmented(rows, {}, "eda")


def eda_chunk(chunk: Chunk, params_json: str) -> pd.DataFrame:
    """Chunk function: EDA rows of one chunk of the train split."""
    return eda_rows(read_chunk(chunk, columns=None), EdaParams.model_validate_json(params_json))


def eda_rows(train: pd.DataFrame, params: EdaParams) -> pd.DataFrame:
    """The EDA variants of some train rows."""
    rows = []
    for row in train.itertuples(index=False):
        rng = random.Random(f"{params.seed}-{row.id}")
        for k in range(params.num_aug):
            words = eda_words(row.words.split(), params, rng)
            if " ".join(words) == row.words:
                continue  # an unchanged copy adds nothing but weight
            text = "".join(words)
            new = {
                "text": text,
                "words": " ".join(words),
                "chars": " ".join(c for c in text if not c.isspace()),
            }
            if "label" in train:
                new["label"] = row.label
            rows.append({**new, "source_id": row.id, "aug_method": "eda", "aug_index": k})
    return pd.DataFrame(rows)


@register("none")
def no_augmentation(train: pd.DataFrame, ctx: AugmentContext) -> Augmented:
    """Leave the train split as it is."""
    return Augmented(pd.DataFrame(), {}, "none")


# the row-wise augmenters that run chunk by chunk on processes or Dask: (chunk function, its params
# as it receives them)
CHUNKED: dict[str, tuple[Callable, Callable]] = {"eda": (eda_chunk, eda_json)}
# the augmenters that add rows from each row alone: the stage streams the split for them
STREAMED = {*CHUNKED, "none"}
