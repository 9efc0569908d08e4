"""The `bert` model: transformers' BertForSequenceClassification, from a pretrained checkpoint or
pretrained here (masked-LM on the train split's characters, vocabulary from the vocab stage), then
fine-tuned; with an optional lexicon adapter that adds the embed stage's word vectors to the
characters they cover."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from tasks.classification.models.pretraining import (
    encode_pairs,
    pretraining_metrics,
    sentence_pairs,
)
from tasks.core import Section
from tasks.errors import ConfigError
from tasks.models.base import NETWORK, ModelSpec, TrainInputs, class_weight_tensor, label_ids
from tasks.shared.as_is import original_rows
from tasks.util.hub import load_pretrained
from tasks.util.io import read_vocab
from tasks.util.vectors import WordVectors

if TYPE_CHECKING:  # annotations only: the heavy libraries are imported where they are used
    import torch

    from tasks.models.modules import LexiconBert

MAX_WORD_CHARS = 4  # the longest lexicon word matched against the text


class Params(Section):
    """The `train.bert` section."""

    # a hub id or local folder of a pretrained Chinese BERT (e.g. bert-base-chinese); None =
    # pretrain a small BERT here with masked-LM on the train split's characters, vocabulary from the
    # vocab stage
    checkpoint: str | None = None
    hidden_size: int = 192
    num_layers: int = 3
    num_heads: int = 3
    intermediate_size: int = 768
    dropout: float = 0.1
    max_len: int = 160  # characters, [CLS] and [SEP] included; covers ~80% of reviews whole
    # masked-LM epochs before fine-tuning (0 = fine-tune from random)
    pretrain_epochs: int = Field(8, ge=0)
    pretrain_lr: float = 1e-3
    mlm_probability: float = Field(0.15, gt=0, lt=1)  # of which 80% -> [MASK], 10% random, 10% kept
    # next-sentence prediction too (BERT's second pretraining task): pairs of the texts' own
    # clauses, half of them followed by their true next clause and half by one drawn from another
    # text; loss = MLM + NSP
    nsp: bool = False
    lr: float = 2e-4  # fine-tuning
    batch_size: int = 32
    # add attention-weighted Word2Vec vectors of the words covering each character
    word_adapter: bool = False
    # after which encoder layer (0-based, not the last) the adapter adds its vectors
    adapter_layer: int = Field(1, ge=0)
    max_words_per_char: int = Field(4, ge=1)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> Params:
        if self.checkpoint is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"bert.hidden_size ({self.hidden_size}) must be a multiple of bert.num_heads "
                f"({self.num_heads})"
            )
        if (
            self.checkpoint is None
            and self.word_adapter
            and self.adapter_layer >= self.num_layers - 1
        ):
            raise ValueError(
                f"bert.adapter_layer ({self.adapter_layer}) must be below the last layer "
                f"({self.num_layers - 1}): a later layer has to carry the words to [CLS]"
            )
        return self


def char_tokenizer(vocab_file: Path):
    """A BERT tokenizer over the vocab stage's character vocabulary (specials first, one id per
    character)."""
    from transformers import BertTokenizer

    itos = vocab_file.read_text(encoding="utf-8").split("\n")[:-1]
    return BertTokenizer(vocab={t: i for i, t in enumerate(itos)}, do_lower_case=False)


def encode_chars(tokenizer, chars: pd.Series, max_len: int) -> list[list[int]]:
    """[CLS] c1 ... cn [SEP] per text, from the space-separated `chars` column: token i+1 is
    character i."""
    return tokenizer(chars.tolist(), truncation=True, max_length=max_len)["input_ids"]


def lexicon_word_ids(
    chars: pd.Series, lexicon: dict[str, int], max_len: int, per_char: int
) -> list[np.ndarray]:
    """For each text, (tokens, per_char) ids of the lexicon words (2-4 characters) covering each
    character, longest first; aligned with `encode_chars` ([CLS] and [SEP] rows stay 0)."""
    out = []
    for line in chars:
        text = line.split()[: max_len - 2]
        ids = np.zeros((len(text) + 2, per_char), dtype=np.int64)
        found = [[] for _ in text]
        for size in range(MAX_WORD_CHARS, 1, -1):
            for start in range(len(text) - size + 1):
                word_id = lexicon.get("".join(text[start : start + size]))
                if word_id:
                    for pos in range(start, start + size):
                        found[pos].append(word_id)
        for pos, words in enumerate(found):
            words = words[:per_char]
            ids[pos + 1, : len(words)] = words
        out.append(ids)
    return out


def lexicon_from(vectors: WordVectors, word_itos: list[str]) -> tuple[dict[str, int], torch.Tensor]:
    """Multi-character vocabulary words that have a vector: word -> id (0 = none) and the vector
    matrix."""
    import torch

    found = [
        (w, v)
        for w in word_itos[2:]
        if 1 < len(w) <= MAX_WORD_CHARS and (v := vectors.get(w)) is not None
    ]
    matrix = torch.zeros((len(found) + 1, vectors.dim))
    for i, (_, v) in enumerate(found, start=1):
        matrix[i] = torch.from_numpy(np.array(v, dtype=np.float32))
    return {w: i for i, (w, _) in enumerate(found, start=1)}, matrix


def bert_batches(
    ids: list[list[int]],
    y: np.ndarray | None,
    words: list[np.ndarray] | None,
    batch_size: int,
    pad_id: int,
    rng: np.random.Generator | None = None,
):
    """Length-bucketed, dynamically padded batches: (row indices, {input_ids, attention_mask[,
    word_ids, labels]})."""
    import torch

    from tasks.models.batching import length_buckets, pad

    for chunk in length_buckets(ids, batch_size, rng):
        x = pad(ids, chunk, pad_id)
        batch = {"input_ids": x, "attention_mask": (x != pad_id).long()}
        if words is not None:
            batch["word_ids"] = pad(words, chunk)
        if y is not None:
            batch["labels"] = torch.as_tensor(y[chunk])
        yield chunk, batch


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    # "some weights are newly initialised" is expected for a new head
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def bert_config(p: Params, tokenizer, **extra):
    """The small BERT of `p` over the character vocabulary (`extra`: e.g. `num_labels`)."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=p.hidden_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        intermediate_size=p.intermediate_size,
        hidden_dropout_prob=p.dropout,
        attention_probs_dropout_prob=p.dropout,
        max_position_embeddings=max(512, p.max_len),
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def pretrain_mlm(
    texts: pd.Series,
    validation: pd.Series,
    tokenizer,
    p: Params,
    params,
    checkpoints: Path,
    tracker,
) -> tuple[Path, dict]:
    """Masked-LM pretraining of a small BERT (with `nsp`, next-sentence prediction too); returns the
    saved folder and a summary. 15% of characters are chosen, of which 80% become [MASK], 10% a
    random character and 10% stay (DataCollatorForLanguageModeling)."""
    from transformers import (
        BertForMaskedLM,
        BertForPreTraining,
        DataCollatorForLanguageModeling,
    )

    from tasks.models.devices import seed_everything
    from tasks.models.trainer import LoopConfig, Task, fit

    folder = checkpoints / "pretrained"
    config = bert_config(p, tokenizer)
    seed_everything(params.seed)
    model = BertForPreTraining(config) if p.nsp else BertForMaskedLM(config)
    collate = DataCollatorForLanguageModeling(tokenizer, mlm_probability=p.mlm_probability)
    fixed = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=p.mlm_probability, seed=params.seed
    )
    if p.nsp:
        train_rows, val_rows = (
            encode_pairs(tokenizer, sentence_pairs(texts, params.seed), p.max_len),
            encode_pairs(tokenizer, sentence_pairs(validation, params.seed + 1), p.max_len),
        )
    else:
        train_rows = [{"input_ids": ids} for ids in encode_chars(tokenizer, texts, p.max_len)]
        val_rows = [{"input_ids": ids} for ids in encode_chars(tokenizer, validation, p.max_len)]
    train_ids, val_ids = [r["input_ids"] for r in train_rows], [r["input_ids"] for r in val_rows]

    def masked(rows, chunk, collator):
        return collator([rows[i] for i in chunk])

    def batches(rng):
        for chunk, _ in bert_batches(
            train_ids, None, None, p.batch_size, tokenizer.pad_token_id, rng
        ):
            yield len(chunk), dict(masked(train_rows, chunk, collate))

    def validate(m) -> dict[str, float]:
        return pretraining_metrics(
            m,
            (
                masked(val_rows, chunk, fixed)
                for chunk, _ in bert_batches(val_ids, None, None, 64, tokenizer.pad_token_id)
            ),
            p.nsp,
        )

    task = Task(
        batches,
        steps_per_epoch=-(-len(train_ids) // p.batch_size),
        loss=lambda m, b: m(**b).loss,
        validate=validate,
    )
    cfg = LoopConfig.from_train(
        params,
        lr=p.pretrain_lr,
        epochs=p.pretrain_epochs,
        patience=max(params.patience, 2),
        warmup_ratio=0.1,
        monitor="val_mlm_loss",
        mode="min",
    )
    result = fit("bert_mlm", model, task, cfg, checkpoints / "mlm", tracker, prefix="mlm_")
    model.save_pretrained(folder)
    return folder, {
        "pretrain_history": result.history,
        "pretrain_seconds": result.seconds,
        "pretrain_samples_per_second": result.samples_per_second,
    }


def build_model(
    p: Params, num_labels: int, tokenizer, source: str | None, lexicon_vectors: torch.Tensor | None
):
    """The classifier: from `source` (a checkpoint, or the masked-LM folder) or, without one, from
    random weights."""
    from transformers import BertForSequenceClassification

    from tasks.models.modules import LexiconAdapter, LexiconBert

    if source is None:
        classifier = BertForSequenceClassification(bert_config(p, tokenizer, num_labels=num_labels))
    else:
        classifier = load_pretrained(
            source,
            lambda s, local: BertForSequenceClassification.from_pretrained(
                s, num_labels=num_labels, local_files_only=local
            ),
            "BERT checkpoint",
        )
    adapter = None
    if lexicon_vectors is not None:
        adapter = LexiconAdapter(lexicon_vectors, classifier.config.hidden_size, p.dropout)
    try:
        return LexiconBert(classifier, adapter, p.adapter_layer)
    except ValueError as e:
        raise ConfigError(f"train.bert: {e}") from e


def train_bert(inputs: TrainInputs) -> dict:
    """Pretrain (unless a checkpoint is given) and fine-tune; save a transformers folder to
    `bert/`."""
    import torch.nn.functional as F
    from transformers import AutoTokenizer

    from tasks.models.devices import seed_everything
    from tasks.models.trainer import LoopConfig, Task, fit, validation_metrics

    train, validation, labels, params, out = (
        inputs.train,
        inputs.validation,
        inputs.labels,
        inputs.params,
        inputs.out,
    )
    char_vocab, word_vocab = (
        inputs.vocab / "chars" / "vocab.txt",
        inputs.vocab / "words" / "vocab.txt",
    )
    vectors, checkpoints, tracker = inputs.vectors, inputs.scratch, inputs.sink
    quiet_transformers()
    p = params.bert
    summary: dict = {}
    if p.checkpoint:
        load = lambda s, local: AutoTokenizer.from_pretrained(s, local_files_only=local)
        tokenizer = load_pretrained(p.checkpoint, load, "BERT tokenizer")
        source = p.checkpoint
    else:
        tokenizer, source = char_tokenizer(char_vocab), None
        if p.pretrain_epochs:
            original = original_rows(train)
            folder, summary = pretrain_mlm(
                original["chars"], validation["chars"], tokenizer, p, params, checkpoints, tracker
            )
            source = str(folder)
    lexicon, lexicon_vectors = (
        lexicon_from(vectors, read_vocab(word_vocab)) if p.word_adapter else ({}, None)
    )
    seed_everything(params.seed)
    model = build_model(p, len(labels), tokenizer, source, lexicon_vectors)

    def inputs(df):
        ids = encode_chars(tokenizer, df["chars"], p.max_len)
        words = (
            lexicon_word_ids(df["chars"], lexicon, p.max_len, p.max_words_per_char)
            if p.word_adapter
            else None
        )
        return ids, words

    (x_train, w_train), y_train = inputs(train), label_ids(train, labels)
    (x_val, w_val), y_val = inputs(validation), label_ids(validation, labels)
    pad = tokenizer.pad_token_id

    def batches(rng):
        for chunk, batch in bert_batches(x_train, y_train, w_train, p.batch_size, pad, rng):
            yield len(chunk), batch

    def validate(m) -> dict[str, float]:
        return validation_metrics(bert_probs(m, x_val, w_val, pad), y_val)

    weight = class_weight_tensor(y_train, len(labels)) if params.class_weights else None

    def loss(m, b):
        logits, _ = m(b["input_ids"], b["attention_mask"], b.get("word_ids"))
        return F.cross_entropy(
            logits.float(), b["labels"], weight=None if weight is None else weight.to(logits.device)
        )

    task = Task(
        batches, steps_per_epoch=-(-len(x_train) // p.batch_size), loss=loss, validate=validate
    )
    result = fit(
        "bert",
        model,
        task,
        LoopConfig.from_train(params, lr=p.lr),
        checkpoints / "finetune",
        tracker,
    )
    save_bert(model, tokenizer, labels, p, lexicon, out / "bert")
    return {
        "path": "bert",
        "kind": "bert",
        "seconds": result.seconds + summary.get("pretrain_seconds", 0.0),
        "history": result.history,
        "best_epoch": result.best_epoch,
        "resumed_from_epoch": result.resumed_from_epoch,
        "device": result.device,
        "bf16": result.bf16,
        "precision": result.precision,
        "samples_per_second": result.samples_per_second,
        "parameters": sum(w.numel() for w in model.parameters()),
        **summary,
    }


def bert_probs(
    model: LexiconBert,
    ids: list[list[int]],
    words: list[np.ndarray] | None,
    pad_id: int,
    batch_size: int = 64,
) -> np.ndarray:
    """Class probabilities in row order."""
    import torch

    device = next(model.parameters()).device
    out = np.zeros((len(ids), model.classifier.config.num_labels), dtype=np.float32)
    with torch.no_grad():
        for chunk, batch in bert_batches(ids, None, words, batch_size, pad_id):
            logits, _ = model(**{k: v.to(device) for k, v in batch.items()})
            out[chunk] = torch.softmax(logits.float(), dim=1).cpu().numpy()
    return out


def save_bert(
    model: LexiconBert,
    tokenizer,
    labels: list[str],
    p: Params,
    lexicon: dict[str, int],
    folder: Path,
) -> None:
    """A transformers folder (config, weights, tokenizer) plus `zhpipe.json`, and the adapter when
    there is one."""
    import torch

    model.classifier.config.id2label = dict(enumerate(labels))
    model.classifier.config.label2id = {label: i for i, label in enumerate(labels)}
    model.classifier.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    meta = {
        "labels": labels,
        "max_len": p.max_len,
        "word_adapter": model.adapter is not None,
        "adapter_layer": p.adapter_layer,
        "max_words_per_char": p.max_words_per_char,
        "dropout": p.dropout,
    }
    (folder / "zhpipe.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    if model.adapter is not None:
        torch.save(
            {"state_dict": model.adapter.state_dict(), "lexicon": lexicon}, folder / "adapter.pt"
        )


def load_bert(
    folder: Path, device: str = "auto"
) -> tuple[LexiconBert, object, dict, dict[str, int]]:
    """The model, tokenizer, metadata and lexicon saved by `save_bert`."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from tasks.models.devices import resolve_device
    from tasks.models.modules import LexiconAdapter, LexiconBert

    quiet_transformers()
    meta = json.loads((folder / "zhpipe.json").read_text(encoding="utf-8"))
    classifier = BertForSequenceClassification.from_pretrained(folder, local_files_only=True)
    adapter, lexicon = None, {}
    if meta["word_adapter"]:
        # tensors and plain data only
        saved = torch.load(folder / "adapter.pt", map_location="cpu", weights_only=True)
        lexicon = saved["lexicon"]
        adapter = LexiconAdapter(
            saved["state_dict"]["words.weight"], classifier.config.hidden_size, meta["dropout"]
        )
        adapter.load_state_dict(saved["state_dict"])
    model = (
        LexiconBert(classifier, adapter, meta["adapter_layer"]).to(resolve_device(device)).eval()
    )
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True), meta, lexicon


def bert_predictor(folder: Path, device: str = "auto"):
    """Probabilities from a saved `bert/` folder, columns in label order."""
    model, tokenizer, meta, lexicon = load_bert(folder, device)

    def predict(df: pd.DataFrame) -> np.ndarray:
        ids = encode_chars(tokenizer, df["chars"], meta["max_len"])
        words = (
            lexicon_word_ids(df["chars"], lexicon, meta["max_len"], meta["max_words_per_char"])
            if meta["word_adapter"]
            else None
        )
        return bert_probs(model, ids, words, tokenizer.pad_token_id)

    return predict


SPEC = ModelSpec(
    "bert",
    Params,
    train_bert,
    load=bert_predictor,
    uses_vectors=True,
    shared=NETWORK,
    cost=3,
    races=True,
    about="BERT over characters: fine-tuned from a checkpoint, or masked-LM pretrained here; "
    "optional "
    "lexicon adapter",
    libraries=("torch", "transformers"),
)
