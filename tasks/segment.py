"""Stage `segment`: jieba word tokens (+ optional POS tags) and character tokens, in parallel processes."""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.chunks import Chunk, PartWriter, Runner, plan, read_chunk
from flows.config import SegmentConfig
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult
from tasks.segmenter import Segmenter
from tasks.split import SPLITS

VERSION = "2"  # chunked: row groups of `chunk_rows` rows


def worker_count(params: SegmentConfig, rows: int) -> int:
    """Processes to use: configured, else one per core, never more than there are chunks."""
    wanted = params.workers or os.cpu_count() or 1
    return max(1, min(wanted, -(-rows // params.chunk_rows)))


@lru_cache(maxsize=4)
def _segmenter(params_json: str) -> Segmenter:
    """One Segmenter per process and config (a chunk worker keeps it across chunks)."""
    return Segmenter(SegmentConfig.model_validate_json(params_json))


def segment_chunk(chunk: Chunk, params_json: str) -> pd.DataFrame:
    """A chunk of a split with its `words`, `chars` (and `pos`) columns added."""
    df = read_chunk(chunk)
    for col, values in _segmenter(params_json).rows(df["text"].tolist()).items():
        df[col] = values
    return df


def segment_file(src: Path, dst: Path, params: SegmentConfig, runner: Runner, desc: str = "segment") -> dict[str, float]:
    """Segment one Parquet file chunk by chunk into `dst`; returns its row and word counts."""
    writer, rows, words = PartWriter(dst), 0, 0
    for frame in runner.map(segment_chunk, plan(src, params.chunk_rows), params.model_dump_json(), desc=desc):
        writer.write(frame)
        rows += len(frame)
        words += int(frame["words"].str.split().str.len().sum())
    empty = pd.read_parquet(src).head(0).assign(words=pd.Series(dtype=str), chars=pd.Series(dtype=str)) if not rows else None
    writer.close(empty)
    return {"rows": rows, "words": words}


def build(ctx: BuildContext) -> BuildOutput:
    """Segment every split; write `<split>.parquet` with `words`, `chars` (and `pos`) columns."""
    rows = sum(pq.ParquetFile(ctx.inputs["split"] / f"{name}.parquet").metadata.num_rows for name in SPLITS)
    runner = Runner(ctx.executor, worker_count(ctx.params, rows))
    metrics = {}
    for name in SPLITS:
        counts = segment_file(ctx.inputs["split"] / f"{name}.parquet", ctx.out / f"{name}.parquet", ctx.params, runner, f"segment {name}")
        metrics[f"{name}_mean_words"] = counts["words"] / max(counts["rows"], 1)
    metrics["workers"] = runner.workers
    metrics["chunk_processes"] = len({(r["host"], r["pid"]) for r in runner.ran_on})
    return BuildOutput(rows=rows, metrics=metrics, info=dict(ctx.input_info["split"]))


@task(name="segment", cache_policy=NO_CACHE)
def segment(run: RunContext, split: StageResult) -> StageResult:
    """jieba and character segmentation of every split."""
    return run.run("segment", {"split": split}, build)
