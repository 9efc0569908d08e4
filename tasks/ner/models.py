"""The sequence taggers of `task: ner` (`crf` is tasks/ner/crf_tagger.py): `bilstm_crf` (character
and bigram embeddings, BiLSTM, CRF), `lexicon_tagger` (the same with the lexicon adapter: each
character attends over the vectors of the lexicon words that cover it). The vocab stage gives the
characters, bigrams and lexicon; the embed stage their vectors. A saved tagger takes cleaned text
and returns BIOES tags with a score per character."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from tasks.core import Section
from tasks.models.base import ModelSpec, TrainInputs, loop_without
from tasks.ner.crf_tagger import CRFParams, crf_tagger, train_crf
from tasks.ner.ensemble import EnsembleParams, ensemble_tagger, train_ensemble
from tasks.ner.tagged import (
    SEG_DIM,
    Tagged,
    TaggerFn,
    averaged_decoder,
    entity_f1,
    jieba_words,
    load_lexicon,
)
from tasks.ner.tagging import Lexicon, bigrams, tag_set, transitions, word_features
from tasks.util.io import read_vocab

# -- neural taggers --------------------------------------------------------------------------------


class TaggerParams(Section):
    """A neural tagger: character and bigram embeddings (from the embed stage), an encoder, a
    CRF."""

    # bert: a pretrained character encoder (`checkpoint`)
    encoder: Literal["bilstm", "transformer", "bert"] = "bilstm"
    # encoder bert: a hub id (bert-base-chinese, hfl/chinese-roberta-wwm-ext) or a local folder; the
    # features above (characters, bigrams, words, lexicon) join its output
    checkpoint: str | None = None
    # encoder bert: the pretrained weights' learning rate (lr is the rest's)
    encoder_lr: float = Field(3e-5, gt=0)
    lexicon: bool = False  # the lexicon adapter
    # jieba's word boundary (B/M/E/S) and POS tag at each character (jieba's own dictionary)
    word_features: bool = True
    max_words: int = Field(6, ge=1)  # lexicon words a character attends over (the longest first)
    hidden_size: int = Field(200, ge=8)  # per direction (bilstm); the model width (transformer)
    num_layers: int = Field(1, ge=1)
    num_heads: int = Field(4, ge=1)  # transformer
    dropout: float = Field(0.5, ge=0, lt=1)
    freeze_embeddings: bool = False
    epochs: int = Field(10, ge=1)  # the taggers' own (train.epochs is the classifiers')
    patience: int = Field(4, ge=1)  # epochs without a better validation F1
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(16, ge=1)
    # copies trained from seeds train.seed, train.seed + 1, ...; their per-character tag
    # probabilities are averaged and decoded within the tag scheme (a seed ensemble: steadier,
    # `seeds` times the training)
    seeds: int = Field(1, ge=1)
    # characters per training sentence (longer ones are cut); prediction takes any length
    max_len: int = Field(250, ge=8)

    @model_validator(mode="after")
    def _checkpoint_for_bert(self):
        if self.encoder == "bert" and not self.checkpoint:
            raise ValueError(
                "encoder bert needs a checkpoint (a hub id such as bert-base-chinese, or a local "
                "folder)"
            )
        return self


class LexiconTaggerParams(TaggerParams):
    """The `train.lexicon_tagger` section: the neural tagger with the lexicon adapter."""

    lexicon: bool = True


class Encoded:
    """Texts as the tagger's id arrays; `pos` (POS tag -> id, 0 padding, 1 unknown) adds jieba's
    word features."""

    def __init__(
        self,
        chars: dict[str, int],
        grams: dict[str, int],
        lexicon: Lexicon | None,
        pos: dict[str, int] | None = None,
        bert_vocab: dict[str, int] | None = None,
    ):
        self.chars, self.grams, self.lexicon, self.pos, self.bert_vocab = (
            chars,
            grams,
            lexicon,
            pos,
            bert_vocab,
        )

    def __call__(
        self, text: str, words: list[tuple[str, str]] | None = None
    ) -> dict[str, np.ndarray]:
        """`words`: the text's jieba (word, POS) pairs when already known."""
        following, preceding = bigrams(text)
        row = {
            "chars": np.array([self.chars.get(c, 1) for c in text], dtype=np.int64),
            "next": np.array([self.grams.get(b, 1) for b in following], dtype=np.int64),
            "prev": np.array([self.grams.get(b, 1) for b in preceding], dtype=np.int64),
        }
        if self.lexicon is not None:
            row["words"], row["places"] = self.lexicon.match(text)
        if self.pos is not None:
            row["seg"], row["pos"] = word_features(
                words if words is not None else jieba_words(text), self.pos
            )
        # one token per character, as Chinese BERT vocabularies hold them
        if self.bert_vocab is not None:
            unk = self.bert_vocab.get("[UNK]", 0)
            row["bert_ids"] = np.array(
                [self.bert_vocab.get(c, self.bert_vocab.get(c.lower(), unk)) for c in text],
                dtype=np.int64,
            )
        return row


def _batch(rows: list[dict[str, np.ndarray]], chunk) -> dict:
    from tasks.models.batching import pad

    return {k: pad([r[k] for r in rows], chunk) for k in rows[0]}


def _matrix(itos: list[str], vectors_file: Path, seed: int):
    """Embedding rows from a word2vec file where the token has a vector, small random ones
    elsewhere; and the share of tokens that had one."""
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


def _bert(config: dict, checkpoint: str | None = None):
    """The pretrained encoder: from `checkpoint` when training, from the saved config when loading a
    trained tagger."""
    from transformers import AutoConfig, AutoModel

    if checkpoint is None:
        settings = dict(config["bert_config"])
        return AutoModel.from_config(
            AutoConfig.for_model(settings.pop("model_type"), **settings), add_pooling_layer=False
        )
    from tasks.util.hub import load_pretrained

    return load_pretrained(
        checkpoint,
        lambda src, local: AutoModel.from_pretrained(
            src, local_files_only=local, add_pooling_layer=False
        ),
        "BERT checkpoint",
    )


def _build(config: dict, bert=None):
    from tasks.ner.taggers import Tagger

    if config["encoder"] == "bert" and bert is None:
        bert = _bert(config)
    return Tagger(
        config["num_chars"],
        config["num_bigrams"],
        config["num_words"],
        len(config["tags"]),
        config["char_dim"],
        config["bigram_dim"],
        config["word_dim"],
        config["lexicon"],
        config["encoder"],
        config["hidden_size"],
        config["num_layers"],
        config["num_heads"],
        config["dropout"],
        transitions(config["tags"]),
        num_pos=len(config.get("pos_tags", [])) + 2,
        seg_dim=config.get("seg_dim", 0),
        bert=bert,
    )


def decode_rows(
    model, rows: list[dict[str, np.ndarray]], tags: list[str], batch_size: int = 64
) -> list[Tagged]:
    """Viterbi tags, each character's marginal probability of its tag and all marginals, in the
    order of `rows`."""
    import torch

    from tasks.models.batching import length_buckets

    device = next(model.parameters()).device
    out: list = [None] * len(rows)
    with torch.no_grad():
        for chunk in length_buckets(rows, batch_size):
            batch = {k: v.to(device) for k, v in _batch(rows, chunk).items()}
            emissions, mask = model.emissions(batch), batch["chars"] > 0
            paths, _ = model.crf.decode(emissions, mask)
            marginals = model.crf.marginals(emissions, mask).cpu()
            for row, i, path in zip(range(len(chunk)), chunk, paths):
                out[i] = Tagged(
                    [tags[t] for t in path],
                    [float(marginals[row, j, t]) for j, t in enumerate(path)],
                    marginals[row, : len(path)].numpy(),
                )
    return out


def train_tagger(inputs: TrainInputs) -> dict:
    import torch

    from tasks.models.devices import seed_everything

    p: TaggerParams = inputs.section
    seed_everything(inputs.params.seed)
    prep = _prepare(inputs, p)
    states, results, model = _train_copies(inputs, p, prep)
    folder = inputs.out / inputs.name
    folder.mkdir()
    torch.save(
        {
            "config": prep.config,
            "state_dicts": states,
            "chars": prep.chars,
            "bigrams": prep.grams,
            "lexicon": list(prep.lexicon.index) if prep.lexicon else [],
        },
        folder / "model.pt",
    )
    result = results[0]
    summary = {
        "path": inputs.name,
        "kind": "tagger",
        "seconds": sum(r.seconds for r in results),
        **result.summary(),
        "char_vector_coverage": prep.char_cov,
        "bigram_vector_coverage": prep.gram_cov,
        "parameters": sum(w.numel() for w in model.parameters()) * p.seeds,
    }
    if p.seeds > 1:
        summary["copies_val_f1_best"] = [max(h["val_f1"] for h in r.history) for r in results]
    if prep.words is not None:
        summary["word_vector_coverage"] = prep.word_cov
    return summary


@dataclass
class Prepared:
    """A tagger's training, ready to run: vocabularies, the vectors it starts from, its config and
    encoded rows."""

    chars: list[str]
    grams: list[str]
    lexicon: Lexicon | None
    tags: list[str]
    config: dict
    char_m: Any
    gram_m: Any
    char_cov: float
    gram_cov: float
    words: Any
    word_cov: float | None
    bert: Any
    train_rows: list[dict]
    val_rows: list[dict]
    val_gold: list[list[str]]


def _prepare(inputs: TrainInputs, p: TaggerParams) -> Prepared:
    chars, grams = (
        read_vocab(inputs.vocab / "chars" / "vocab.txt"),
        read_vocab(inputs.vocab / "bigrams" / "vocab.txt"),
    )
    lexicon = load_lexicon(inputs.vocab, p.max_words) if p.lexicon else None
    tags = tag_set(inputs.labels)
    index = {t: i for i, t in enumerate(tags)}
    char_m, char_cov = _matrix(chars, inputs.embed / "chars.bin", inputs.params.seed)
    gram_m, gram_cov = _matrix(grams, inputs.embed / "bigrams.bin", inputs.params.seed + 1)
    config = {
        "kind": "tagger",
        "tags": tags,
        "labels": inputs.labels,
        "num_chars": len(chars),
        "num_bigrams": len(grams),
        "num_words": len(lexicon) if lexicon else 1,
        "char_dim": char_m.shape[1],
        "bigram_dim": gram_m.shape[1],
        "word_dim": 0,
        "lexicon": p.lexicon,
        "max_words": p.max_words,
        **{
            k: getattr(p, k)
            for k in ("encoder", "hidden_size", "num_layers", "num_heads", "dropout")
        },
    }
    texts = [t[: p.max_len] for t in inputs.train["text"]]
    # segmented once
    train_words = [jieba_words(t) for t in texts] if p.word_features else [None] * len(texts)
    pos_tags: list[str] = []
    if p.word_features:  # jieba's POS tag set as the train split shows it
        pos_tags = sorted({flag for words in train_words for _, flag in words})
        config.update(pos_tags=pos_tags, seg_dim=SEG_DIM)
    bert, bert_vocab = None, None
    if p.encoder == "bert":
        from transformers import AutoTokenizer

        from tasks.util.hub import load_pretrained

        load = lambda src, local: AutoTokenizer.from_pretrained(src, local_files_only=local)
        tokenizer = load_pretrained(p.checkpoint, load, "BERT tokenizer")
        bert_vocab = tokenizer.get_vocab()
        bert = _bert(config, p.checkpoint)
        config.update(
            bert_config=bert.config.to_dict(), bert_vocab=sorted(bert_vocab, key=bert_vocab.get)
        )
    words, word_cov = None, None
    if lexicon is not None:
        words, word_cov = _matrix(
            ["[PAD]", *lexicon.index], inputs.embed / "words.bin", inputs.params.seed + 2
        )
        config["word_dim"] = words.shape[1]
    pos_index = {t: i + 2 for i, t in enumerate(pos_tags)} if p.word_features else None
    encode = Encoded(
        {c: i for i, c in enumerate(chars)},
        {g: i for i, g in enumerate(grams)},
        lexicon,
        pos_index,
        bert_vocab,
    )
    train_rows = []
    for text, segmented, row_tags in zip(texts, train_words, inputs.train["tags"]):
        row = encode(text, segmented)
        row["tags"] = np.array([index[t] for t in list(row_tags)[: p.max_len]], dtype=np.int64)
        train_rows.append(row)
    return Prepared(
        chars,
        grams,
        lexicon,
        tags,
        config,
        char_m,
        gram_m,
        char_cov,
        gram_cov,
        words,
        word_cov,
        bert,
        train_rows,
        [encode(t) for t in inputs.validation["text"]],
        [list(t) for t in inputs.validation["tags"]],
    )


def _train_copies(inputs: TrainInputs, p: TaggerParams, prep: Prepared) -> tuple[list, list, Any]:
    """`p.seeds` copies of the tagger, each from its own seed (a seed ensemble when more than
    one)."""
    from tasks.models.batching import length_buckets
    from tasks.models.devices import seed_everything
    from tasks.models.trainer import LoopConfig, Task, fit

    def batches(rng):
        for chunk in length_buckets(prep.train_rows, p.batch_size, rng):
            yield len(chunk), _batch(prep.train_rows, chunk)

    def validate(m) -> dict[str, float]:
        pred = [t.tags for t in decode_rows(m, prep.val_rows, prep.tags)]
        scores = entity_f1(prep.val_gold, pred)
        return {
            "val_f1": scores["f1"],
            "val_precision": scores["precision"],
            "val_recall": scores["recall"],
        }

    task = Task(
        batches, math.ceil(len(prep.train_rows) / p.batch_size), lambda m, b: m.loss(b), validate
    )
    states, results, model = [], [], None
    for copy in range(p.seeds):
        seed = inputs.params.seed + copy
        seed_everything(seed)
        model = _build(
            prep.config,
            prep.bert
            if copy == 0
            else (_bert(prep.config, p.checkpoint) if prep.bert is not None else None),
        )
        model.char.weight.data.copy_(prep.char_m)
        model.bigram.weight.data.copy_(prep.gram_m)
        if prep.words is not None:
            model.word.weight.data.copy_(prep.words)
        if p.freeze_embeddings:
            for emb in (
                model.char,
                model.bigram,
                *((model.word,) if prep.words is not None else ()),
            ):
                emb.weight.requires_grad_(False)
        loop = LoopConfig.from_train(
            inputs.params,
            lr=p.lr,
            epochs=p.epochs,
            patience=p.patience,
            monitor="val_f1",
            seed=seed,
            encoder_lr=p.encoder_lr if p.encoder == "bert" else None,
        )
        checkpoints = inputs.scratch if p.seeds == 1 else inputs.scratch / f"seed{seed}"
        # the model run's curves are the first copy's; the others' best scores are in the summary
        results.append(
            fit(
                inputs.name if copy == 0 else f"{inputs.name} seed {seed}",
                model,
                task,
                loop,
                checkpoints,
                inputs.sink if copy == 0 else None,
            )
        )
        states.append(model.state_dict())
    return states, results, model


def tagger_from(folder: Path, device: str = "auto") -> TaggerFn:
    import torch

    from tasks.models.devices import resolve_device

    # tensors and plain data only
    saved = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    config = saved["config"]
    models = []
    for state in saved["state_dicts"]:
        model = _build(config)
        model.load_state_dict(state)
        models.append(model.to(resolve_device(device)).eval())
    decode = (
        _averaged(models, config["tags"])
        if len(models) > 1
        else lambda rows: decode_rows(models[0], rows, config["tags"])
    )
    lexicon = Lexicon(saved["lexicon"], config["max_words"]) if config["lexicon"] else None
    pos_index = (
        {t: i + 2 for i, t in enumerate(config["pos_tags"])} if config.get("seg_dim") else None
    )
    bert_vocab = (
        {t: i for i, t in enumerate(config["bert_vocab"])} if config["encoder"] == "bert" else None
    )
    encode = Encoded(
        {c: i for i, c in enumerate(saved["chars"])},
        {g: i for i, g in enumerate(saved["bigrams"])},
        lexicon,
        pos_index,
        bert_vocab,
    )

    def tag(texts: list[str]) -> list[Tagged]:
        present = [i for i, t in enumerate(texts) if t]
        out = [Tagged([], [], np.zeros((0, len(config["tags"])), dtype=np.float32)) for _ in texts]
        for i, result in zip(present, decode([encode(texts[i]) for i in present])):
            out[i] = result
        return out

    tag.tags = config["tags"]
    return tag


def _averaged(models: list, tags: list[str]):
    """Decoding by several copies of a tagger: their marginals averaged, the best well-formed path
    over them."""
    decode_average = averaged_decoder(tags)

    def decode(rows: list[dict[str, np.ndarray]]) -> list[Tagged]:
        per_model = [decode_rows(m, rows, tags) for m in models]
        return [
            decode_average(np.mean([r.marginals for r in results], axis=0))
            for results in zip(*per_model)
        ]

    return decode


def load_tagger(folder: Path) -> TaggerFn:
    """A saved tagger of any kind."""
    if (folder / "crf.model").is_file():
        return crf_tagger(folder)
    if (folder / "members").is_dir():
        return ensemble_tagger(folder, load_tagger)
    return tagger_from(folder)


# epochs, patience: their own; a tagger has no worker processes
TAGGER_LOOP = loop_without("epochs", "patience", "processes")
CRF_TAGGER = ModelSpec(
    "crf",
    CRFParams,
    train_crf,
    load=load_tagger,
    task="ner",
    shared=(),
    about="linear-chain CRF (CRFsuite) over character, bigram and lexicon window features",
    libraries=("python-crfsuite", "jieba"),
)
BILSTM_CRF = ModelSpec(
    "bilstm_crf",
    TaggerParams,
    train_tagger,
    load=load_tagger,
    task="ner",
    uses_vectors=True,
    shared=TAGGER_LOOP,
    races=True,
    about="character + bigram embeddings, BiLSTM, CRF; starts from the embed stage's vectors",
    libraries=("torch", "gensim", "transformers", "jieba"),
)
LEXICON_TAGGER = ModelSpec(
    "lexicon_tagger",
    LexiconTaggerParams,
    train_tagger,
    load=load_tagger,
    task="ner",
    uses_vectors=True,
    shared=TAGGER_LOOP,
    races=True,
    about="bilstm_crf with the lexicon adapter: each character attends over "
    "the words that cover it",
    libraries=("torch", "gensim", "transformers", "jieba"),
)
NER_ENSEMBLE = ModelSpec(
    "ner_ensemble",
    EnsembleParams,
    train_ensemble,
    load=load_tagger,
    task="ner",
    members=lambda section: section.members,
    shared=(),
    about="the listed taggers' per-character tag probabilities averaged, decoded "
    "into well-formed spans",
    libraries=(),
)
# what the kind registers (`TaskKind.models`)
SPECS = (CRF_TAGGER, BILSTM_CRF, LEXICON_TAGGER, NER_ENSEMBLE)
MODELS = {spec.name: spec for spec in SPECS}
