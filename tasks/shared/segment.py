"""Stage `segment`: jieba word tokens (+ optional POS tags) and character tokens, in parallel processes.
Light imports (no Prefect, no MLflow): pool workers import this module to run `segment_chunk`."""
from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import closing
from functools import lru_cache
from itertools import islice
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from tasks.core import BuildContext, BuildOutput
from tasks.graph import SPLITS as SPLITS_OUTPUT
from tasks.graph import Stage
from tasks.util.io import SPLITS, Chunk, PartWriter, chunk_plan, read_chunk
from tasks.util.pool import ChunkPool
from tasks.util.segmenter import Segmenter, SegmenterParams

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that shape
# its output, and the params that name files (counted by content)
LIBRARIES = ("jieba", "rjieba", "pyarrow")
FILES: tuple[str, ...] = ("user_dict", "stopwords")


class Params(SegmenterParams):
    """The `segment` section: the segmenter's parameters and how the work is spread."""

    OUTSIDE_KEY = ("workers", "chunk_rows")
    workers: int = Field(0, ge=0)  # 0 = one process per core
    chunk_rows: int = Field(1000, ge=1)  # smaller chunks even out the last workers; larger cut IPC

    def segmenter(self) -> SegmenterParams:
        """The part of these params that defines the tokens (what a served model needs)."""
        return SegmenterParams(**self.model_dump(include=set(SegmenterParams.model_fields)))


@lru_cache(maxsize=4)
def _segmenter(params_json: str, root: str) -> Segmenter:
    """One Segmenter per process and config (a chunk worker keeps it across chunks)."""
    return Segmenter(SegmenterParams.model_validate_json(params_json), Path(root))


def segment_chunk(chunk: Chunk, params: tuple[str, str]) -> pd.DataFrame:
    """Chunk function: a chunk of a split with its `words`, `chars` (and `pos`) columns added; `params` is
    (segmenter params as JSON, project folder)."""
    df = read_chunk(chunk)
    for col, values in _segmenter(*params).rows(df["text"].tolist()).items():
        df[col] = values
    return df


def worker_count(params: Params, rows: int) -> int:
    """Processes to use: configured, else one per core, never more than there are chunks."""
    wanted = params.workers or os.cpu_count() or 1
    return max(1, min(wanted, -(-rows // params.chunk_rows)))


def segment_file(src: Path, dst: Path, params: Params, pool: ChunkPool, root: Path,
                 desc: str = "segment") -> dict[str, float]:
    """Segment one Parquet file chunk by chunk into `dst`; returns its row and word counts."""
    tables = pool.tables(segment_chunk, chunk_plan(src, params.chunk_rows), _chunk_params(params, root), desc=desc)
    return write_segments(tables, src, dst)


def _chunk_params(params: Params, root: Path) -> tuple[str, str]:
    return params.segmenter().model_dump_json(), str(root)


def write_segments(tables: Iterable[pa.Table], src: Path, dst: Path) -> dict[str, float]:
    """Write the segmented chunks of `src` to `dst` in order; returns its row and word counts."""
    writer, rows, words = PartWriter(dst), 0, 0
    for table in tables:
        if not table.num_rows:  # an empty chunk's columns have no types to write
            continue
        writer.write(table)
        rows += table.num_rows
        column = table.column("words")  # space-joined tokens: spaces + 1 per non-empty text
        words += pc.sum(pc.count_substring(column, " ")).as_py() or 0
        words += pc.sum(pc.cast(pc.greater(pc.utf8_length(column), 0), pa.int64())).as_py() or 0
    empty = pd.read_parquet(src).head(0).assign(words=pd.Series(dtype=str),
                                                chars=pd.Series(dtype=str)) if not rows else None
    writer.close(empty)
    return {"rows": rows, "words": words}


def build(ctx: BuildContext) -> BuildOutput:
    """Segment every split; write `<split>.parquet` with `words`, `chars` (and `pos`) columns. The chunks of
    all splits go through one stream of workers (one pool start, and no split too small to spread)."""
    sources = {name: ctx.file("split", f"{name}.parquet") for name in SPLITS}
    plans = {name: chunk_plan(src, ctx.params.chunk_rows) for name, src in sources.items()}
    rows = sum(c.rows for chunks in plans.values() for c in chunks)
    pool = ctx.pool(worker_count(ctx.params, rows))
    tables = pool.tables(segment_chunk, [c for name in SPLITS for c in plans[name]],
                           _chunk_params(ctx.params, ctx.root))
    metrics = {}
    with closing(tables):
        for name in SPLITS:  # chunks come back in order: each split takes its own count of them
            counts = write_segments(islice(tables, len(plans[name])), sources[name], ctx.out / f"{name}.parquet")
            metrics[f"{name}_mean_words"] = counts["words"] / max(counts["rows"], 1)
    metrics["workers"] = pool.workers
    metrics["chunk_processes"] = len({(r["host"], r["pid"]) for r in pool.ran_on})
    return BuildOutput(rows=rows, metrics=metrics)


# the stage every kind shares, named in each kind's table
SEGMENT = Stage("segment", ("split",), build, "jieba words (+POS) and characters, in parallel processes or on Dask",
                "train_mean_words", (SPLITS_OUTPUT,), partitioned=True)
