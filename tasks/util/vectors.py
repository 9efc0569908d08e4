"""Word vectors as the rest of the pipeline uses them (the embed stage writes them; the networks and
BERT's lexicon adapter read them), and the guard every fastText training call goes through."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.core import Section
from tasks.errors import DataError
from tasks.util.progress import progress

# fastText 0.9.3 initialises its input matrix in 10 fixed blocks, one per training thread, over
# memory it does not zero: with fewer than 10 threads most rows stay uninitialised (garbage, at
# times NaN, so training stops with "Encountered NaN." or learns from noise), and with dim not a
# multiple of 10 the last few values do. So it always gets at least 10 threads, and configs require
# dim % 10 == 0.
FASTTEXT_MIN_THREADS = 10


def fasttext_dim(v: int) -> int:
    """Validator of fastText's `dim`: fastText 0.9.3 leaves the last (rows * dim) % 10 input values
    uninitialised."""
    if v % 10:
        raise ValueError(
            f"fastText dim must be a multiple of 10 (fastText 0.9.3 leaves part of its matrix "
            f"uninitialised otherwise), got {v}"
        )
    return v


def fasttext_call(train: Callable, what: str, hint: str):
    """Call a fastText training function; its divergence error becomes one clear line."""
    try:
        return train()
    except RuntimeError as e:
        raise DataError(f"{what}: training diverged ({e}); {hint}") from e


@dataclass
class WordVectors:
    """Pretrained vectors for the networks' embedding layers: `get(token)` is a vector, or None when
    unknown."""

    name: str
    dim: int
    get: Callable[[str], np.ndarray | None]


def keyed_word_vectors(kv, name: str = "word2vec") -> WordVectors:
    """WordVectors over gensim KeyedVectors (in-vocabulary words only)."""
    return WordVectors(
        name, kv.vector_size, lambda token: kv[token] if token in kv.key_to_index else None
    )


def load_word_vectors(folder: Path, name: str) -> WordVectors:
    """The embed stage's `word2vec` vectors, or its `fasttext` model, which builds a vector for any
    token from its character n-grams (subwords), so no vocabulary word is left without one."""
    if name == "word2vec":
        return keyed_word_vectors(load_word2vec(folder))
    if not (folder / "fasttext.bin").is_file():
        raise DataError(
            "train.embeddings is fasttext, but the embed stage trained no fastText model "
            "(embed.fasttext.enabled is false)"
        )
    import fasttext

    model = fasttext.load_model(str(folder / "fasttext.bin"))
    return WordVectors("fasttext", model.get_dimension(), model.get_word_vector)


def load_word2vec(folder: Path):
    """The embed stage's Word2Vec vectors as gensim KeyedVectors, from word2vec's binary format (no
    pickle)."""
    from gensim.models import KeyedVectors

    return KeyedVectors.load_word2vec_format(str(folder / "word2vec.bin"), binary=True)


class Word2VecParams(Section):
    """Word2Vec (gensim) settings."""

    vector_size: int = 128
    window: int = 5
    min_count: int = 2
    sg: bool = False  # False = CBOW, True = skip-gram
    hs: bool = False  # True = hierarchical softmax instead of negative sampling
    negative: int = 5
    epochs: int = 10


def train_word2vec(corpus: Path, params: Any):
    """Word2Vec (CBOW or skip-gram; negative sampling or hierarchical softmax) from a
    token-per-space file."""
    from gensim.models import Word2Vec
    from gensim.models.callbacks import CallbackAny2Vec

    class Progress(CallbackAny2Vec):
        def __init__(self, bar):
            self.bar = bar

        def on_epoch_end(self, model):
            self.bar.update(1)

    w = params.word2vec
    logging.getLogger("gensim").setLevel(logging.WARNING)
    with progress(total=w.epochs, desc="word2vec", unit="epoch", leave=False) as bar:
        model = Word2Vec(
            corpus_file=str(corpus),
            vector_size=w.vector_size,
            window=w.window,
            min_count=w.min_count,
            sg=int(w.sg),
            hs=int(w.hs),
            negative=0 if w.hs else w.negative,
            epochs=w.epochs,
            workers=params.workers,
            seed=params.seed,
            callbacks=[Progress(bar)],
        )
    return model.wv


def neighbours(name: str, probe: list[str], lookup, topn: int) -> list[dict]:
    """Rows of (model, probe word, rank, neighbour, cosine) for a nearest-neighbour table."""
    rows = []
    for word in probe:
        for rank, (other, score) in enumerate(lookup(word, topn), 1):
            rows.append(
                {
                    "model": name,
                    "word": word,
                    "rank": rank,
                    "neighbour": other,
                    "cosine": round(float(score), 4),
                }
            )
    return rows
