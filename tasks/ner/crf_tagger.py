"""`crf`: a linear-chain CRF (CRFsuite) over character, bigram and lexicon window features."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import Field

from tasks.core import Section
from tasks.models.base import TrainInputs
from tasks.ner.tagged import Tagged, TaggerFn, jieba_words, load_lexicon
from tasks.ner.tagging import Lexicon, tag_set, word_places
from tasks.util.io import read_vocab
from tasks.util.progress import progress


class CRFParams(Section):
    """The `train.crf` section: a linear-chain CRF (CRFsuite, L-BFGS) over window features."""

    window: int = Field(2, ge=0, le=4)  # characters each side
    # where lexicon words begin, continue and end around each character
    lexicon_features: bool = True
    # jieba's word boundary and POS tags around each character (jieba's own dictionary)
    word_features: bool = True
    c1: float = Field(0.05, ge=0)  # L1 penalty
    c2: float = Field(0.05, ge=0)  # L2 penalty
    max_iterations: int = Field(150, ge=1)


def crf_features(
    text: str, window: int, lexicon: Lexicon | None, words: bool = False
) -> list[dict[str, float | str]]:
    """Per character: the characters and bigrams in the window, (with a lexicon) the positions of
    the lexicon words that cover it, and (with `words`) its place in jieba's word and the POS tags
    around it."""
    n = len(text)
    seg, pos = word_places(jieba_words(text)) if words else ([], [])

    def at(k: int) -> str:
        return text[k] if 0 <= k < n else ("<s>" if k < 0 else "</s>")

    places = lexicon.match(text)[1] if lexicon is not None else None
    rows = []
    for i in range(n):
        f: dict[str, float | str] = {"bias": 1.0, "digit": float(text[i].isdigit())}
        for d in range(-window, window + 1):
            f[f"c{d}"] = at(i + d)
            if d < window:
                f[f"b{d}"] = at(i + d) + at(i + d + 1)
        f["t"] = at(i - 1) + at(i) + at(i + 1)
        if places is not None:
            seen = sorted({int(v) for v in places[i] if v})
            f["lex"] = "".join("_BME"[v] for v in seen) or "-"
            for d in (-1, 1):
                if 0 <= i + d < n:
                    f[f"lex{d}"] = (
                        "".join("_BME"[v] for v in sorted({int(v) for v in places[i + d] if v}))
                        or "-"
                    )
        if words:
            f["seg"], f["pos"], f["seg_c"] = seg[i], pos[i], seg[i] + text[i]
            if i > 0:
                f["pos-1"] = pos[i - 1]
            if i + 1 < n:
                f["pos1"] = pos[i + 1]
        rows.append(f)
    return rows


def train_crf(inputs: TrainInputs) -> dict:
    """L-BFGS training with CRFsuite; each sentence's features are handed over as they are made, so
    memory holds CRFsuite's compact copy, not a dict per character of the whole corpus."""
    import time

    import pycrfsuite

    p: CRFParams = inputs.section
    lexicon = load_lexicon(inputs.vocab, 8) if p.lexicon_features else None
    t0 = time.perf_counter()
    folder = inputs.out / inputs.name
    folder.mkdir()
    with progress(
        total=len(inputs.train), desc="crf features", unit="sentence", leave=False
    ) as bar:
        trainer = _trainer(bar)
        for text, tags in zip(inputs.train["text"], inputs.train["tags"]):
            trainer.append(crf_features(text, p.window, lexicon, p.word_features), list(tags))
            bar.update(1)
    trainer.set_params(
        {
            "c1": p.c1,
            "c2": p.c2,
            "max_iterations": p.max_iterations,
            "feature.possible_transitions": True,
        }
    )
    with progress(total=p.max_iterations, desc="crf L-BFGS", unit="iteration", leave=False) as bar:
        trainer.bar = bar
        trainer.train(str(folder / "crf.model"))
    seconds = time.perf_counter() - t0
    model = pycrfsuite.Tagger()
    model.open(str(folder / "crf.model"))
    info = model.info()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "kind": "crf",
                "window": p.window,
                "lexicon": p.lexicon_features,
                "word_features": p.word_features,
                "labels": inputs.labels,
            }
        ),
        encoding="utf-8",
    )
    if lexicon is not None:
        (folder / "lexicon.txt").write_text(
            "".join(f"{w}\n" for w in lexicon.index), encoding="utf-8"
        )
    return {
        "path": inputs.name,
        "kind": "crf",
        "seconds": seconds,
        "samples_per_second": len(inputs.train) / seconds,
        "parameters": len(info.state_features) + len(info.transitions),
    }


def _trainer(bar):
    """A CRFsuite trainer whose iterations move `bar` (its own messages are not printed)."""
    import pycrfsuite

    class Trainer(pycrfsuite.Trainer):
        def on_iteration(self, log, info):
            self.bar.update(1)
            self.bar.set_postfix_str(f"loss {info.get('loss', float('nan')):.1f}")

        def on_start(self, log):
            pass

        on_featgen_progress = on_featgen_end = on_prepared = on_optimization_end = on_end = (
            lambda self, *args: None
        )

    trainer = Trainer(algorithm="lbfgs", verbose=True)  # verbose: the on_* calls happen
    trainer.bar = bar
    return trainer


def crf_tagger(folder: Path) -> TaggerFn:
    import pycrfsuite

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    lexicon = Lexicon(read_vocab(folder / "lexicon.txt"), 8) if config["lexicon"] else None
    tagger = pycrfsuite.Tagger()
    tagger.open(str(folder / "crf.model"))
    order = tag_set(config["labels"])
    # a tag never seen in training has probability 0
    known = [t for t in order if t in set(tagger.labels())]

    def tag(texts: list[str]) -> list[Tagged]:
        out = []
        for text in texts:
            if not text:
                out.append(Tagged([], [], np.zeros((0, len(order)), dtype=np.float32)))
                continue
            tags = tagger.tag(
                crf_features(text, config["window"], lexicon, config.get("word_features", False))
            )
            marginals = np.zeros((len(text), len(order)), dtype=np.float32)
            for t in known:
                column = order.index(t)
                for i in range(len(text)):
                    marginals[i, column] = tagger.marginal(t, i)
            out.append(Tagged(tags, [tagger.marginal(t, i) for i, t in enumerate(tags)], marginals))
        return out

    tag.tags = order
    return tag
