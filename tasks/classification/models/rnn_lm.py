"""The `rnn_lm` model: an LSTM language model over the vocab stage's words (or characters),
evaluated by perplexity like `ngram_lm`."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from tasks.core import Section
from tasks.models.base import LOOP, ModelSpec, TrainInputs
from tasks.util.io import Rows, batches_of, read_vocab

if TYPE_CHECKING:  # annotations only: the heavy libraries are imported where they are used
    from tasks.classification.models.encoded import Encoded
    from tasks.models.modules import LSTMLanguageModel

BOS_EOS = "[SEP]"  # the vocabulary's [SEP] marks both the start and the end of a text


class Params(Section):
    """The `train.rnn_lm` section: an LSTM language model with an adaptive softmax."""

    embed_dim: int = 128
    hidden_size: int = 256
    num_layers: int = 1
    dropout: float = 0.3
    # adaptive softmax: frequency ranks where cheaper output clusters start
    cutoffs: list[int] = [2000, 10000]
    tokens: Literal["words", "chars"] = "words"
    max_len: int = 256
    lr: float = 2e-3
    batch_size: int = 32


def _lm_config(p, vocab_size: int):
    """The LSTM language model of a section (`train.rnn_lm`; `train.lm_classifier`'s per class)."""
    from tasks.models.modules import RNNLMConfig

    return RNNLMConfig(
        vocab_size=vocab_size,
        embed_dim=p.embed_dim,
        hidden_size=p.hidden_size,
        num_layers=p.num_layers,
        dropout=p.dropout,
        cutoffs=p.cutoffs,
    )


def lm_sequences(lines: pd.Series, stoi: dict[str, int], max_len: int) -> list[list[int]]:
    """[SEP] t1 ... tn [SEP] per text (n <= max_len); unknown tokens are [UNK] (id 1)."""
    sep = stoi[BOS_EOS]
    return [[sep, *(stoi.get(t, 1) for t in line.split()[:max_len]), sep] for line in lines]


def lm_batches(
    seqs: list[list[int]] | Encoded, batch_size: int, rng: np.random.Generator | None = None
):
    """Length-bucketed batches of (inputs, next-token targets), padded with 0; from a list of
    sequences or an encoded split (a buffer at a time)."""
    from tasks.classification.models.encoded import Encoded
    from tasks.models.batching import length_buckets, pad

    batches = (
        seqs.epoch(batch_size, rng)
        if isinstance(seqs, Encoded)
        else ((seqs, c, None) for c in length_buckets(seqs, batch_size, rng))
    )
    for buffer, chunk, _ in batches:
        padded = pad(buffer, chunk)
        # the last column holds only a final [SEP] or padding: nothing to predict from it
        yield len(chunk), {"ids": padded[:, :-1], "targets": padded[:, 1:]}


def perplexity(
    model: LSTMLanguageModel, seqs: list[list[int]] | Encoded, batch_size: int = 64
) -> float:
    """exp of the mean negative log-likelihood per predicted token (the end [SEP] included, as </s>
    for n-grams)."""
    total, count = _nll(model, seqs, batch_size)
    return math.exp(total / max(count, 1))


def _nll(
    model: LSTMLanguageModel, seqs: list[list[int]] | Encoded, batch_size: int = 64
) -> tuple[float, int]:
    """The summed negative log-likelihood of the predicted tokens, and their number."""
    import torch

    device = next(model.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for _, batch in lm_batches(seqs, batch_size):
            logp, _ = model(batch["ids"].to(device), batch["targets"].to(device))
            total, count = total - logp.float().sum().item(), count + logp.numel()
    return total, count


def _originals(batch: pd.DataFrame) -> pd.Series:
    """The rows as in the corpus (`original_rows`), as a mask."""
    return (
        batch["aug_method"] == "original"
        if "aug_method" in batch
        else pd.Series(True, index=batch.index)
    )


def train_rnn_lm(inputs: TrainInputs) -> dict:
    """Fit on the original (not augmented) train rows with early stopping on validation perplexity;
    save `rnn_lm/`."""
    import torch

    from tasks.classification.models.encoded import encode_split
    from tasks.models.devices import seed_everything
    from tasks.models.modules import LSTMLanguageModel
    from tasks.models.trainer import LoopConfig, Task, fit

    train, validation, params, out = inputs.train, inputs.validation, inputs.params, inputs.out
    vocab_root, checkpoints, tracker = inputs.vocab, inputs.scratch, inputs.sink
    p: Params = inputs.section
    itos = read_vocab(vocab_root / p.tokens / "vocab.txt")
    stoi = {t: i for i, t in enumerate(itos)}
    sequences = lambda batch: lm_sequences(batch[p.tokens], stoi, p.max_len)
    # the splits' ids on disk, read a buffer at a time (encoded.py): memory does not grow with the
    # corpus
    x_train = encode_split(
        train, checkpoints / "encoded" / "train", sequences, keep=_originals, columns=[p.tokens]
    )
    x_val = encode_split(
        validation, checkpoints / "encoded" / "validation", sequences, columns=[p.tokens]
    )
    seed_everything(params.seed)
    config = _lm_config(p, len(itos))
    model = LSTMLanguageModel(config)
    task = Task(
        lambda rng: lm_batches(x_train, p.batch_size, rng),
        steps_per_epoch=x_train.steps(p.batch_size),
        loss=lambda m, b: m(b["ids"], b["targets"])[1],
        validate=lambda m: {"val_perplexity": perplexity(m, x_val)},
    )
    result = fit(
        "rnn_lm",
        model,
        task,
        LoopConfig.from_train(params, lr=p.lr, monitor="val_perplexity", mode="min"),
        checkpoints,
        tracker,
    )
    folder = out / "rnn_lm"
    folder.mkdir()
    torch.save(
        {
            "config": asdict(config),
            "state_dict": model.state_dict(),
            "vocab": itos,
            "tokens": p.tokens,
            "max_len": p.max_len,
        },
        folder / "model.pt",
    )
    best = result.history[result.best_epoch - 1]
    return {
        "path": "rnn_lm",
        "kind": "lm",
        "seconds": result.seconds,
        **result.summary(),
        "val_perplexity": best["val_perplexity"],
    }


def rnn_lm_perplexity(folder: Path, df: pd.DataFrame | Rows, device: str = "auto") -> float:
    """Perplexity of a split's texts (a frame, or a `Rows` read a batch at a time) under a saved
    `rnn_lm/`."""
    import torch

    from tasks.models.devices import resolve_device
    from tasks.models.modules import LSTMLanguageModel, RNNLMConfig

    # tensors and plain data only
    saved = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    model = LSTMLanguageModel(RNNLMConfig(**saved["config"]))
    model.load_state_dict(saved["state_dict"])
    model.to(resolve_device(device)).eval()
    stoi = {t: i for i, t in enumerate(saved["vocab"])}
    total, count = 0.0, 0
    for batch in batches_of(df, [saved["tokens"]]):
        nll, n = _nll(model, lm_sequences(batch[saved["tokens"]], stoi, saved["max_len"]))
        total, count = total + nll, count + n
    return math.exp(total / max(count, 1))


SPEC = ModelSpec(
    "rnn_lm",
    Params,
    train_rnn_lm,
    perplexity=rnn_lm_perplexity,
    shared=LOOP,
    streams=True,
    races=True,
    about="an LSTM language model with an adaptive softmax; scored by test perplexity",
    libraries=("torch",),
)


class ClassifierParams(Params):
    """The `train.rnn_lm_classifier` section: one LSTM language model per class (the rnn_lm
    settings); a text goes to the class whose model gives it the highest likelihood, times the class
    prior."""


def _lm(config_dict: dict):
    from tasks.models.modules import LSTMLanguageModel, RNNLMConfig

    return LSTMLanguageModel(RNNLMConfig(**config_dict))


def text_log_likelihoods(
    model: LSTMLanguageModel, seqs: list[list[int]], batch_size: int = 64
) -> np.ndarray:
    """Each text's total log-probability under the model (all its predicted tokens, the end [SEP]
    included)."""
    import torch

    from tasks.models.batching import length_buckets, pad

    device = next(model.parameters()).device
    out = np.zeros(len(seqs))
    with torch.no_grad():
        for chunk in length_buckets(seqs, batch_size):
            padded = pad(seqs, chunk).to(device)
            ids, targets = padded[:, :-1], padded[:, 1:]
            logp, _ = model(ids, targets)
            rows = (
                torch.arange(len(chunk), device=device)
                .unsqueeze(1)
                .expand_as(targets)[targets != 0]
            )
            out[chunk] = (
                torch.zeros(len(chunk), device=device)
                .index_add_(0, rows, logp.float())
                .cpu()
                .numpy()
            )
    return out


def train_lm_classifier(inputs: TrainInputs) -> dict:
    """One LSTM language model per class on that class's original train rows, each early-stopped on
    the perplexity of its class's validation rows; saved as `rnn_lm_classifier/<class
    index>/model.pt`."""
    import json

    import torch

    from tasks.classification.models.encoded import encode_split
    from tasks.models.devices import seed_everything
    from tasks.models.trainer import LoopConfig, Task, fit

    p: ClassifierParams = inputs.section
    itos = read_vocab(inputs.vocab / p.tokens / "vocab.txt")
    stoi = {t: i for i, t in enumerate(itos)}
    sequences = lambda batch: lm_sequences(batch[p.tokens], stoi, p.max_len)
    folder = inputs.out / inputs.name
    config = _lm_config(p, len(itos))
    sizes, seconds, history = [], 0.0, []
    for i, label in enumerate(inputs.labels):
        # this class's original train rows and validation rows, on disk
        # (tasks.classification.models.encoded)
        encoded = inputs.scratch / str(i) / "encoded"
        x_train = encode_split(
            inputs.train,
            encoded / "train",
            sequences,
            keep=lambda b, c=label: _originals(b) & (b["label"] == c),
            columns=[p.tokens, "label"],
        )
        x_val = encode_split(
            inputs.validation,
            encoded / "validation",
            sequences,
            keep=lambda b, c=label: b["label"] == c,
            columns=[p.tokens, "label"],
        )
        # a class without validation rows: its model is early-stopped on all of them
        if not len(x_val):
            x_val = encode_split(
                inputs.validation, encoded / "validation", sequences, columns=[p.tokens]
            )
        seed_everything(inputs.params.seed + i)
        model = _lm(asdict(config))
        task = Task(
            lambda rng, x=x_train: lm_batches(x, p.batch_size, rng),
            steps_per_epoch=max(1, x_train.steps(p.batch_size)),
            loss=lambda m, b: m(b["ids"], b["targets"])[1],
            validate=lambda m, x=x_val: {"val_perplexity": perplexity(m, x)},
        )
        result = fit(
            f"{inputs.name}_{i}",
            model,
            task,
            LoopConfig.from_train(inputs.params, lr=p.lr, monitor="val_perplexity", mode="min"),
            inputs.scratch / str(i),
            inputs.sink,
        )
        (folder / str(i)).mkdir(parents=True)
        torch.save(
            {"config": asdict(config), "state_dict": model.state_dict()},
            folder / str(i) / "model.pt",
        )
        sizes.append(len(x_train))
        seconds += result.seconds
        history.append(
            {
                "label": label,
                "best_epoch": result.best_epoch,
                "val_perplexity": result.history[result.best_epoch - 1]["val_perplexity"],
            }
        )
    priors = [n / sum(sizes) for n in sizes]
    (folder / "config.json").write_text(
        json.dumps(
            {
                "labels": inputs.labels,
                "priors": priors,
                "vocab": itos,
                "tokens": p.tokens,
                "max_len": p.max_len,
            },
            ensure_ascii=False,
        ),
        encoding="utf-8",
    )
    return {
        "path": inputs.name,
        "kind": "lm_classifier",
        "seconds": seconds,
        "per_class": history,
        "samples_per_second": sum(sizes) / max(seconds, 1e-9),
    }


def lm_classifier_predictor(folder: Path, device: str = "auto"):
    """Class probabilities: softmax over classes of (text log-likelihood under the class's model +
    log prior)."""
    import json

    import torch

    from tasks.models.devices import resolve_device

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    stoi = {t: i for i, t in enumerate(config["vocab"])}
    models = []
    for i in range(len(config["labels"])):
        # tensors and plain data only
        saved = torch.load(folder / str(i) / "model.pt", map_location="cpu", weights_only=True)
        model = _lm(saved["config"])
        model.load_state_dict(saved["state_dict"])
        models.append(model.to(resolve_device(device)).eval())
    log_prior = np.log(np.array(config["priors"]))

    def predict(df: pd.DataFrame) -> np.ndarray:
        seqs = lm_sequences(df[config["tokens"]], stoi, config["max_len"])
        scores = np.stack([text_log_likelihoods(m, seqs) for m in models], axis=1) + log_prior
        scores -= scores.max(1, keepdims=True)
        probs = np.exp(scores)
        return probs / probs.sum(1, keepdims=True)

    return predict


CLASSIFIER = ModelSpec(
    "rnn_lm_classifier",
    ClassifierParams,
    train_lm_classifier,
    load=lm_classifier_predictor,
    shared=LOOP,
    streams=True,
    races=True,
    about="one LSTM language model per class; the class whose model gives the text the highest "
    "likelihood wins",
    libraries=("torch",),
)
