"""Stage `segment`: jieba word tokens (+ optional POS tags) and character tokens, in parallel processes."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE
from tqdm.auto import tqdm

from flows.config import PROJECT_ROOT, SegmentConfig
from flows.errors import DataError
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult
from tasks.split import SPLITS

VERSION = "1"


class Segmenter:
    """A configured jieba tokenizer (own dictionary state, so user dictionaries never leak between configs)."""

    def __init__(self, params: SegmentConfig):
        import jieba
        import jieba.posseg

        jieba.setLogLevel(logging.WARNING)
        self.params = params
        self.tokenizer = jieba.Tokenizer()
        if params.user_dict:
            self.tokenizer.load_userdict(str(_project_path(params.user_dict, "segment.user_dict")))
        self.stopwords = set()
        if params.stopwords:
            path = _project_path(params.stopwords, "segment.stopwords")
            self.stopwords = {w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip()}
        self.pos_tokenizer = jieba.posseg.POSTokenizer(self.tokenizer) if params.pos else None

    def words(self, text: str) -> list[str]:
        """Word tokens in the configured mode, whitespace and stopwords removed."""
        p = self.params
        if p.mode == "search":
            tokens = self.tokenizer.cut_for_search(text, HMM=p.hmm)
        else:
            tokens = self.tokenizer.cut(text, cut_all=p.mode == "full", HMM=p.hmm)
        return [t for t in tokens if t.strip() and t not in self.stopwords]

    def pos(self, text: str) -> list[str]:
        """`word/flag` pairs from jieba.posseg (precise mode)."""
        return [f"{w}/{f}" for w, f in self.pos_tokenizer.cut(text, HMM=self.params.hmm) if w.strip()]

    def rows(self, texts: list[str]) -> dict[str, list[str]]:
        """Space-joined word, char (and POS) token strings for a list of texts."""
        out = {
            "words": [" ".join(self.words(t)) for t in texts],
            "chars": [" ".join(c for c in t if not c.isspace()) for t in texts],
        }
        if self.pos_tokenizer is not None:
            out["pos"] = [" ".join(self.pos(t)) for t in texts]
        return out


def _project_path(value: str, key: str) -> Path:
    path = Path(value) if Path(value).is_absolute() else PROJECT_ROOT / value
    if not path.is_file():
        raise DataError(f"{key}: file not found: {path}")
    return path


_WORKER: Segmenter | None = None


def _init_worker(params: dict) -> None:
    global _WORKER
    _WORKER = Segmenter(SegmentConfig(**params))


def _work(texts: list[str]) -> dict[str, list[str]]:
    return _WORKER.rows(texts)


def worker_count(params: SegmentConfig, rows: int) -> int:
    """Processes to use: configured, else one per core, never more than there are chunks."""
    wanted = params.workers or os.cpu_count() or 1
    return max(1, min(wanted, -(-rows // params.chunk_rows)))


def segment_texts(texts: list[str], params: SegmentConfig, desc: str = "segment") -> dict[str, list[str]]:
    """Segment texts in order-preserving chunks over processes; identical to a single-process run."""
    chunks = [texts[i : i + params.chunk_rows] for i in range(0, len(texts), params.chunk_rows)]
    workers = worker_count(params, len(texts))
    bar = tqdm(total=len(texts), desc=desc, unit="row", disable=len(texts) < 5000, leave=False)
    parts: list[dict[str, list[str]]] = []
    if workers == 1:
        seg = Segmenter(params)
        for chunk in chunks:
            parts.append(seg.rows(chunk))
            bar.update(len(chunk))
    else:
        # forkserver: workers start clean instead of forking Prefect's and MLflow's threads
        ctx = mp.get_context("forkserver")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(params.model_dump(),)) as pool:
            for chunk, part in zip(chunks, pool.map(_work, chunks)):
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
