"""The sequence taggers of `task: ner`: `crf` (CRFsuite over character, bigram and lexicon window features),
`bilstm_crf` (character and bigram embeddings, BiLSTM, CRF) and `lexicon_tagger` (the same with the lexicon
adapter: each character attends over the vectors of the lexicon words that cover it). The vocab stage gives
the characters, bigrams and lexicon; the embed stage their vectors. A saved tagger takes cleaned text and
returns BIOES tags with a score per character."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from tasks.core import Section
from tasks.io import read_vocab
from tasks.models.base import ModelSpec, TrainInputs
from tasks.tagging import Lexicon, bigrams, spans_of, tag_set, transitions

# cleaned texts -> per text (BIOES tags, probability of each character's tag)
TaggerFn = Callable[[list[str]], list[tuple[list[str], list[float]]]]


def entity_f1(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """Entity-level micro precision, recall and F1 with strict span matching (seqeval's strict mode)."""
    tp = fp = fn = 0
    for g, p in zip(gold, pred):
        gs, ps = set(spans_of(list(g))), set(spans_of(list(p)))
        tp += len(gs & ps)
        fp += len(ps - gs)
        fn += len(gs - ps)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return {"precision": precision, "recall": recall, "f1": 2 * precision * recall / (precision + recall) if tp else 0.0}


def load_lexicon(vocab: Path, max_words: int) -> Lexicon:
    return Lexicon(read_vocab(vocab / "lexicon" / "words.txt"), max_words)


# -- crf ---------------------------------------------------------------------------------------------------


class CRFParams(Section):
    """The `train.crf` section: a linear-chain CRF (CRFsuite, L-BFGS) over window features."""

    window: int = Field(2, ge=0, le=4)  # characters each side
    lexicon_features: bool = True  # where lexicon words begin, continue and end around each character
    c1: float = Field(0.05, ge=0)  # L1 penalty
    c2: float = Field(0.05, ge=0)  # L2 penalty
    max_iterations: int = Field(150, ge=1)


def crf_features(text: str, window: int, lexicon: Lexicon | None) -> list[dict[str, float | str]]:
    """Per character: the characters and bigrams in the window, and (with a lexicon) the positions of the
    lexicon words that cover it."""
    n = len(text)

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
                    f[f"lex{d}"] = "".join("_BME"[v] for v in sorted({int(v) for v in places[i + d] if v})) or "-"
        rows.append(f)
    return rows


def train_crf(inputs: TrainInputs) -> dict:
    import time

    import sklearn_crfsuite

    p: CRFParams = inputs.section
    lexicon = load_lexicon(inputs.vocab, 8) if p.lexicon_features else None
    t0 = time.perf_counter()
    folder = inputs.out / inputs.name
    folder.mkdir()
    x = [crf_features(t, p.window, lexicon) for t in inputs.train["text"]]
    model = sklearn_crfsuite.CRF(algorithm="lbfgs", c1=p.c1, c2=p.c2, max_iterations=p.max_iterations,
                                 all_possible_transitions=True, model_filename=str(folder / "crf.model"))
    model.fit(x, [list(t) for t in inputs.train["tags"]])
    seconds = time.perf_counter() - t0
    (folder / "config.json").write_text(json.dumps({"kind": "crf", "window": p.window, "lexicon": p.lexicon_features,
                                                    "labels": inputs.labels}), encoding="utf-8")
    if lexicon is not None:
        (folder / "lexicon.txt").write_text("".join(f"{w}\n" for w in lexicon.index), encoding="utf-8")
    return {"path": inputs.name, "kind": "crf", "seconds": seconds, "samples_per_second": len(x) / seconds,
            "parameters": len(model.state_features_) + len(model.transition_features_)}


def crf_tagger(folder: Path) -> TaggerFn:
    import pycrfsuite

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    lexicon = Lexicon(read_vocab(folder / "lexicon.txt"), 8) if config["lexicon"] else None
    tagger = pycrfsuite.Tagger()
    tagger.open(str(folder / "crf.model"))

    def tag(texts: list[str]) -> list[tuple[list[str], list[float]]]:
        out = []
        for text in texts:
            if not text:
                out.append(([], []))
                continue
            tags = tagger.tag(crf_features(text, config["window"], lexicon))
            out.append((tags, [tagger.marginal(t, i) for i, t in enumerate(tags)]))
        return out

    return tag


# -- neural taggers ----------------------------------------------------------------------------------------


class TaggerParams(Section):
    """A neural tagger: character and bigram embeddings (from the embed stage), an encoder, a CRF."""

    encoder: Literal["bilstm", "transformer"] = "bilstm"
    lexicon: bool = False  # the lexicon adapter
    max_words: int = Field(6, ge=1)  # lexicon words a character attends over (the longest first)
    hidden_size: int = Field(200, ge=8)  # per direction (bilstm); the model width (transformer)
    num_layers: int = Field(1, ge=1)
    num_heads: int = Field(4, ge=1)  # transformer
    dropout: float = Field(0.5, ge=0, lt=1)
    freeze_embeddings: bool = False
    epochs: int = Field(20, ge=1)  # the taggers' own (train.epochs is the classifiers')
    patience: int = Field(5, ge=1)  # epochs without a better validation F1
    lr: float = Field(2e-3, gt=0)
    batch_size: int = Field(16, ge=1)
    max_len: int = Field(250, ge=8)  # characters per training sentence (longer ones are cut); prediction takes any length


class LexiconTaggerParams(TaggerParams):
    """The `train.lexicon_tagger` section: the neural tagger with the lexicon adapter."""

    lexicon: bool = True


class Encoded:
    """Texts as the tagger's id arrays."""

    def __init__(self, chars: dict[str, int], grams: dict[str, int], lexicon: Lexicon | None):
        self.chars, self.grams, self.lexicon = chars, grams, lexicon

    def __call__(self, text: str) -> dict[str, np.ndarray]:
        following, preceding = bigrams(text)
        row = {"chars": np.array([self.chars.get(c, 1) for c in text], dtype=np.int64),
               "next": np.array([self.grams.get(b, 1) for b in following], dtype=np.int64),
               "prev": np.array([self.grams.get(b, 1) for b in preceding], dtype=np.int64)}
        if self.lexicon is not None:
            row["words"], row["places"] = self.lexicon.match(text)
        return row


def _batch(rows: list[dict[str, np.ndarray]], chunk) -> dict:
    from tasks.models.trainer import pad

    return {k: pad([r[k] for r in rows], chunk) for k in rows[0]}


def _matrix(itos: list[str], vectors_file: Path, seed: int):
    """Embedding rows from a word2vec file where the token has a vector, small random ones elsewhere; and the
    share of tokens that had one."""
    import torch
    from gensim.models import KeyedVectors

    kv = KeyedVectors.load_word2vec_format(str(vectors_file), binary=True)
    rng = np.random.default_rng(seed)
    scale = float(np.std(kv.vectors)) if len(kv) else 0.1
    m = rng.normal(0, scale, (len(itos), kv.vector_size)).astype(np.float32)
    m[0] = 0
    found = 0
    for i, token in enumerate(itos[1:], 1):
        if token in kv.key_to_index:
            m[i] = kv[token]
            found += 1
    return torch.from_numpy(m), found / max(len(itos) - 1, 1)


def _build(config: dict):
    from tasks.models.taggers import Tagger

    return Tagger(config["num_chars"], config["num_bigrams"], config["num_words"], len(config["tags"]), config["char_dim"],
                  config["bigram_dim"], config["word_dim"], config["lexicon"], config["encoder"], config["hidden_size"],
                  config["num_layers"], config["num_heads"], config["dropout"], transitions(config["tags"]))


def decode_rows(model, rows: list[dict[str, np.ndarray]], tags: list[str], batch_size: int = 64) -> list[tuple[list[str], list[float]]]:
    """Viterbi tags and each character's marginal probability of its tag, in the order of `rows`."""
    import torch

    from tasks.models.trainer import length_buckets

    device = next(model.parameters()).device
    out: list = [None] * len(rows)
    with torch.no_grad():
        for chunk in length_buckets(rows, batch_size):
            batch = {k: v.to(device) for k, v in _batch(rows, chunk).items()}
            emissions, mask = model.emissions(batch), batch["chars"] > 0
            paths, _ = model.crf.decode(emissions, mask)
            marginals = model.crf.marginals(emissions, mask).cpu()
            for row, i, path in zip(range(len(chunk)), chunk, paths):
                out[i] = ([tags[t] for t in path], [float(marginals[row, j, t]) for j, t in enumerate(path)])
    return out


def train_tagger(inputs: TrainInputs) -> dict:
    import torch

    from tasks.models.trainer import LoopConfig, Task, fit, length_buckets, seed_everything

    p: TaggerParams = inputs.section
    seed_everything(inputs.params.seed)
    chars, grams = read_vocab(inputs.vocab / "chars" / "vocab.txt"), read_vocab(inputs.vocab / "bigrams" / "vocab.txt")
    lexicon = load_lexicon(inputs.vocab, p.max_words) if p.lexicon else None
    tags = tag_set(inputs.labels)
    index = {t: i for i, t in enumerate(tags)}
    char_m, char_cov = _matrix(chars, inputs.embed / "chars.bin", inputs.params.seed)
    gram_m, gram_cov = _matrix(grams, inputs.embed / "bigrams.bin", inputs.params.seed + 1)
    config = {"kind": "tagger", "tags": tags, "labels": inputs.labels, "num_chars": len(chars), "num_bigrams": len(grams),
              "num_words": len(lexicon) if lexicon else 1, "char_dim": char_m.shape[1], "bigram_dim": gram_m.shape[1],
              "word_dim": 0, "lexicon": p.lexicon, "max_words": p.max_words,
              **{k: getattr(p, k) for k in ("encoder", "hidden_size", "num_layers", "num_heads", "dropout")}}
    words = None
    if lexicon is not None:
        words, word_cov = _matrix(["[PAD]", *lexicon.index], inputs.embed / "words.bin", inputs.params.seed + 2)
        config["word_dim"] = words.shape[1]
    model = _build(config)
    model.char.weight.data.copy_(char_m)
    model.bigram.weight.data.copy_(gram_m)
    if words is not None:
        model.word.weight.data.copy_(words)
    if p.freeze_embeddings:
        for emb in (model.char, model.bigram, *((model.word,) if words is not None else ())):
            emb.weight.requires_grad_(False)
    encode = Encoded({c: i for i, c in enumerate(chars)}, {g: i for i, g in enumerate(grams)}, lexicon)
    train_rows = []
    for text, row_tags in zip(inputs.train["text"], inputs.train["tags"]):
        row = encode(text[: p.max_len])
        row["tags"] = np.array([index[t] for t in list(row_tags)[: p.max_len]], dtype=np.int64)
        train_rows.append(row)
    val_rows = [encode(t) for t in inputs.validation["text"]]
    val_gold = [list(t) for t in inputs.validation["tags"]]

    def batches(rng):
        for chunk in length_buckets(train_rows, p.batch_size, rng):
            yield len(chunk), _batch(train_rows, chunk)

    def validate(m) -> dict[str, float]:
        pred = [t for t, _ in decode_rows(m, val_rows, tags)]
        scores = entity_f1(val_gold, pred)
        return {"val_f1": scores["f1"], "val_precision": scores["precision"], "val_recall": scores["recall"]}

    task = Task(batches, math.ceil(len(train_rows) / p.batch_size), lambda m, b: m.loss(b), validate)
    loop = LoopConfig.from_train(inputs.params, lr=p.lr, epochs=p.epochs, patience=p.patience, monitor="val_f1")
    result = fit(inputs.name, model, task, loop, inputs.scratch, inputs.sink)
    folder = inputs.out / inputs.name
    folder.mkdir()
    torch.save({"config": config, "state_dict": model.state_dict(), "chars": chars, "bigrams": grams,
                "lexicon": list(lexicon.index) if lexicon else []}, folder / "model.pt")
    summary = {"path": inputs.name, "kind": "tagger", "seconds": result.seconds, "history": result.history,
               "best_epoch": result.best_epoch, "resumed_from_epoch": result.resumed_from_epoch, "device": result.device,
               "samples_per_second": result.samples_per_second, "char_vector_coverage": char_cov,
               "bigram_vector_coverage": gram_cov, "parameters": sum(w.numel() for w in model.parameters())}
    if words is not None:
        summary["word_vector_coverage"] = word_cov
    return summary


def tagger_from(folder: Path, device: str = "auto") -> TaggerFn:
    import torch

    from tasks.models.trainer import resolve_device

    saved = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)  # tensors and plain data only
    config = saved["config"]
    model = _build(config)
    model.load_state_dict(saved["state_dict"])
    model.to(resolve_device(device)).eval()
    lexicon = Lexicon(saved["lexicon"], config["max_words"]) if config["lexicon"] else None
    encode = Encoded({c: i for i, c in enumerate(saved["chars"])}, {g: i for i, g in enumerate(saved["bigrams"])}, lexicon)

    def tag(texts: list[str]) -> list[tuple[list[str], list[float]]]:
        rows = [encode(t) for t in texts]
        present = [i for i, t in enumerate(texts) if t]
        out: list = [([], [])] * len(texts)
        for i, result in zip(present, decode_rows(model, [rows[i] for i in present], config["tags"])):
            out[i] = result
        return out

    return tag


def load_tagger(folder: Path) -> TaggerFn:
    """A saved tagger of any kind."""
    return crf_tagger(folder) if (folder / "crf.model").is_file() else tagger_from(folder)


def predict_frame(folder: Path, df: pd.DataFrame) -> list[list[str]]:
    """BIOES tags of a frame's `text` column."""
    return [tags for tags, _ in load_tagger(folder)(df["text"].astype(str).tolist())]


CRF = ModelSpec("crf", CRFParams, train_crf, tagger=load_tagger, task="ner",
                about="linear-chain CRF (CRFsuite) over character, bigram and lexicon window features")
BILSTM_CRF = ModelSpec("bilstm_crf", TaggerParams, train_tagger, tagger=load_tagger, task="ner", uses_vectors=True,
                       about="character + bigram embeddings, BiLSTM, CRF; starts from the embed stage's vectors")
LEXICON_TAGGER = ModelSpec("lexicon_tagger", LexiconTaggerParams, train_tagger, tagger=load_tagger, task="ner", uses_vectors=True,
                           about="bilstm_crf with the lexicon adapter: each character attends over the words that cover it")
