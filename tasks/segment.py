"""Stage `segment`: jieba word tokens (+ optional POS tags) and character tokens, in parallel processes."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.chunks import PartWriter, Runner, plan
from flows.config import SegmentConfig
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult
from tasks.segmenter import segment_chunk  # in the light module: pool workers import it, not Prefect
from tasks.split import SPLITS

VERSION = "2"  # chunked: row groups of `chunk_rows` rows


def worker_count(params: SegmentConfig, rows: int) -> int:
    """Processes to use: configured, else one per core, never more than there are chunks."""
    wanted = params.workers or os.cpu_count() or 1
    return max(1, min(wanted, -(-rows // params.chunk_rows)))


def segment_file(src: Path, dst: Path, params: SegmentConfig, runner: Runner, desc: str = "segment") -> dict[str, float]:
    """Segment one Parquet file chunk by chunk into `dst`; returns its row and word counts."""
    writer, rows, words = PartWriter(dst), 0, 0
    for table in runner.tables(segment_chunk, plan(src, params.chunk_rows), params.model_dump_json(), desc=desc):
        writer.write(table)
        rows += table.num_rows
        column = table.column("words")  # space-joined tokens: spaces + 1 per non-empty text
        words += pc.sum(pc.count_substring(column, " ")).as_py() or 0
        words += pc.sum(pc.cast(pc.greater(pc.utf8_length(column), 0), pa.int64())).as_py() or 0
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
