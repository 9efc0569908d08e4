"""The word networks `textcnn`, `bilstm` and `transformer`: token ids from the vocab stage's word
vocabulary, embeddings from the embed stage's vectors, trained by the shared loop
(tasks.models.trainer)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tasks.core import Section
from tasks.errors import DataError
from tasks.models.base import NETWORK, ModelSpec, Predictor, TrainInputs, class_weight_tensor
from tasks.util.io import read_vocab
from tasks.util.vectors import WordVectors

if TYPE_CHECKING:  # annotations only: the heavy libraries are imported where they are used
    import torch

    from tasks.classification.models.encoded import Encoded


class TextCNNParams(Section):
    """The `train.textcnn` section: Kim's TextCNN."""

    kernel_sizes: list[int] = [2, 3, 4]
    num_filters: int = 128
    dropout: float = 0.5
    max_len: int = 256  # tokens; covers > 95% of reviews
    freeze_embeddings: bool = False
    lr: float = 1e-3
    batch_size: int = 64


class BiLSTMParams(Section):
    """The `train.bilstm` section: a BiLSTM pooled by additive attention."""

    hidden_size: int = 128  # per direction
    num_layers: int = 1
    dropout: float = 0.3
    max_len: int = 256
    freeze_embeddings: bool = False
    lr: float = 2e-3
    batch_size: int = 64


class TransformerParams(Section):
    """The `train.transformer` section: a Transformer encoder classifier."""

    # None = the Word2Vec vector size, so the embed stage's vectors fit as they are
    d_model: int | None = None
    num_heads: int = 4
    num_layers: int = 2
    ff_dim: int = 256
    dropout: float = 0.1
    max_len: int = 256
    freeze_embeddings: bool = False
    lr: float = 5e-4
    batch_size: int = 64


def encode(lines: pd.Series, vocab: dict[str, int], max_len: int) -> list[list[int]]:
    """Token ids per line, truncated to max_len; unknown tokens map to [UNK] (id 1)."""
    return [[vocab.get(t, 1) for t in line.split()[:max_len]] or [1] for line in lines]


def batches(
    ids: list[list[int]],
    y: np.ndarray | None,
    batch_size: int,
    shuffle: bool,
    rng: np.random.Generator | None = None,
):
    """Padded (ids, labels) tensors; batches are filled with rows of similar length to cut
    padding."""
    import torch

    from tasks.models.batching import length_buckets, pad

    for chunk in length_buckets(ids, batch_size, rng if shuffle else None):
        yield chunk, pad(ids, chunk), (torch.as_tensor(y[chunk]) if y is not None else None)


def pretrained_matrix(
    itos: list[str], vectors: WordVectors, seed: int
) -> tuple[torch.Tensor, float]:
    """Embedding matrix: pretrained vectors where the token has one, small random vectors elsewhere,
    zero [PAD]; and the share of tokens that had one."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    matrix = torch.randn((len(itos), vectors.dim), generator=gen) * 0.1
    hits = 0
    for i, token in enumerate(itos[2:], start=2):  # [PAD] and [UNK] stay as they are
        vector = vectors.get(token)
        if vector is not None:
            matrix[i] = torch.from_numpy(np.array(vector, dtype=np.float32))
            hits += 1
    matrix[0] = 0
    return matrix, hits / len(itos)


def predict_logits(
    model: torch.nn.Module, ids: list[list[int]], batch_size: int, device: torch.device
) -> np.ndarray:
    import torch

    model.eval()
    out = np.zeros((len(ids), model.config.num_classes), dtype=np.float32)
    with torch.no_grad():
        for chunk, x, _ in batches(ids, None, batch_size, shuffle=False):
            out[chunk] = torch.softmax(model(x.to(device))[0].float(), dim=1).cpu().numpy()
    return out


def predict_encoded(
    model: torch.nn.Module, data: Encoded, batch_size: int, device: torch.device
) -> np.ndarray:
    """Probabilities for every row of an encoded split, a buffer at a time."""
    out = np.zeros((len(data), model.config.num_classes), dtype=np.float32)
    for seqs, _, rows in data.buffers():
        out[rows] = predict_logits(model, seqs, batch_size, device)
    return out


def networks() -> dict:
    """name -> (config dataclass, module, the config's fields taken from the pipeline section);
    PyTorch is imported here, when a network is built or loaded, not when the model table is
    read."""
    from tasks.models.modules import (
        BiLSTMAttention,
        BiLSTMConfig,
        TextCNN,
        TextCNNConfig,
        TransformerClassifier,
        TransformerConfig,
    )

    return {
        "textcnn": (
            TextCNNConfig,
            TextCNN,
            ("kernel_sizes", "num_filters", "dropout", "freeze_embeddings"),
        ),
        "bilstm": (
            BiLSTMConfig,
            BiLSTMAttention,
            ("hidden_size", "num_layers", "dropout", "freeze_embeddings"),
        ),
        "transformer": (
            TransformerConfig,
            TransformerClassifier,
            ("num_heads", "num_layers", "ff_dim", "dropout", "freeze_embeddings"),
        ),
    }


def network_config(kind: str, section, itos: list[str], num_classes: int, embed_dim: int):
    """The model's config dataclass from its pipeline section."""
    config_cls, _, fields = networks()[kind]
    extra = {}
    if kind == "transformer":
        if "[CLS]" not in itos:
            raise DataError(
                "train.transformer: the word vocabulary has no [CLS] token; keep it in "
                "vocab.specials"
            )
        # + the [CLS] position
        extra = {"max_len": section.max_len + 1, "cls_id": itos.index("[CLS]")}
    return config_cls(
        vocab_size=len(itos),
        num_classes=num_classes,
        embed_dim=embed_dim,
        **{f: getattr(section, f) for f in fields},
        **extra,
    )


def embedding_matrix(
    section, itos: list[str], vectors: WordVectors, seed: int
) -> tuple[torch.Tensor, float, int]:
    """Embeddings from the embed stage's vectors; a transformer whose d_model differs from them
    starts from random."""
    import torch

    dim = getattr(section, "d_model", None) or vectors.dim
    if dim != vectors.dim:
        return (
            torch.randn((len(itos), dim), generator=torch.Generator().manual_seed(seed)) * 0.02,
            0.0,
            dim,
        )
    matrix, coverage = pretrained_matrix(itos, vectors, seed)
    return matrix, coverage, dim


def train_network(inputs: TrainInputs) -> dict:
    """Train a PyTorch network with early stopping on validation macro-F1; save the best to
    `<kind>/model.pt`."""
    import torch
    import torch.nn.functional as F

    from tasks.classification.models.encoded import encode_split
    from tasks.models.batching import pad
    from tasks.models.devices import seed_everything
    from tasks.models.trainer import LoopConfig, Task, fit, validation_metrics

    kind, train, validation, labels, params = (
        inputs.name,
        inputs.train,
        inputs.validation,
        inputs.labels,
        inputs.params,
    )
    vocab_file, vectors, out, checkpoints, tracker = (
        inputs.vocab / "words" / "vocab.txt",
        inputs.vectors,
        inputs.out,
        inputs.scratch,
        inputs.sink,
    )
    p = inputs.section
    seed_everything(params.seed)
    itos = read_vocab(vocab_file)
    stoi = {t: i for i, t in enumerate(itos)}
    embeddings, coverage, dim = embedding_matrix(p, itos, vectors, params.seed)
    config = network_config(kind, p, itos, len(labels), dim)
    model = networks()[kind][1](config, embeddings)
    # the splits' ids on disk, read a buffer at a time (encoded.py): memory does not grow with the
    # corpus
    words = lambda batch: encode(batch["words"], stoi, p.max_len)
    x_train = encode_split(
        train, checkpoints / "encoded" / "train", words, labels, columns=["words"]
    )
    x_val = encode_split(
        validation, checkpoints / "encoded" / "validation", words, labels, columns=["words"]
    )
    weight = class_weight_tensor(x_train.labels, len(labels)) if params.class_weights else None

    def loss(m, b):
        logits, _ = m(b["ids"])
        return F.cross_entropy(
            logits, b["labels"], weight=None if weight is None else weight.to(logits.device)
        )

    def validate(m) -> dict[str, float]:
        return validation_metrics(
            predict_encoded(m, x_val, 256, next(m.parameters()).device), x_val.labels
        )

    def epoch_batches(rng):
        for seqs, chunk, y in x_train.epoch(p.batch_size, rng):
            yield len(chunk), {"ids": pad(seqs, chunk), "labels": torch.as_tensor(y)}

    task = Task(
        epoch_batches, steps_per_epoch=x_train.steps(p.batch_size), loss=loss, validate=validate
    )
    result = fit(kind, model, task, LoopConfig.from_train(params, lr=p.lr), checkpoints, tracker)
    folder = out / kind
    folder.mkdir()
    best = result.history[result.best_epoch - 1]
    torch.save(
        {
            "kind": kind,
            "config": asdict(config),
            "state_dict": model.state_dict(),
            "vocab": itos,
            "labels": labels,
            "max_len": p.max_len,
            "epoch": result.best_epoch,
            "val_macro_f1": best["val_macro_f1"],
        },
        folder / "model.pt",
    )
    return {
        "path": kind,
        "kind": kind,
        "seconds": result.seconds,
        "history": result.history,
        "best_epoch": result.best_epoch,
        "resumed_from_epoch": result.resumed_from_epoch,
        "embeddings": vectors.name,
        "embedding_coverage": coverage,
        "device": result.device,
        "bf16": result.bf16,
        "precision": result.precision,
        "samples_per_second": result.samples_per_second,
        "parameters": sum(w.numel() for w in model.parameters()),
        **result.extra,
    }


def load_network(folder: Path, device: str = "auto") -> tuple[torch.nn.Module, dict]:
    """A saved network in eval mode and its checkpoint (kind, config, vocabulary and labels are
    inside it)."""
    import torch

    from tasks.models.devices import resolve_device

    # tensors and plain data only
    ckpt = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    config_cls, module_cls, _ = networks()[ckpt["kind"]]
    model = module_cls(config_cls(**ckpt["config"]))
    model.load_state_dict(ckpt["state_dict"])
    return model.to(resolve_device(device)).eval(), ckpt


def network_predictor(folder: Path, device: str = "auto") -> Predictor:
    """Probabilities from a saved network checkpoint."""
    model, ckpt = load_network(folder, device)
    stoi = {t: i for i, t in enumerate(ckpt["vocab"])}
    dev = next(model.parameters()).device

    def predict(df: pd.DataFrame) -> np.ndarray:
        return predict_logits(model, encode(df["words"], stoi, ckpt["max_len"]), 256, dev)

    return predict


def _spec(name: str, params: type[Section], about: str) -> ModelSpec:
    return ModelSpec(
        name,
        params,
        train_network,
        load=network_predictor,
        uses_vectors=True,
        shared=NETWORK,
        streams=True,
        races=True,
        about=about,
        libraries=("torch", "gensim"),
    )


TEXTCNN = _spec(
    "textcnn",
    TextCNNParams,
    "Kim's TextCNN: 1-D convolutions of widths 2-4, max-pooled; starts from word vectors",
)
BILSTM = _spec(
    "bilstm",
    BiLSTMParams,
    "a BiLSTM pooled by additive attention over non-padding steps; starts from word vectors",
)
TRANSFORMER = _spec(
    "transformer",
    TransformerParams,
    "a pre-norm Transformer encoder with a [CLS] token; starts from word vectors",
)
