"""Splitting every kind shares: the train/validation/test fractions, stable hash-based assignment of
units and the split sizes."""

from __future__ import annotations

import hashlib

import numpy as np
from pydantic import Field, model_validator

from tasks.core import Section


class Fractions(Section):
    """Train/validation/test fractions and the seed: what every task's split shares."""

    train: float = Field(0.8, gt=0, lt=1)
    validation: float = Field(0.1, gt=0, lt=1)
    test: float = Field(0.1, gt=0, lt=1)
    seed: int = Field(42, ge=0)  # NumPy seeds are non-negative

    @model_validator(mode="after")
    def _sums_to_one(self) -> Fractions:
        if abs(self.train + self.validation + self.test - 1.0) > 1e-6:
            raise ValueError("split fractions train + validation + test must sum to 1")
        return self


def hash_units(texts, seed: int) -> np.ndarray:
    """Each text's place in [0, 1): the first 8 bytes of blake2b(seed, text), the same on every
    machine."""
    prefix = f"{seed}\x1f".encode()
    out = np.empty(len(texts), dtype=np.float64)
    for i, text in enumerate(texts):
        digest = hashlib.blake2b(prefix + str(text).encode("utf-8"), digest_size=8).digest()
        out[i] = int.from_bytes(digest, "big") / 2.0**64
    return out


def split_sizes(n: int, fractions: np.ndarray, minimum: int) -> list[int]:
    """Rows per split for `n` rows: the largest-remainder rounding of n * fractions, each at least
    `minimum` (taken from the largest split)."""
    exact = n * fractions
    sizes = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - sizes), kind="stable")[: n - sizes.sum()]:
        sizes[i] += 1
    for i in range(len(sizes)):
        while sizes[i] < minimum:
            sizes[int(np.argmax(sizes))] -= 1
            sizes[i] += 1
    return sizes.tolist()
