"""Stage `segment`: jieba word tokens (+ optional POS tags) and character tokens, in parallel
processes. Light imports (no Prefect, no MLflow): pool workers import this module to run
`segment_chunk`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import closing, nullcontext
from functools import lru_cache
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from tasks.core import BuildContext, BuildOutput
from tasks.graph import SPLITS as SPLITS_OUTPUT
from tasks.graph import Stage
from tasks.util.io import SPLITS, Chunk, PartWriter, chunk_plan, read_chunk
from tasks.util.pool import ChunkPool
from tasks.util.rowcache import FILE, OLD_FILES, Keeper, RowCache, namespace
from tasks.util.segmenter import Segmenter, SegmenterParams

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output, and the params that name files (counted by content)
LIBRARIES = ("jieba", "rjieba", "pyarrow")
FILES: tuple[str, ...] = ("user_dict", "stopwords")


class Params(SegmenterParams):
    """The `segment` section: the segmenter's parameters and how the work is spread."""

    OUTSIDE_KEY = ("workers", "chunk_rows", "row_cache")
    workers: int = Field(0, ge=0)  # 0 = one process per core
    chunk_rows: int = Field(1000, ge=1)  # smaller chunks even out the last workers; larger cut IPC
    # keep each row's words by its text in the store (`_cache/rowcache.sqlite`,
    # tasks/util/rowcache.py): a text cut before, by the same segmenter, is not cut again (an
    # edited copy of the source, another label column)
    row_cache: bool = True

    def segmenter(self) -> SegmenterParams:
        """The part of these params that defines the tokens (what a served model needs)."""
        return SegmenterParams(**self.model_dump(include=set(SegmenterParams.model_fields)))


@lru_cache(maxsize=4)
def _segmenter(params_json: str, root: str) -> Segmenter:
    """One Segmenter per process and config (a chunk worker keeps it across chunks)."""
    return Segmenter(SegmenterParams.model_validate_json(params_json), Path(root))


@lru_cache(maxsize=2)
def _row_cache(path: str, namespace: str, pid: int) -> RowCache:
    """One connection per process (`pid`: a forked worker never uses its parent's)."""
    return RowCache(path, namespace)


def segment_chunk(chunk: Chunk, params: tuple[str, ...]) -> pd.DataFrame:
    """Chunk function: a chunk of a split with its `words`, `chars` (and `pos`) columns added;
    `params` is (segmenter params as JSON, project folder[, row cache file, its namespace]). With a
    row cache, the texts it keeps are not cut again (`_kept` marks them); the driver keeps the
    others (`write_segments`), one writer in large transactions."""
    df = read_chunk(chunk)
    segmenter, texts = _segmenter(*params[:2]), df["text"].tolist()
    cache = (
        _row_cache(params[2], params[3], os.getpid())
        if len(params) > 2 and "://" not in chunk.src
        else None
    )
    if cache is None:
        for col, values in segmenter.rows(texts).items():
            df[col] = values
        return df
    kept = cache.get(texts)
    todo = [i for i, value in enumerate(kept) if value is None]
    fresh = segmenter.rows([texts[i] for i in todo])
    columns = [c for c in ("words", "pos") if c in fresh]
    values = [[fresh[c][n] for c in columns] for n in range(len(todo))]
    for i, value in zip(todo, values):
        kept[i] = value
    # the segmenter's column order
    df["words"], df["chars"] = [value[0] for value in kept], segmenter.chars(texts)
    if "pos" in columns:
        df["pos"] = [value[1] for value in kept]
    answered = np.ones(len(df), dtype=bool)
    answered[todo] = False
    df["_kept"] = answered
    return df


def worker_count(params: Params, rows: int) -> int:
    """Processes to use: configured, else one per core, never more than there are chunks."""
    wanted = params.workers or os.cpu_count() or 1
    return max(1, min(wanted, -(-rows // params.chunk_rows)))


def segment_file(
    src: Path, dst: Path, params: Params, pool: ChunkPool, root: Path, desc: str = "segment"
) -> dict[str, float]:
    """Segment one Parquet file chunk by chunk into `dst`; returns its row and word counts."""
    tables = pool.tables(
        segment_chunk, chunk_plan(src, params.chunk_rows), _chunk_params(params, root), desc=desc
    )
    return write_segments(tables, src, dst)


def _chunk_params(
    params: Params, root: Path, cache: Path | None = None, space: str | None = None
) -> tuple[str, ...]:
    """What a chunk worker is given; with a row cache, its file and namespace (`space`, else
    computed here: it hashes the dictionaries and the segmenter's code)."""
    base = (params.segmenter().model_dump_json(), str(root))
    if cache is None or not params.row_cache:
        return base
    return base + (str(cache), space or cache_namespace(params, root))


def cache_namespace(params: Params, root: Path) -> str:
    """Everything that defines a row's words: the segmenter's settings, its dictionaries' contents,
    its code and the versions of the libraries that cut."""
    from importlib import metadata

    from tasks.util import segmenter
    from tasks.util.io import file_sha256 as digest

    files = {
        key: digest(Path(value) if Path(value).is_absolute() else root / value)
        for key in FILES
        if (value := getattr(params, key))
    }
    versions = {}
    for library in LIBRARIES[:2]:
        try:
            versions[library] = metadata.version(library)
        except metadata.PackageNotFoundError:
            versions[library] = None
    return namespace(
        params.segmenter().model_dump(mode="json"),
        files,
        versions,
        digest(Path(segmenter.__file__)),
        digest(Path(__file__)),
    )


def write_segments(
    tables: Iterable[pa.Table], src: Path, dst: Path, keeper: Keeper | None = None
) -> dict[str, float]:
    """Write the segmented chunks of `src` to `dst` in order; returns its row and word counts. With
    a `keeper`, the rows the row cache did not answer are kept in it."""
    writer, rows, words, kept = PartWriter(dst), 0, 0, 0
    for table in tables:
        if not table.num_rows:  # an empty chunk's columns have no types to write
            continue
        if "_kept" in table.column_names:  # rows the row cache answered
            kept += pc.sum(table.column("_kept")).as_py() or 0
            if keeper is not None:
                _keep(keeper, table)
            table = _without_kept(table)
        writer.write(table)
        rows += table.num_rows
        column = table.column("words")  # space-joined tokens: spaces + 1 per non-empty text
        words += pc.sum(pc.count_substring(column, " ")).as_py() or 0
        words += pc.sum(pc.cast(pc.greater(pc.utf8_length(column), 0), pa.int64())).as_py() or 0
    empty = (
        pd.read_parquet(src).head(0).assign(words=pd.Series(dtype=str), chars=pd.Series(dtype=str))
        if not rows
        else None
    )
    writer.close(empty)
    return {"rows": rows, "words": words, "kept": kept}


def _keep(keeper: Keeper, table: pa.Table) -> None:
    """The rows of a chunk that were cut, not answered: their text, words (and POS tags)."""
    new = table.filter(pc.invert(table.column("_kept")))
    columns = [new.column(c).to_pylist() for c in ("words", "pos") if c in new.column_names]
    keeper.add(new.column("text").to_pylist(), [list(v) for v in zip(*columns)])


def _without_kept(table: pa.Table) -> pa.Table:
    """The chunk's table less its `_kept` column, in its schema's pandas metadata too: the file is
    byte for byte the one a segmenter without the row cache writes."""
    import json

    meta = dict(table.schema.metadata or {})
    table = table.drop_columns(["_kept"])
    if b"pandas" in meta:
        pandas = json.loads(meta[b"pandas"])
        pandas["columns"] = [c for c in pandas["columns"] if c.get("name") != "_kept"]
        meta[b"pandas"] = json.dumps(pandas).encode("utf8")
    return table.replace_schema_metadata(meta)


def build(ctx: BuildContext) -> BuildOutput:
    """Segment every split; write `<split>.parquet` with `words`, `chars` (and `pos`) columns. The
    chunks of all splits go through one stream of workers (one pool start, and no split too small to
    spread)."""
    sources = {name: ctx.file("split", f"{name}.parquet") for name in SPLITS}
    plans = {name: chunk_plan(src, ctx.params.chunk_rows) for name, src in sources.items()}
    rows = sum(c.rows for chunks in plans.values() for c in chunks)
    pool = ctx.pool(worker_count(ctx.params, rows))
    cache = ctx.store.cache_file(FILE) if ctx.store is not None and ctx.params.row_cache else None
    keeper = None
    if cache is not None:  # made here, once, before the workers open it
        for old in OLD_FILES:  # the first layout's file: rebuilt by nothing, read by nothing
            cache.with_name(old).unlink(missing_ok=True)
        keeper = Keeper(RowCache(cache, cache_namespace(ctx.params, ctx.root)))
    tables = pool.tables(
        segment_chunk,
        [c for name in SPLITS for c in plans[name]],
        _chunk_params(ctx.params, ctx.root, cache, keeper.cache.namespace if keeper else None),
    )
    metrics, kept = {}, 0
    with closing(tables), closing(keeper) if keeper is not None else nullcontext():
        for name in SPLITS:  # chunks come back in order: each split takes its own count of them
            counts = write_segments(
                islice(tables, len(plans[name])),
                sources[name],
                ctx.out / f"{name}.parquet",
                keeper,
            )
            metrics[f"{name}_mean_words"] = counts["words"] / max(counts["rows"], 1)
            kept += counts["kept"]
    metrics["rows_segmented"], metrics["rows_reused"] = rows - kept, kept
    metrics["workers"] = pool.workers
    metrics["chunk_processes"] = len({(r["host"], r["pid"]) for r in pool.ran_on})
    return BuildOutput(rows=rows, metrics=metrics)


# the stage every kind shares, named in each kind's table
SEGMENT = Stage(
    "segment",
    ("split",),
    build,
    "jieba words (+POS) and characters, in parallel processes or on Dask",
    "train_mean_words",
    (SPLITS_OUTPUT,),
    partitioned=True,
    params=Params,
    libraries=LIBRARIES,
    files=FILES,
)
