"""Stage `train`: the classifiers and language models named in `train.models`."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from prefect import task
from prefect.cache_policies import NO_CACHE
from sklearn.metrics import accuracy_score, f1_score

from flows.config import LANGUAGE_MODELS, TrainConfig
from flows.errors import DataError
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult
from flows.tracking import Tracker
from tasks.embed import FASTTEXT_MIN_THREADS, WordVectors, fasttext_call, load_word_vectors
from tasks.bert import bert_batches, bert_predictor, encode_chars, lexicon_word_ids, load_bert, train_bert
from tasks.models import (
    BiLSTMAttention, BiLSTMConfig, Probabilities, TextCNN, TextCNNConfig, TransformerClassifier, TransformerConfig,
)
from tasks.ngram import lm_classifier_predictor, lm_perplexity, train_lm_classifier, train_ngram_lm
from tasks.rnnlm import rnn_lm_perplexity, train_rnn_lm
from tasks.tfidf import tfidf_predictor, train_tfidf_lr
from tasks.trainer import LoopConfig, Task, fit, length_buckets, pad, resolve_device, seed_everything, validation_metrics
from tasks.vocab import read_vocab

VERSION = "5"
Predictor = Callable[[pd.DataFrame], np.ndarray]  # frame with words/chars -> (rows, classes) probabilities


def label_ids(df: pd.DataFrame, labels: list[str]) -> np.ndarray:
    index = {label: i for i, label in enumerate(labels)}
    return df["label"].map(index).to_numpy(dtype=np.int64)


# ---------------------------------------------------------------- fastText supervised


def _fasttext_line(row, tokens: str) -> str:
    if tokens == "words":
        return row.words
    if tokens == "chars":
        return row.chars
    return f"{row.words} {row.chars}"  # words and characters together: robust to segmentation errors


def train_fasttext(train: pd.DataFrame, labels: list[str], params: TrainConfig, out: Path) -> dict:
    """Train and save `fasttext/model.bin`; return its summary."""
    import fasttext

    p = params.fasttext
    folder = out / "fasttext"
    folder.mkdir()
    # fastText reads its file in order and does not shuffle: the corpus is sorted by label, so without
    # this the last class seen dominates (test accuracy fell to 0.55-0.79 in our runs)
    train = train.sample(frac=1.0, random_state=params.seed)
    ids = label_ids(train, labels)
    train_file = folder / "train.txt"
    train_file.write_text(
        "".join(f"__label__{i} {_fasttext_line(r, p.tokens)}\n" for i, r in zip(ids, train.itertuples())), encoding="utf-8"
    )
    t0 = time.perf_counter()
    model = fasttext_call(
        lambda: fasttext.train_supervised(
            str(train_file), epoch=p.epoch, lr=p.lr, wordNgrams=p.word_ngrams, dim=p.dim, minn=p.minn, maxn=p.maxn,
            bucket=p.bucket, thread=FASTTEXT_MIN_THREADS, verbose=0,
        ),
        "train.fasttext",
        f"lower train.fasttext.lr (now {p.lr}) or raise bucket (now {p.bucket})",
    )
    seconds = time.perf_counter() - t0
    train_file.unlink()
    model.save_model(str(folder / "model.bin"))
    (folder / "config.json").write_text(json.dumps({"labels": labels, **p.model_dump()}, ensure_ascii=False), encoding="utf-8")
    return {"path": "fasttext", "kind": "fasttext", "seconds": seconds, "history": [], "samples_per_second": len(train) * p.epoch / seconds}


def fasttext_predictor(folder: Path) -> Predictor:
    """Probabilities from a saved fastText classifier, columns in label order."""
    import fasttext

    model = fasttext.load_model(str(folder / "model.bin"))
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    n = len(cfg["labels"])

    def predict(df: pd.DataFrame) -> np.ndarray:
        lines = [_fasttext_line(r, cfg["tokens"]) for r in df.itertuples()]
        got_labels, got_probs = model.predict(lines, k=n)
        probs = np.zeros((len(lines), n), dtype=np.float32)
        for i, (ls, ps) in enumerate(zip(got_labels, got_probs)):
            for label, prob in zip(ls, ps):
                probs[i, int(label.removeprefix("__label__"))] = prob
        return probs

    return predict


# ---------------------------------------------------------------- PyTorch networks (TextCNN, BiLSTM, Transformer)


def encode(lines: pd.Series, vocab: dict[str, int], max_len: int) -> list[list[int]]:
    """Token ids per line, truncated to max_len; unknown tokens map to [UNK] (id 1)."""
    return [[vocab.get(t, 1) for t in line.split()[:max_len]] or [1] for line in lines]


def batches(ids: list[list[int]], y: np.ndarray | None, batch_size: int, shuffle: bool, rng: np.random.Generator | None = None):
    """Padded (ids, labels) tensors; batches are filled with rows of similar length to cut padding."""
    for chunk in length_buckets(ids, batch_size, rng if shuffle else None):
        yield chunk, pad(ids, chunk), (torch.as_tensor(y[chunk]) if y is not None else None)


def pretrained_matrix(itos: list[str], vectors: WordVectors, seed: int) -> tuple[torch.Tensor, float]:
    """Embedding matrix: pretrained vectors where the token has one, small random vectors elsewhere, zero [PAD];
    and the share of tokens that had one."""
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


def predict_logits(model: torch.nn.Module, ids: list[list[int]], batch_size: int, device: torch.device) -> np.ndarray:
    model.eval()
    out = np.zeros((len(ids), model.config.num_classes), dtype=np.float32)
    with torch.no_grad():
        for chunk, x, _ in batches(ids, None, batch_size, shuffle=False):
            out[chunk] = torch.softmax(model(x.to(device))[0].float(), dim=1).cpu().numpy()
    return out


def class_weight_tensor(y: np.ndarray, num_classes: int) -> torch.Tensor:
    """Inverse class frequency, normalised so a balanced corpus gets weight 1 everywhere."""
    counts = np.bincount(y, minlength=num_classes).astype(np.float32)
    return torch.from_numpy(len(y) / (num_classes * np.maximum(counts, 1)))


# name -> (config dataclass, module, the config's fields taken from the pipeline section)
NETWORKS = {
    "textcnn": (TextCNNConfig, TextCNN, ("kernel_sizes", "num_filters", "dropout", "freeze_embeddings")),
    "bilstm": (BiLSTMConfig, BiLSTMAttention, ("hidden_size", "num_layers", "dropout", "freeze_embeddings")),
    "transformer": (TransformerConfig, TransformerClassifier, ("num_heads", "num_layers", "ff_dim", "dropout", "freeze_embeddings")),
}


def network_config(kind: str, section, itos: list[str], num_classes: int, embed_dim: int):
    """The model's config dataclass from its pipeline section."""
    config_cls, _, fields = NETWORKS[kind]
    extra = {}
    if kind == "transformer":
        if "[CLS]" not in itos:
            raise DataError("train.transformer: the word vocabulary has no [CLS] token; keep it in vocab.specials")
        extra = {"max_len": section.max_len + 1, "cls_id": itos.index("[CLS]")}  # + the [CLS] position
    return config_cls(vocab_size=len(itos), num_classes=num_classes, embed_dim=embed_dim,
                      **{f: getattr(section, f) for f in fields}, **extra)


def embedding_matrix(section, itos: list[str], vectors: WordVectors, seed: int) -> tuple[torch.Tensor, float, int]:
    """Embeddings from the embed stage's vectors; a transformer whose d_model differs from them starts from random."""
    dim = getattr(section, "d_model", None) or vectors.dim
    if dim != vectors.dim:
        return torch.randn((len(itos), dim), generator=torch.Generator().manual_seed(seed)) * 0.02, 0.0, dim
    matrix, coverage = pretrained_matrix(itos, vectors, seed)
    return matrix, coverage, dim


def train_network(
    kind: str, train: pd.DataFrame, validation: pd.DataFrame, labels: list[str], params: TrainConfig,
    vocab_file: Path, vectors: WordVectors, out: Path, checkpoints: Path, tracker: Tracker | None,
) -> dict:
    """Train a PyTorch network with early stopping on validation macro-F1; save the best to `<kind>/model.pt`."""
    p = getattr(params, kind)
    seed_everything(params.seed)
    itos = read_vocab(vocab_file)
    stoi = {t: i for i, t in enumerate(itos)}
    embeddings, coverage, dim = embedding_matrix(p, itos, vectors, params.seed)
    config = network_config(kind, p, itos, len(labels), dim)
    model = NETWORKS[kind][1](config, embeddings)
    x_train, y_train = encode(train["words"], stoi, p.max_len), label_ids(train, labels)
    x_val, y_val = encode(validation["words"], stoi, p.max_len), label_ids(validation, labels)
    weight = class_weight_tensor(y_train, len(labels)) if params.class_weights else None

    def loss(m, b):
        logits, _ = m(b["ids"])
        return F.cross_entropy(logits, b["labels"], weight=None if weight is None else weight.to(logits.device))

    def validate(m) -> dict[str, float]:
        return validation_metrics(predict_logits(m, x_val, 256, next(m.parameters()).device), y_val)

    def epoch_batches(rng):
        for chunk, x, y in batches(x_train, y_train, p.batch_size, shuffle=True, rng=rng):
            yield len(chunk), {"ids": x, "labels": y}

    task = Task(epoch_batches, steps_per_epoch=math.ceil(len(x_train) / p.batch_size), loss=loss, validate=validate)
    result = fit(kind, model, task, LoopConfig.from_train(params, lr=p.lr), checkpoints, tracker)
    folder = out / kind
    folder.mkdir()
    best = result.history[result.best_epoch - 1]
    torch.save({"kind": kind, "config": asdict(config), "state_dict": model.state_dict(), "vocab": itos, "labels": labels,
                "max_len": p.max_len, "epoch": result.best_epoch, "val_macro_f1": best["val_macro_f1"]}, folder / "model.pt")
    return {
        "path": kind, "kind": kind, "seconds": result.seconds, "history": result.history, "best_epoch": result.best_epoch,
        "resumed_from_epoch": result.resumed_from_epoch, "embeddings": vectors.name, "embedding_coverage": coverage,
        "device": result.device,
        "bf16": result.bf16, "samples_per_second": result.samples_per_second,
        "parameters": sum(w.numel() for w in model.parameters()),
    }


def load_network(folder: Path, device: str = "auto") -> tuple[torch.nn.Module, dict]:
    """A saved network in eval mode and its checkpoint (kind, config, vocabulary and labels are inside it)."""
    ckpt = torch.load(folder / "model.pt", map_location="cpu", weights_only=False)
    config_cls, module_cls, _ = NETWORKS[ckpt["kind"]]
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


def servable_model(name: str, folder: Path, df: pd.DataFrame) -> tuple[torch.nn.Module, np.ndarray] | None:
    """A saved PyTorch classifier as `Probabilities` (ids in, probabilities out) and an input example built
    from `df`'s first rows; None for models that are not PyTorch."""
    rows = df.head(2)
    if name in NETWORKS:
        model, ckpt = load_network(folder, "cpu")
        ids = encode(rows["words"], {t: i for i, t in enumerate(ckpt["vocab"])}, ckpt["max_len"])
        return Probabilities(model).eval(), next(batches(ids, None, len(ids), shuffle=False))[1].numpy()
    if name == "bert":
        model, tokenizer, meta, lexicon = load_bert(folder, "cpu")
        ids = encode_chars(tokenizer, rows["chars"], meta["max_len"])
        words = lexicon_word_ids(rows["chars"], lexicon, meta["max_len"], meta["max_words_per_char"]) if meta["word_adapter"] else None
        batch = next(bert_batches(ids, None, words, len(ids), tokenizer.pad_token_id))[1]
        parts = [batch["input_ids"].unsqueeze(-1)] + ([batch["word_ids"]] if words is not None else [])
        return Probabilities(model, tokenizer.pad_token_id).eval(), torch.cat(parts, dim=-1).numpy()
    return None


PREDICTORS: dict[str, Callable[[Path], Predictor]] = {
    "fasttext": fasttext_predictor, "textcnn": network_predictor, "bilstm": network_predictor,
    "transformer": network_predictor, "bert": bert_predictor, "tfidf_lr": tfidf_predictor, "lm_classifier": lm_classifier_predictor,
}
# language models: name -> perplexity of a frame's texts under the saved model
PERPLEXITY: dict[str, Callable[[Path, pd.DataFrame], float]] = {"ngram_lm": lm_perplexity, "rnn_lm": rnn_lm_perplexity}


def build(ctx: BuildContext) -> BuildOutput:
    """Train every configured model; write `<model>/` folders and `models.json`."""
    p: TrainConfig = ctx.params
    labels = ctx.input_info["augment"].get("labels")
    if not labels:
        raise DataError("train: the corpus has no labels (source.label_column is unset); classifiers need labelled data")
    train = pd.read_parquet(ctx.inputs["augment"] / "train.parquet")
    validation = pd.read_parquet(ctx.inputs["segment"] / "validation.parquet")
    models = {}
    vectors = load_word_vectors(ctx.inputs["embed"], p.embeddings) if set(p.models) & (set(NETWORKS) | {"bert"}) else None
    for name in p.models:
        if name == "fasttext":
            models[name] = train_fasttext(train, labels, p, ctx.out)
        elif name == "tfidf_lr":
            models[name] = train_tfidf_lr(train, labels, p.tfidf_lr, p.seed, ctx.out)
        elif name == "ngram_lm":
            models[name] = train_ngram_lm(train, validation, p.ngram_lm, ctx.out)
        elif name == "rnn_lm":
            models[name] = train_rnn_lm(train, validation, p, ctx.inputs["vocab"], ctx.out, ctx.scratch / name, ctx.tracker)
        elif name == "lm_classifier":
            models[name] = train_lm_classifier(train, labels, p.lm_classifier, ctx.out)
        elif name == "bert":
            models[name] = train_bert(
                train, validation, labels, p, ctx.inputs["vocab"] / "chars" / "vocab.txt", ctx.inputs["vocab"] / "words" / "vocab.txt",
                vectors, ctx.out, ctx.scratch / name, ctx.tracker,
            )
        else:
            models[name] = train_network(
                name, train, validation, labels, p, ctx.inputs["vocab"] / "words" / "vocab.txt",
                vectors, ctx.out, ctx.scratch / name, ctx.tracker,
            )
        if name in LANGUAGE_MODELS:
            continue  # no classification metrics
        val = PREDICTORS[name](ctx.out / name)(validation).argmax(1)
        models[name]["val_accuracy"] = float(accuracy_score(label_ids(validation, labels), val))
        models[name]["val_macro_f1"] = float(f1_score(label_ids(validation, labels), val, average="macro"))
    (ctx.out / "models.json").write_text(json.dumps(models, indent=2), encoding="utf-8")
    keys = ("val_accuracy", "val_macro_f1", "val_perplexity", "seconds", "samples_per_second")
    metrics = {f"{m}_{k}": v[k] for m, v in models.items() for k in keys if k in v}
    return BuildOutput(rows=len(train), metrics=metrics, info={"labels": labels, "models": models})


@task(name="train", cache_policy=NO_CACHE)
def train(run: RunContext, augment: StageResult, segment: StageResult, vocab: StageResult, embed: StageResult) -> StageResult:
    """Train the configured classifiers."""
    return run.run("train", {"augment": augment, "segment": segment, "vocab": vocab, "embed": embed}, build)
