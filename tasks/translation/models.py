"""The translators of `task: translation`: `seq2seq` (a GRU encoder-decoder without attention),
`seq2seq_attention` (the same with Bahdanau attention) and `transformer_mt` (a Transformer
encoder-decoder). They read the vocab stage's source and target vocabularies, train with teacher
forcing and label smoothing through the shared loop (per-epoch checkpoints, exact resume, early
stopping on validation loss), and translate with beam search. A saved translator is `model.pt`
(tensors and plain data, loaded with weights_only=True)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import Field

from tasks.core import Section
from tasks.models.base import ModelSpec, TrainInputs, loop_without
from tasks.translation.text import detokenize, side_tokens, sides
from tasks.util.io import read_vocab

# the `train` section's shared settings a translator reads (its own section has its epochs)
SHARED = ("direction", *loop_without("epochs", "processes"))
BOS, EOS = "[CLS]", "[SEP]"  # the vocabularies' specials that start and end a target sentence


class DecodeParams(Section):
    """How a trained translator decodes (also what `zhpipe predict` and the evaluate stage use)."""

    beam_size: int = Field(4, ge=1)  # 1 = greedy search
    length_penalty: float = Field(1.0, ge=0)  # score / length^penalty picks among finished beams
    max_len: int = Field(40, ge=1)  # tokens per side: longer sources are cut, targets end here
    batch_size: int = Field(64, ge=1)  # sentences decoded at once


class GRUParams(DecodeParams):
    """The `train.seq2seq` section: a bidirectional GRU encoder and a GRU decoder."""

    embed_dim: int = 256
    hidden_size: int = 256
    num_layers: int = 1
    dropout: float = 0.3
    label_smoothing: float = Field(0.1, ge=0, lt=1)
    epochs: int = Field(10, ge=1)
    lr: float = 2e-3
    train_batch_size: int = Field(128, ge=1)


class AttentionParams(GRUParams):
    """The `train.seq2seq_attention` section: the GRU encoder-decoder with Bahdanau attention."""


class TransformerParams(DecodeParams):
    """The `train.transformer_mt` section: a Transformer encoder-decoder."""

    d_model: int = 256
    num_heads: int = 4
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    ff_dim: int = 512
    dropout: float = 0.2
    label_smoothing: float = Field(0.1, ge=0, lt=1)
    epochs: int = Field(15, ge=1)
    lr: float = 1e-3
    # Transformers need a longer warm-up than train.warmup_ratio
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    train_batch_size: int = Field(128, ge=1)


@dataclass
class Pairs:
    """Token ids of a frame's pairs in one direction: source ids, target ids with BOS/EOS."""

    src: list[list[int]]
    tgt: list[list[int]]


class Vocabs:
    """The source and target vocabularies of one direction, from the vocab stage's folder."""

    def __init__(self, vocab_root: Path, direction: str):
        meta = json.loads((vocab_root / "vocab.json").read_text(encoding="utf-8"))
        self.direction, self.zh_tokens = direction, meta["zh_tokens"]
        self.src_lang, self.tgt_lang = sides(direction)
        self.src_itos = read_vocab(vocab_root / self.src_lang / "vocab.txt")
        self.tgt_itos = read_vocab(vocab_root / self.tgt_lang / "vocab.txt")

    @classmethod
    def saved(cls, saved: dict) -> Vocabs:
        self = cls.__new__(cls)
        self.direction, self.zh_tokens = saved["direction"], saved["zh_tokens"]
        self.src_lang, self.tgt_lang = sides(self.direction)
        self.src_itos, self.tgt_itos = saved["src_vocab"], saved["tgt_vocab"]
        return self

    @property
    def bos(self) -> int:
        return self.tgt_itos.index(BOS)

    @property
    def eos(self) -> int:
        return self.tgt_itos.index(EOS)

    def encode(self, frame: pd.DataFrame, max_len: int, targets: bool = True) -> Pairs:
        src_stoi = {t: i for i, t in enumerate(self.src_itos)}
        tgt_stoi = {t: i for i, t in enumerate(self.tgt_itos)}
        src = [
            [src_stoi.get(t, 1) for t in row[:max_len]] or [1]
            for row in side_tokens(frame, self.src_lang, self.zh_tokens)
        ]
        tgt = (
            [
                [self.bos, *(tgt_stoi.get(t, 1) for t in row[: max_len - 1]), self.eos]
                for row in side_tokens(frame, self.tgt_lang, self.zh_tokens)
            ]
            if targets
            else []
        )
        return Pairs(src, tgt)

    def text(self, ids: list[int]) -> str:
        return detokenize([self.tgt_itos[i] for i in ids], self.tgt_lang)


def build_network(name: str, section: Any, vocabs: Vocabs):
    """The network and its config dataclass for a model name and its section."""
    from tasks.translation.seq2seq_nets import (
        GRUSeq2Seq,
        Seq2SeqConfig,
        TransformerMT,
        TransformerMTConfig,
    )

    if name == "transformer_mt":
        config = TransformerMTConfig(
            len(vocabs.src_itos),
            len(vocabs.tgt_itos),
            section.d_model,
            section.num_heads,
            section.num_encoder_layers,
            section.num_decoder_layers,
            section.ff_dim,
            section.dropout,
            max_len=section.max_len + 2,
        )
        return TransformerMT(config), config
    config = Seq2SeqConfig(
        len(vocabs.src_itos),
        len(vocabs.tgt_itos),
        section.embed_dim,
        section.hidden_size,
        section.num_layers,
        section.dropout,
        attention=name != "seq2seq",
    )
    return GRUSeq2Seq(config), config


def load_network(saved: dict):
    from tasks.translation.seq2seq_nets import (
        GRUSeq2Seq,
        Seq2SeqConfig,
        TransformerMT,
        TransformerMTConfig,
    )

    if saved["network"] == "transformer":
        model = TransformerMT(TransformerMTConfig(**saved["config"]))
    else:
        model = GRUSeq2Seq(Seq2SeqConfig(**saved["config"]))
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def pair_batches(pairs: Pairs, batch_size: int, rng: np.random.Generator | None = None):
    """Length-bucketed (rows, {src, tgt_in, tgt_out}) batches, padded with 0."""
    from tasks.models.batching import length_buckets, pad

    for chunk in length_buckets(pairs.src, batch_size, rng):
        tgt = pad(pairs.tgt, chunk)
        yield (
            len(chunk),
            {"src": pad(pairs.src, chunk), "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]},
        )


def sequence_loss(model, batch: dict, label_smoothing: float = 0.0):
    import torch.nn.functional as F

    logits = model(batch["src"], batch["tgt_in"])
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(),
        batch["tgt_out"].reshape(-1),
        ignore_index=0,
        label_smoothing=label_smoothing,
    )


def mean_loss(model, pairs: Pairs, batch_size: int = 128) -> float:
    """Token-level cross-entropy on held-out pairs (no smoothing): what early stopping watches."""
    import torch.nn.functional as F

    device = next(model.parameters()).device
    total = count = 0.0
    for _, batch in pair_batches(pairs, batch_size):
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(batch["src"], batch["tgt_in"]).float()
        total += F.cross_entropy(
            logits.reshape(-1, logits.size(-1)),
            batch["tgt_out"].reshape(-1),
            ignore_index=0,
            reduction="sum",
        ).item()
        count += (batch["tgt_out"] != 0).sum().item()
    return total / max(count, 1)


def translate_ids(
    model, src: list[list[int]], bos: int, eos: int, decode: DecodeParams, beam: int | None = None
) -> list[list[int]]:
    """Target ids per source (in the given order), decoded in length-sorted batches."""
    import torch

    from tasks.models.batching import pad
    from tasks.translation.seq2seq_nets import beam_search, greedy

    device = next(model.parameters()).device
    beam = decode.beam_size if beam is None else beam
    out: list[list[int]] = [[] for _ in src]
    order = np.argsort([len(s) for s in src], kind="stable")
    with torch.no_grad():
        for i in range(0, len(order), decode.batch_size):
            chunk = order[i : i + decode.batch_size]
            x = pad(src, chunk).to(device)
            limit = min(decode.max_len, int(x.size(1) * 2 + 10))
            rows = (
                greedy(model, x, bos, eos, limit)[0]
                if beam == 1
                else beam_search(model, x, bos, eos, limit, beam, decode.length_penalty)
            )
            for j, row in zip(chunk, rows):
                out[j] = row
    return out


def train_translator(inputs: TrainInputs) -> dict:
    """Fit one translator on the train pairs; save `<name>/model.pt`; summary with validation BLEU
    (beam search)."""
    import torch

    from tasks.models.devices import seed_everything
    from tasks.models.trainer import LoopConfig, Task, fit

    p = inputs.section
    params = inputs.params
    vocabs = Vocabs(inputs.vocab, params.direction)
    train, validation = (
        vocabs.encode(inputs.train, p.max_len),
        vocabs.encode(inputs.validation, p.max_len),
    )
    seed_everything(params.seed)
    model, config = build_network(inputs.name, p, vocabs)
    task = Task(
        lambda rng: pair_batches(train, p.train_batch_size, rng),
        steps_per_epoch=-(-len(train.src) // p.train_batch_size),
        loss=lambda m, b: sequence_loss(m, b, p.label_smoothing),
        validate=lambda m: {"val_loss": mean_loss(m, validation)},
    )
    overrides = {"epochs": p.epochs, "monitor": "val_loss", "mode": "min"}
    if hasattr(p, "warmup_ratio"):
        overrides["warmup_ratio"] = p.warmup_ratio
    result = fit(
        inputs.name,
        model,
        task,
        LoopConfig.from_train(params, lr=p.lr, **overrides),
        inputs.scratch,
        inputs.sink,
    )
    folder = inputs.out / inputs.name
    folder.mkdir()
    saved = {
        "network": "transformer" if inputs.name == "transformer_mt" else "gru",
        "config": asdict(config),
        "state_dict": model.state_dict(),
        "direction": vocabs.direction,
        "zh_tokens": vocabs.zh_tokens,
        "src_vocab": vocabs.src_itos,
        "tgt_vocab": vocabs.tgt_itos,
        "decode": DecodeParams(**p.model_dump(include=set(DecodeParams.model_fields))).model_dump(),
    }
    torch.save(saved, folder / "model.pt")
    hypotheses = [
        vocabs.text(ids) for ids in translate_ids(model, validation.src, vocabs.bos, vocabs.eos, p)
    ]
    references = (
        inputs.validation[vocabs.tgt_lang if vocabs.tgt_lang == "en" else "text"]
        .astype(str)
        .tolist()
    )
    scores = corpus_scores(hypotheses, references, vocabs.tgt_lang)
    best = result.history[result.best_epoch - 1]
    return {
        "path": inputs.name,
        "kind": "translator",
        "seconds": result.seconds,
        **result.summary(),
        "parameters": sum(w.numel() for w in model.parameters()),
        "val_loss": best["val_loss"],
        "val_bleu": scores["bleu"],
        "val_chrf": scores["chrf"],
        "direction": vocabs.direction,
    }


def corpus_scores(hypotheses: list[str], references: list[str], lang: str) -> dict[str, Any]:
    """sacrebleu's corpus BLEU (its `zh` tokenizer for Chinese, `13a` otherwise) and chrF, with
    their signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(tokenize="zh" if lang == "zh" else "13a"), CHRF()
    b, c = bleu.corpus_score(hypotheses, [references]), chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": float(b.score),
        "chrf": float(c.score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


@dataclass
class Translation:
    text: str
    tokens: list[str]
    attention: np.ndarray | None = None  # (target tokens + EOS, source tokens)


TranslatorFn = Callable[..., list[Translation]]


def load_translator(folder: Path, device: str = "auto") -> TranslatorFn:
    """A saved translator -> fn(frame with the source side's columns, beam=None, attention=False) ->
    translations."""
    import torch

    from tasks.models.batching import pad
    from tasks.models.devices import resolve_device
    from tasks.translation.seq2seq_nets import greedy

    saved = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    vocabs = Vocabs.saved(saved)
    decode = DecodeParams(**saved["decode"])
    model = load_network(saved).to(resolve_device(device))

    def translate(
        frame: pd.DataFrame, beam: int | None = None, attention: bool = False
    ) -> list[Translation]:
        src = vocabs.encode(frame, decode.max_len, targets=False).src
        if not attention:
            ids = translate_ids(model, src, vocabs.bos, vocabs.eos, decode, beam)
            return [Translation(vocabs.text(row), [vocabs.tgt_itos[i] for i in row]) for row in ids]
        out = []
        if hasattr(model, "record_attention"):
            model.record_attention(True)
        try:
            with torch.no_grad():
                for row in src:  # one at a time: every map keeps its own length
                    ids, maps = greedy(
                        model,
                        pad([row], np.array([0])).to(next(model.parameters()).device),
                        vocabs.bos,
                        vocabs.eos,
                        decode.max_len,
                        attention=True,
                    )
                    out.append(
                        Translation(
                            vocabs.text(ids[0]),
                            [vocabs.tgt_itos[i] for i in ids[0]],
                            maps[0] if maps else None,
                        )
                    )
        finally:
            if hasattr(model, "record_attention"):
                model.record_attention(False)
        return out

    translate.direction, translate.zh_tokens, translate.src_vocab = (
        vocabs.direction,
        vocabs.zh_tokens,
        vocabs.src_itos,
    )
    return translate


SEQ2SEQ = ModelSpec(
    "seq2seq",
    GRUParams,
    train_translator,
    load=load_translator,
    task="translation",
    shared=SHARED,
    races=True,
    about="GRU encoder-decoder, no attention: the decoder sees the encoder's summary vector only",
    libraries=("torch",),
)
SEQ2SEQ_ATTENTION = ModelSpec(
    "seq2seq_attention",
    AttentionParams,
    train_translator,
    load=load_translator,
    task="translation",
    shared=SHARED,
    races=True,
    about="GRU encoder-decoder with Bahdanau (additive) attention over the encoder's states",
    libraries=("torch",),
)
TRANSFORMER_MT = ModelSpec(
    "transformer_mt",
    TransformerParams,
    train_translator,
    load=load_translator,
    task="translation",
    shared=SHARED,
    races=True,
    about="Transformer encoder-decoder, sinusoidal positions, label smoothing, beam search",
    libraries=("torch",),
)
SPECS = (SEQ2SEQ, SEQ2SEQ_ATTENTION, TRANSFORMER_MT)  # what the kind registers (`TaskKind.models`)
MODELS = {spec.name: spec for spec in SPECS}
