"""Stage `segment`: jieba word tokens (+ optional POS tags) and character tokens, in parallel processes."""
from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE
from tqdm.auto import tqdm

from flows.config import SegmentConfig
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult
from tasks.segmenter import Segmenter, init_worker, segment_chunk
from tasks.split import SPLITS

VERSION = "1"


def _context():
    """forkserver: workers fork from a clean server process (not from this one, which runs Prefect's and
    MLflow's threads) that has imported jieba and loaded its dictionary once."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "tasks._segment_preload"])  # __main__: workers skip re-importing it
    return ctx


def worker_count(params: SegmentConfig, rows: int) -> int:
    """Processes to use: configured, else one per core, never more than there are chunks."""
    wanted = params.workers or os.cpu_count() or 1
    return max(1, min(wanted, -(-rows // params.chunk_rows)))


def segment_texts(texts: list[str], params: SegmentConfig, desc: str = "segment") -> dict[str, list[str]]:
    """Segment texts in order-preserving chunks over processes; identical to a single-process run."""
    chunks = [texts[i : i + params.chunk_rows] for i in range(0, len(texts), params.chunk_rows)]
    workers = worker_count(params, len(texts))
    bar = tqdm(total=len(texts), desc=desc, unit="row", disable=len(texts) < 5000, leave=False, mininterval=2)
    parts: list[dict[str, list[str]]] = []
    if workers == 1:
        seg = Segmenter(params)
        for chunk in chunks:
            parts.append(seg.rows(chunk))
            bar.update(len(chunk))
    else:
        with ProcessPoolExecutor(workers, mp_context=_context(), initializer=init_worker, initargs=(params.model_dump(),)) as pool:
            for chunk, part in zip(chunks, pool.map(segment_chunk, chunks)):
                parts.append(part)
                bar.update(len(chunk))
    bar.close()
    return {k: [v for part in parts for v in part[k]] for k in (parts[0] if parts else {"words": [], "chars": []})}


def build(ctx: BuildContext) -> BuildOutput:
    """Segment every split; write `<split>.parquet` with `words`, `chars` (and `pos`) columns."""
    frames = {name: pd.read_parquet(ctx.inputs["split"] / f"{name}.parquet") for name in SPLITS}
    sizes = {name: len(df) for name, df in frames.items()}
    # one pass over all splits keeps the process pool busy
    texts = [t for df in frames.values() for t in df["text"].tolist()]
    columns = segment_texts(texts, ctx.params)
    start, metrics = 0, {}
    for name, df in frames.items():
        for col, values in columns.items():
            df[col] = values[start : start + sizes[name]]
        start += sizes[name]
        df.to_parquet(ctx.out / f"{name}.parquet", index=False)
        n_words = df["words"].str.split().str.len()
        metrics[f"{name}_mean_words"] = float(n_words.mean())
    metrics["workers"] = worker_count(ctx.params, len(texts))
    return BuildOutput(rows=len(texts), metrics=metrics, info=dict(ctx.input_info["split"]))


@task(name="segment", cache_policy=NO_CACHE)
def segment(run: RunContext, split: StageResult) -> StageResult:
    """jieba and character segmentation of every split."""
    return run.run("segment", {"split": split}, build)
