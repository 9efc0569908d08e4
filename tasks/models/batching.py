"""Batches of token sequences: similar lengths together (less padding), padded into a tensor."""

from __future__ import annotations

import numpy as np
import torch


def length_buckets(
    seqs: list, batch_size: int, rng: np.random.Generator | None = None
) -> list[np.ndarray]:
    """Row indices per batch, each batch holding texts of similar length (little padding); the
    batches are shuffled when `rng` is given, the rows stay sorted inside them."""
    order = np.argsort([len(s) for s in seqs], kind="stable")
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        rng.shuffle(chunks)
    return chunks


def pad(seqs: list, chunk: np.ndarray, value: int = 0) -> torch.Tensor:
    """The chunk's sequences as one (rows, longest, ...) int64 tensor, padded at the end with
    `value`."""
    first = np.asarray(seqs[chunk[0]])
    out = torch.full(
        (len(chunk), max(len(seqs[i]) for i in chunk), *first.shape[1:]), value, dtype=torch.long
    )
    for row, i in enumerate(chunk):
        out[row, : len(seqs[i])] = torch.as_tensor(np.asarray(seqs[i]))
    return out
