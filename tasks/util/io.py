"""Files and chunks: a Parquet file is cut into chunks (slices of its row groups), a function maps
each chunk to a frame in this process or on a local process pool (`ChunkPool`; the orchestration
layer adds a Dask pool with the same interface), and the frames are written back in order, one row
group each. Whichever runs the chunks, the output file is byte-identical. Also the atomic-write and
hashing helpers.

Memory: a chunk is read from its own row group, so a worker holds one chunk, never the corpus; the
driver keeps at most `window` results in flight and writes each as soon as it is next in order. That
is why every stage writes its Parquet files with `write_parquet` (row groups of ROW_GROUP_ROWS
rows): a chunk reads only its own row groups.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.util.private import fresh_temp, write_atomic

SPLITS = ("train", "validation", "test")  # the split stage's files, in this order
ROW_GROUP_ROWS = 1000  # = segment.chunk_rows by default: a chunk reads exactly its rows
log = logging.getLogger("zhpipe")


def write_parquet(df: pd.DataFrame, path: Path, row_group_rows: int = ROW_GROUP_ROWS) -> None:
    """A stage's Parquet output, in row groups that later chunked stages read one at a time."""
    df.to_parquet(path, index=False, row_group_size=row_group_rows)


@dataclass(frozen=True)
class Chunk:
    """Rows [start, stop) of the row groups `row_groups` (consecutive, read together) of the Parquet
    file `src`."""

    src: str
    row_groups: tuple[int, ...]
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def chunk_plan(src: Path, chunk_rows: int) -> list[Chunk]:
    """Chunks of about `chunk_rows` rows: consecutive small row groups are read together, a row
    group larger than `chunk_rows` is sliced (so a worker never holds more than max(chunk_rows, one
    row group) rows)."""
    meta = pq.ParquetFile(src).metadata
    chunks: list[Chunk] = []
    group: list[int] = []
    rows = 0
    for rg in range(meta.num_row_groups):
        n = meta.row_group(rg).num_rows
        if n > chunk_rows:
            if group:
                chunks.append(Chunk(str(src), tuple(group), 0, rows))
                group, rows = [], 0
            chunks += [
                Chunk(str(src), (rg,), a, min(a + chunk_rows, n)) for a in range(0, n, chunk_rows)
            ]
            continue
        if group and rows + n > chunk_rows:
            chunks.append(Chunk(str(src), tuple(group), 0, rows))
            group, rows = [], 0
        group.append(rg)
        rows += n
    if group:
        chunks.append(Chunk(str(src), tuple(group), 0, rows))
    return chunks


def read_chunk(chunk: Chunk, columns: list[str] | None = None) -> pd.DataFrame:
    """One chunk's rows (only its row groups are read)."""
    # an object-store URL (a remote Dask worker): only the row groups' byte ranges are fetched
    if "://" in chunk.src:
        import fsspec

        with fsspec.open(chunk.src, "rb") as f:
            table = pq.ParquetFile(f).read_row_groups(list(chunk.row_groups), columns=columns)
    else:
        table = pq.ParquetFile(chunk.src).read_row_groups(list(chunk.row_groups), columns=columns)
    return table.slice(chunk.start, chunk.rows).to_pandas()


def iter_frames(
    path: Path, rows: int = 5_000, columns: list[str] | None = None
) -> Iterator[pd.DataFrame]:
    """A stage's Parquet file as frames of about `rows` rows (whole row groups), in order. Reads row
    groups explicitly: pyarrow's `iter_batches` holds on to memory as it goes (160 MB over a 250 MB
    corpus)."""
    f = pq.ParquetFile(path)
    meta = f.metadata
    group: list[int] = []
    count = 0
    for rg in range(meta.num_row_groups):
        group.append(rg)
        count += meta.row_group(rg).num_rows
        if count >= rows or rg == meta.num_row_groups - 1:
            yield f.read_row_groups(group, columns=columns).to_pandas()
            group, count = [], 0


def read_rows(path: Path, positions: np.ndarray, columns: list[str] | None = None) -> pd.DataFrame:
    """The rows of a Parquet file at `positions` (sorted, 0-based), indexed by them: only the row
    groups that hold one are read, one at a time, so a sample of a large file costs its row groups,
    not the file."""
    f = pq.ParquetFile(path)
    meta = f.metadata
    starts = np.cumsum([0] + [meta.row_group(rg).num_rows for rg in range(meta.num_row_groups)])
    groups = np.searchsorted(starts, positions, side="right") - 1
    parts = []
    for rg in np.unique(groups):
        local = positions[groups == rg] - starts[rg]
        parts.append(f.read_row_group(int(rg), columns=columns).take(pa.array(local)))
    if not parts:
        return f.schema_arrow.empty_table().select(columns or f.schema_arrow.names).to_pandas()
    frame = pa.concat_tables(parts).to_pandas()
    frame.index = pd.Index(positions)
    return frame


BATCH_ROWS = 20_000  # rows a stage holds at once when it streams a split


@dataclass(frozen=True)
class Rows:
    """A split's rows as its Parquet file: read in batches (memory is one batch, whatever the
    corpus) or whole."""

    path: Path

    def __len__(self) -> int:
        return pq.ParquetFile(self.path).metadata.num_rows

    def batches(
        self, columns: list[str] | None = None, rows: int | None = None
    ) -> Iterator[pd.DataFrame]:
        return iter_frames(self.path, rows or BATCH_ROWS, columns)

    def frame(self, columns: list[str] | None = None) -> pd.DataFrame:
        return pd.read_parquet(self.path, columns=columns)


def columns_of(data: Rows | pd.DataFrame) -> list[str]:
    """The columns of a split given as a file or as a frame."""
    return (
        pq.ParquetFile(data.path).schema_arrow.names
        if isinstance(data, Rows)
        else list(data.columns)
    )


def batches_of(
    data: Rows | pd.DataFrame, columns: list[str] | None = None, rows: int | None = None
) -> Iterator[pd.DataFrame]:
    """Batches of a split given as a file (`Rows`) or as a frame already in memory."""
    rows = rows or BATCH_ROWS
    if isinstance(data, Rows):
        yield from data.batches(columns, rows)
        return
    frame = data if columns is None else data[columns]
    for start in range(0, max(len(frame), 1), rows):
        yield frame.iloc[start : start + rows]


def text_digests(texts, key: str = "zhpipe-textset-1") -> np.ndarray:
    """A 64-bit digest of each text (pandas' SipHash under `key`, 16 characters; vectorised): equal
    texts, equal digests. A Series is hashed as it is (its string dtype hashes as object strings
    do)."""
    series = texts if isinstance(texts, pd.Series) else pd.Series(texts, dtype=object)
    return pd.util.hash_pandas_object(series, index=False, hash_key=key).to_numpy()


class TextSet:
    """A set of texts held as 64-bit digests (8 bytes a text, not the texts): `text in s`,
    `s.isin(series)`, `s.add(text)`. For the texts a stage must never emit (held-out splits) over a
    corpus of any size."""

    def __init__(self, digests: np.ndarray | None = None):
        self._sorted = np.unique(digests) if digests is not None else np.zeros(0, dtype=np.uint64)
        self._added: set[int] = set()

    @classmethod
    def of(cls, batches: Iterable) -> TextSet:
        parts = [text_digests(b) for b in batches]
        return cls(np.concatenate(parts) if parts else None)

    @classmethod
    def coerce(cls, texts) -> TextSet:
        """`texts` itself when it is a TextSet, else a TextSet of its texts (a set or list, as a
        notebook passes)."""
        return texts if isinstance(texts, TextSet) else cls.of([list(texts)])

    def union(self, texts) -> TextSet:
        return TextSet(
            np.concatenate(
                [
                    self._sorted,
                    text_digests(texts),
                    np.fromiter(self._added, np.uint64, len(self._added)),
                ]
            )
        )

    def isin(self, texts) -> np.ndarray:
        d = text_digests(texts)
        found = np.zeros(len(d), dtype=bool)
        if len(self._sorted):
            at = np.minimum(np.searchsorted(self._sorted, d), len(self._sorted) - 1)
            found = self._sorted[at] == d
        if self._added:
            found |= np.fromiter((int(x) in self._added for x in d), bool, len(d))
        return found

    def __contains__(self, text: str) -> bool:
        return bool(self.isin([text])[0])

    def add(self, text: str) -> None:
        self._added.add(int(text_digests([text])[0]))


# rows shuffled in memory at once: a larger split is dealt into buckets of about this size
SHUFFLE_ROWS = 200_000
SHUFFLE_MB = 48  # ... and of at most about this many MB of text


def split_mb(data: Rows | pd.DataFrame, columns: list[str] | None = None) -> float:
    """A split's size in MB: its columns' uncompressed bytes from the Parquet metadata, or a frame's
    text."""
    if isinstance(data, Rows):
        meta = pq.ParquetFile(data.path).metadata
        names = meta.schema.names
        wanted = [names.index(c) for c in (columns or names) if c in names]
        return (
            sum(
                meta.row_group(g).column(c).total_uncompressed_size
                for g in range(meta.num_row_groups)
                for c in wanted
            )
            / 2**20
        )
    frame = data if columns is None else data[[c for c in columns if c in data]]
    text = [
        c
        for c in frame.columns
        if pd.api.types.is_string_dtype(frame[c]) or frame[c].dtype == object
    ]
    return float(sum(frame[c].astype(str).str.len().sum() * 3 for c in text)) / 2**20


def shuffled(
    data: Rows | pd.DataFrame,
    folder: Path,
    seed: int,
    columns: list[str] | None = None,
    bucket_rows: int = SHUFFLE_ROWS,
) -> Rows | pd.DataFrame:
    """The rows of `data` in an order shuffled with `seed` (fastText and SGD learn from rows in file
    order, and a corpus is often sorted by label). Up to `bucket_rows` rows: a frame in the order of
    a seeded permutation (what `frame.sample(frac=1, random_state=seed)` gives). More: the rows are
    dealt into random buckets on disk under `folder`, and each bucket, shuffled, is appended to
    `folder/shuffled.parquet`, so memory is one bucket."""
    n = len(data)
    mb = split_mb(data, columns)
    if n <= bucket_rows and mb <= SHUFFLE_MB:
        frame = (
            data.frame(columns)
            if isinstance(data, Rows)
            else (data if columns is None else data[columns])
        )
        return frame.iloc[np.random.RandomState(seed).permutation(n)]
    rng = np.random.default_rng(seed)
    buckets = max(-(-n // bucket_rows), int(np.ceil(mb / SHUFFLE_MB)))
    folder.mkdir(parents=True, exist_ok=True)
    writers = [PartWriter(folder / f"bucket-{b}.parquet") for b in range(buckets)]
    for batch in batches_of(data, columns):
        deal = rng.integers(buckets, size=len(batch))
        for b, writer in enumerate(writers):
            part = batch[deal == b]
            if len(part):
                writer.write(pa.Table.from_pandas(part, preserve_index=False))
    out = PartWriter(folder / "shuffled.parquet", ROW_GROUP_ROWS)
    for writer in writers:
        writer.close()
        if writer.path.exists():
            part = pd.read_parquet(writer.path)
            out.write(
                pa.Table.from_pandas(part.iloc[rng.permutation(len(part))], preserve_index=False)
            )
            writer.path.unlink()
    out.close()
    return Rows(folder / "shuffled.parquet")


def predict_batches(
    predict: Callable[[pd.DataFrame], np.ndarray], data: Rows | pd.DataFrame, rows: int = 4096
) -> np.ndarray:
    """A predictor's outputs over a whole split, asked batch by batch (memory: one batch and the
    outputs)."""
    parts = [predict(batch) for batch in batches_of(data, rows=rows) if len(batch)]
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


class PartWriter:
    """Writes frames to one Parquet file in order, one row group per frame (or per `row_group_rows`
    rows); atomic via a temporary name."""

    def __init__(self, path: Path, row_group_rows: int | None = None):
        self.path = Path(path)
        self.row_group_rows = row_group_rows
        self.tmp = fresh_temp(self.path)
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        """Append a chunk's table (a frame is converted) as the next row group."""
        if isinstance(table, pd.DataFrame):
            table = pa.Table.from_pandas(table, preserve_index=False)
        if self.writer is None:
            self.schema = table.schema
            self.writer = pq.ParquetWriter(self.tmp, self.schema)
        elif table.schema != self.schema:
            table = table.cast(self.schema)  # e.g. a column that was all null in the first chunk
        self.writer.write_table(table, row_group_size=self.row_group_rows or max(table.num_rows, 1))
        self.rows += table.num_rows

    def close(self, empty: pd.DataFrame | None = None) -> None:
        """Finish the file; with no frames written, write `empty` (the columns, no rows)."""
        if self.writer is None:
            (empty if empty is not None else pd.DataFrame()).to_parquet(self.tmp, index=False)
        else:
            self.writer.close()
        os.replace(self.tmp, self.path)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file via a temporary sibling and rename, so readers never see half of it."""
    write_atomic(path, text)


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, read in chunks."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def resolve_path(location: str, root: Path) -> Path | None:
    """A local path for `location` (plain path or file:// URL; relative paths from the project
    folder `root`); None for an http(s) URL."""
    if location.startswith(("http://", "https://")):
        return None
    if location.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(location).path))
    p = Path(location).expanduser()
    return p if p.is_absolute() else root / p


def sorted_labels(labels: Iterable[str]) -> list[str]:
    """Distinct labels (of a column, a set, ...); numeric ones sort as numbers (2 before 10), others
    as strings."""

    def order(label: str):
        try:
            return (0, float(label), label)
        except ValueError:
            return (1, 0.0, label)

    return sorted(set(labels), key=order)


def read_vocab(path: Path) -> list[str]:
    """Tokens of a `vocab.txt`, id = line number."""
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def safe_name(value: str, limit: int = 60) -> str:
    """`value` as one file-name or key component: letters (any script), digits, '-', '_' and '.'
    kept, others replaced by '_'; when anything was changed or cut, a short hash keeps distinct
    values distinct."""
    import hashlib
    import re

    text = str(value)
    clean = re.sub(r"[^\w.-]", "_", text)[:limit].strip(".") or "_"
    if clean != text:
        clean += "-" + hashlib.sha256(text.encode()).hexdigest()[:6]
    return clean
