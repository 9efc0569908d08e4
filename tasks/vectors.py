"""Word vectors as the rest of the pipeline uses them (the embed stage writes them; the networks and BERT's
lexicon adapter read them), and the guard every fastText training call goes through."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from tasks.errors import DataError

# fastText 0.9.3 initialises its input matrix in 10 fixed blocks, one per training thread, over memory it
# does not zero: with fewer than 10 threads most rows stay uninitialised (garbage, at times NaN, so
# training stops with "Encountered NaN." or learns from noise), and with dim not a multiple of 10 the last
# few values do. So it always gets at least 10 threads, and configs require dim % 10 == 0.
FASTTEXT_MIN_THREADS = 10


def fasttext_dim(v: int) -> int:
    """Validator of fastText's `dim`: fastText 0.9.3 leaves the last (rows * dim) % 10 input values uninitialised."""
    if v % 10:
        raise ValueError(f"fastText dim must be a multiple of 10 (fastText 0.9.3 leaves part of its matrix uninitialised otherwise), got {v}")
    return v


def fasttext_call(train: Callable, what: str, hint: str):
    """Call a fastText training function; its divergence error becomes one clear line."""
    try:
        return train()
    except RuntimeError as e:
        raise DataError(f"{what}: training diverged ({e}); {hint}") from e



@dataclass
class WordVectors:
    """Pretrained vectors for the networks' embedding layers: `get(token)` is a vector, or None when unknown."""

    name: str
    dim: int
    get: Callable[[str], np.ndarray | None]


def keyed_word_vectors(kv, name: str = "word2vec") -> WordVectors:
    """WordVectors over gensim KeyedVectors (in-vocabulary words only)."""
    return WordVectors(name, kv.vector_size, lambda token: kv[token] if token in kv.key_to_index else None)


def load_word_vectors(folder: Path, name: str) -> WordVectors:
    """The embed stage's `word2vec` vectors, or its `fasttext` model, which builds a vector for any token
    from its character n-grams (subwords), so no vocabulary word is left without one."""
    if name == "word2vec":

        return keyed_word_vectors(load_word2vec(folder))
    if not (folder / "fasttext.bin").is_file():
        raise DataError("train.embeddings is fasttext, but the embed stage trained no fastText model (embed.fasttext.enabled is false)")
    import fasttext

    model = fasttext.load_model(str(folder / "fasttext.bin"))
    return WordVectors("fasttext", model.get_dimension(), model.get_word_vector)


def load_word2vec(folder: Path):
    """The embed stage's Word2Vec vectors as gensim KeyedVectors, from word2vec's binary format (no pickle)."""
    from gensim.models import KeyedVectors

    return KeyedVectors.load_word2vec_format(str(folder / "word2vec.bin"), binary=True)
