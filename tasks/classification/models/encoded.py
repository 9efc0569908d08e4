"""A split's token ids on disk, for the PyTorch models to train from in bounded memory.

`encode_split` reads a split batch by batch (a `Rows` or a frame), turns each batch's texts into id
sequences and appends them to `ids.bin` (int32, all rows one after another), with `offsets.npy`
(where each row starts) and `labels.npy` (class ids, for classifiers). What stays in memory while
training is those two arrays (16 bytes a row) and one buffer of rows: an epoch reads the rows in
blocks of `BLOCK_ROWS`, the full blocks in a shuffled order, `BUFFER_ROWS` rows at a time, and
batches each buffer by length (`length_buckets`), as a split held whole was batched. A split of at
most `BUFFER_ROWS` rows is one buffer, so it is batched exactly as before (the same batches, the
same random draws).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.util.io import Rows, batches_of, columns_of

BLOCK_ROWS = 4_096  # rows read together from disk; the unit of an epoch's shuffle
# rows batched together (a multiple of BLOCK_ROWS): about 70 MB of ids at 256 tokens a row
BUFFER_ROWS = 65_536


class Encoded:
    """The id sequences of a split written by `encode_split`."""

    def __init__(self, folder: Path, buffer_rows: int | None = None, block_rows: int | None = None):
        buffer_rows, block_rows = buffer_rows or BUFFER_ROWS, block_rows or BLOCK_ROWS
        if buffer_rows % block_rows:
            raise ValueError(
                f"buffer_rows={buffer_rows} is not a multiple of block_rows={block_rows}"
            )
        self.folder, self.buffer_rows, self.block_rows = folder, buffer_rows, block_rows
        self.offsets = np.load(folder / "offsets.npy")
        self.labels = np.load(folder / "labels.npy") if (folder / "labels.npy").exists() else None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def rows(self, start: int, stop: int) -> list[np.ndarray]:
        """Rows start..stop-1, each its ids."""
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        flat = np.fromfile(
            self.folder / "ids.bin", dtype=np.int32, count=last - first, offset=4 * first
        )
        return np.split(flat, self.offsets[start + 1 : stop] - first)

    def _blocks(self, rng: np.random.Generator | None) -> list[list[tuple[int, int]]]:
        """Each buffer's row ranges: full blocks (shuffled with `rng`), the last, partial block at
        the end."""
        n = len(self)
        if n <= self.buffer_rows:
            return [[(0, n)]]
        full = n // self.block_rows
        order = rng.permutation(full) if rng is not None else np.arange(full)
        ranges = [(int(b) * self.block_rows, (int(b) + 1) * self.block_rows) for b in order]
        if n % self.block_rows:
            ranges.append((full * self.block_rows, n))
        per = self.buffer_rows // self.block_rows
        return [ranges[i : i + per] for i in range(0, len(ranges), per)]

    def steps(self, batch_size: int) -> int:
        """Batches in an epoch (the same for every epoch: buffer sizes do not depend on the
        shuffle)."""
        n, buffers = len(self), max(1, math.ceil(len(self) / self.buffer_rows))
        last = n - (buffers - 1) * self.buffer_rows
        return (buffers - 1) * math.ceil(self.buffer_rows / batch_size) + math.ceil(
            last / batch_size
        )

    def buffers(
        self, rng: np.random.Generator | None = None
    ) -> Iterator[tuple[list[np.ndarray], np.ndarray | None, np.ndarray]]:
        """(sequences, their labels, their row numbers) a buffer at a time: in row order without
        `rng`."""
        for ranges in self._blocks(rng):
            seqs, index = [], []
            for start, stop in ranges:
                seqs += self.rows(start, stop)
                index.append(np.arange(start, stop))
            rows = np.concatenate(index)
            yield seqs, (self.labels[rows] if self.labels is not None else None), rows

    def epoch(
        self, batch_size: int, rng: np.random.Generator | None = None
    ) -> Iterator[tuple[list[np.ndarray], np.ndarray, np.ndarray | None]]:
        """(buffer sequences, a batch's indices into them, the batch's labels): the batches of one
        epoch, each of rows of similar length; shuffled with `rng`, in a fixed order without."""
        from tasks.models.batching import length_buckets

        for seqs, labels, _ in self.buffers(rng):
            for chunk in length_buckets(seqs, batch_size, rng):
                yield seqs, chunk, (labels[chunk] if labels is not None else None)


def encode_split(
    data: Rows | pd.DataFrame,
    folder: Path,
    encode: Callable[[pd.DataFrame], list[list[int]]],
    labels: list[str] | None = None,
    keep: Callable[[pd.DataFrame], pd.Series] | None = None,
    columns: list[str] | None = None,
    **sizes,
) -> Encoded:
    """Write `data`'s rows (those `keep` selects) as `encode` turns each batch into id sequences;
    with `labels`, each row's class id too. Reads `columns` (plus `label`) a batch at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    index = {label: i for i, label in enumerate(labels or [])}
    read = (
        None
        if columns is None
        else list(
            dict.fromkeys(
                [*columns, *(["label"] if labels else []), *(["aug_method"] if keep else [])]
            )
        )
    )
    offsets, classes, total = [np.zeros(1, dtype=np.int64)], [], 0
    with open(folder / "ids.bin", "wb") as out:
        for batch in batches_of(data, [c for c in read if c in columns_of(data)] if read else None):
            if keep is not None:
                batch = batch[keep(batch).to_numpy(dtype=bool)]
            if not len(batch):
                continue
            seqs = encode(batch)
            lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
            out.write(
                np.fromiter(
                    (t for s in seqs for t in s), dtype=np.int32, count=int(lengths.sum())
                ).tobytes()
            )
            offsets.append(total + np.cumsum(lengths))
            total += int(lengths.sum())
            if labels:
                classes.append(batch["label"].map(index).to_numpy(dtype=np.int64))
    np.save(folder / "offsets.npy", np.concatenate(offsets))
    if labels:
        np.save(
            folder / "labels.npy",
            np.concatenate(classes) if classes else np.zeros(0, dtype=np.int64),
        )
    return Encoded(folder, **sizes)
