"""What every tagger of `task: ner` shares: a tagged text (BIOES tags, scores, marginals), entity
F1, jieba's words and the lexicon of a pipeline, and decoding averaged marginals into a well-formed
tag path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.ner.tagging import Lexicon, prf, span_counts, transitions
from tasks.util.io import read_vocab

SEG_DIM = 20  # the word-boundary and POS embeddings


@dataclass
class Tagged:
    """One text as a tagger sees it: BIOES tags, the probability of each character's tag, and every
    tag's marginal probability per character (characters x `tags` of the tagger, for ensembles)."""

    tags: list[str]
    scores: list[float]
    marginals: np.ndarray


# cleaned texts -> one Tagged per text; the function's `tags` attribute is the marginals' column
# order
TaggerFn = Callable[[list[str]], list[Tagged]]


def entity_f1(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """Entity-level micro precision, recall and F1 with strict span matching (seqeval's strict
    mode)."""
    tp, fp, fn = span_counts(gold, pred)
    return dict(
        zip(
            ("precision", "recall", "f1"), prf(sum(tp.values()), sum(fp.values()), sum(fn.values()))
        )
    )


def jieba_words(text: str) -> list[tuple[str, str]]:
    """(word, POS tag) pairs of jieba.posseg with its own dictionary and HMM."""
    import jieba.posseg

    from tasks.util.segmenter import _jieba

    _jieba()  # jieba's cache in a folder of our own, before posseg loads the dictionary

    return [(w.word, w.flag) for w in jieba.posseg.lcut(text)]


def load_lexicon(vocab: Path, max_words: int) -> Lexicon:
    return Lexicon(read_vocab(vocab / "lexicon" / "words.txt"), max_words)


def constrained_viterbi(
    log_probs: np.ndarray, allowed: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> list[int]:
    """The tag path with the highest sum of per-character log probabilities among the paths the
    transitions allow (characters x tags in; one tag index per character out)."""
    never = -1e9
    step = np.where(allowed, 0.0, never)
    score = log_probs[0] + np.where(starts, 0.0, never)
    back = []
    for row in log_probs[1:]:
        total = score[:, None] + step
        back.append(total.argmax(0))
        score = total.max(0) + row
    path = [int(np.argmax(score + np.where(ends, 0.0, never)))]
    for pointers in reversed(back):
        path.append(int(pointers[path[-1]]))
    return path[::-1]


def averaged_decoder(tags: list[str]) -> Callable[[np.ndarray], Tagged]:
    """Averaged marginals (characters x `tags`) -> the best well-formed tag path over them, with
    each character's averaged probability of its tag (seed ensembles and ner_ensemble decode this
    way)."""
    allowed, starts, ends = (np.array(a, dtype=bool) for a in transitions(tags))

    def decode(average: np.ndarray) -> Tagged:
        if not len(average):
            return Tagged([], [], average.astype(np.float32))
        path = constrained_viterbi(np.log(np.clip(average, 1e-12, 1.0)), allowed, starts, ends)
        return Tagged(
            [tags[k] for k in path],
            [float(average[j, k]) for j, k in enumerate(path)],
            average.astype(np.float32),
        )

    return decode
