"""The `hf` model: any pretrained sequence-classification checkpoint (bert-base-chinese,
hfl/chinese-roberta-wwm-ext, hfl/chinese-macbert-base, ERNIE, XLM-R ...) fine-tuned on the cleaned
text through transformers' Auto classes and its fast tokenizer. Saved with `save_pretrained` (model
and tokenizer), so `AutoModelForSequenceClassification.from_pretrained(folder)` loads the result."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field

from tasks.core import Section
from tasks.models.base import ModelSpec, Predictor, TrainInputs, class_weight_tensor, label_ids
from tasks.util.hub import load_pretrained


class Params(Section):
    """The `train.hf` section: settings for base-size checkpoints (its own epochs and batch
    size)."""

    # a hub id (fetched into $HF_HOME where there is a network) or a local folder
    checkpoint: str = "bert-base-chinese"
    lr: float = Field(3e-5, gt=0)  # base-size encoders take 2e-5 to 5e-5
    epochs: int = Field(3, ge=1)
    patience: int = Field(2, ge=1)
    batch_size: int = Field(16, ge=1)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_len: int = Field(256, ge=8)  # tokens, [CLS] and [SEP] included
    # recompute activations in the backward pass: less memory, ~30% slower
    gradient_checkpointing: bool = False
    # train only the classification head on a frozen encoder (the course's linear probe)
    freeze_encoder: bool = False


def _tokenizer(checkpoint: str):
    from transformers import AutoTokenizer

    return load_pretrained(
        checkpoint,
        lambda src, local: AutoTokenizer.from_pretrained(
            src, local_files_only=local, use_fast=True
        ),
        "tokenizer",
    )


def _encode(tokenizer, texts: pd.Series, max_len: int) -> list[dict]:
    enc = tokenizer(texts.astype(str).tolist(), truncation=True, max_length=max_len)
    return [{k: enc[k][i] for k in enc.keys()} for i in range(len(texts))]


def _batches(rows: list[dict], tokenizer, y: np.ndarray | None, batch_size: int, rng=None):
    import torch

    from tasks.models.batching import length_buckets

    for chunk in length_buckets([r["input_ids"] for r in rows], batch_size, rng):
        batch = dict(tokenizer.pad([rows[i] for i in chunk], return_tensors="pt"))
        if y is not None:
            batch["labels"] = torch.as_tensor(y[chunk])
        yield chunk, batch


def probabilities(model, tokenizer, rows: list[dict], batch_size: int = 64) -> np.ndarray:
    import torch

    device = next(model.parameters()).device
    out = np.zeros((len(rows), model.config.num_labels), dtype=np.float32)
    with torch.no_grad():
        for chunk, batch in _batches(rows, tokenizer, None, batch_size):
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
            out[chunk] = torch.softmax(logits.float(), dim=-1).cpu().numpy()
    return out


def train_hf(inputs: TrainInputs) -> dict:
    """Fine-tune (or, with freeze_encoder, fit a head on) the checkpoint; save model and tokenizer
    to `hf/`."""
    import torch.nn.functional as F
    from transformers import AutoModelForSequenceClassification

    from tasks.classification.models.bert import quiet_transformers
    from tasks.models.devices import seed_everything
    from tasks.models.trainer import LoopConfig, Task, fit, validation_metrics

    p: Params = inputs.section
    quiet_transformers()
    tokenizer = _tokenizer(p.checkpoint)
    seed_everything(inputs.params.seed)
    labels = inputs.labels
    model = load_pretrained(
        p.checkpoint,
        lambda src, local: AutoModelForSequenceClassification.from_pretrained(
            src,
            local_files_only=local,
            num_labels=len(labels),
            id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)},
            ignore_mismatched_sizes=True,
        ),
        "model",
    )
    if p.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if p.freeze_encoder:
        for w in model.base_model.parameters():
            w.requires_grad_(False)
    x_train, y_train = (
        _encode(tokenizer, inputs.train["text"], p.max_len),
        label_ids(inputs.train, labels),
    )
    x_val, y_val = (
        _encode(tokenizer, inputs.validation["text"], p.max_len),
        label_ids(inputs.validation, labels),
    )
    weight = class_weight_tensor(y_train, len(labels)) if inputs.params.class_weights else None

    def batches(rng):
        for chunk, batch in _batches(x_train, tokenizer, y_train, p.batch_size, rng):
            yield len(chunk), batch

    def loss(m, b):
        logits = m(**{k: v for k, v in b.items() if k != "labels"}).logits
        return F.cross_entropy(
            logits.float(), b["labels"], weight=None if weight is None else weight.to(logits.device)
        )

    task = Task(
        batches,
        -(-len(x_train) // p.batch_size),
        loss,
        lambda m: validation_metrics(probabilities(m, tokenizer, x_val), y_val),
    )
    loop = LoopConfig.from_train(
        inputs.params, lr=p.lr, epochs=p.epochs, patience=p.patience, warmup_ratio=p.warmup_ratio
    )
    t0 = time.perf_counter()
    result = fit(inputs.name, model, task, loop, inputs.scratch, inputs.sink)
    folder = inputs.out / inputs.name
    model.save_pretrained(folder)  # safetensors
    tokenizer.save_pretrained(folder)
    (folder / "zhpipe.json").write_text(
        json.dumps({"labels": labels, "max_len": p.max_len}, ensure_ascii=False), encoding="utf-8"
    )
    return {
        "path": inputs.name,
        "kind": "hf",
        "checkpoint": p.checkpoint,
        "seconds": time.perf_counter() - t0,
        **result.summary(),
        "parameters": sum(w.numel() for w in model.parameters()),
        "trainable_parameters": sum(w.numel() for w in model.parameters() if w.requires_grad),
        **result.extra,
    }


def hf_predictor(folder: Path, device: str = "auto") -> Predictor:
    """Probabilities from a saved `hf/` folder (loaded from local files only)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tasks.models.devices import resolve_device

    meta = json.loads((folder / "zhpipe.json").read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True)
    model = model.to(resolve_device(device)).eval()

    def predict(df: pd.DataFrame) -> np.ndarray:
        return probabilities(model, tokenizer, _encode(tokenizer, df["text"], meta["max_len"]))

    return predict


SPEC = ModelSpec(
    "hf",
    Params,
    train_hf,
    load=hf_predictor,
    cost=3,
    shared=(
        "weight_decay",
        "grad_clip",
        "grad_accum",
        "device",
        "precision",
        "seed",
        "class_weights",
        "processes",
        "budget",
        "model_budget",
    ),
    races=True,
    about="a pretrained sequence-classification checkpoint (Auto classes, fast tokenizer on "
    "the text), fine-tuned",
    libraries=("torch", "transformers"),
)
