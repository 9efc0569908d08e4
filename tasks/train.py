"""Stage `train`: the classifiers and language models named in `train.models`."""
from __future__ import annotations

import json
import math
import random
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
from tqdm.auto import tqdm

from flows.config import TrainConfig
from flows.errors import DataError
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult
from flows.tracking import Tracker
from tasks.embed import FASTTEXT_MIN_THREADS, fasttext_call
from tasks.models import BiLSTMAttention, BiLSTMConfig, TextCNN, TextCNNConfig
from tasks.ngram import lm_classifier_predictor, train_lm_classifier, train_ngram_lm
from tasks.tfidf import tfidf_predictor, train_tfidf_lr
from tasks.vocab import read_vocab

VERSION = "4"
Predictor = Callable[[pd.DataFrame], np.ndarray]  # frame with words/chars -> (rows, classes) probabilities


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when present, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


# ---------------------------------------------------------------- TextCNN


def encode(lines: pd.Series, vocab: dict[str, int], max_len: int) -> list[list[int]]:
    """Token ids per line, truncated to max_len; unknown tokens map to [UNK] (id 1)."""
    return [[vocab.get(t, 1) for t in line.split()[:max_len]] or [1] for line in lines]


def batches(ids: list[list[int]], y: np.ndarray | None, batch_size: int, shuffle: bool, rng: np.random.Generator | None = None):
    """Padded (ids, labels) tensors; batches are filled with rows of similar length to cut padding."""
    order = np.argsort([len(x) for x in ids], kind="stable")
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if shuffle:
        rng.shuffle(chunks)
    for chunk in chunks:
        width = max(len(ids[i]) for i in chunk)
        x = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            x[row, : len(ids[i])] = torch.tensor(ids[i])
        yield chunk, x, (torch.as_tensor(y[chunk]) if y is not None else None)


def pretrained_matrix(itos: list[str], kv, dim: int, seed: int) -> tuple[torch.Tensor, float]:
    """Embedding matrix: Word2Vec vectors where the word has one, small random vectors elsewhere, zero [PAD]."""
    gen = torch.Generator().manual_seed(seed)
    matrix = torch.randn((len(itos), dim), generator=gen) * 0.1
    hits = 0
    for i, token in enumerate(itos):
        if token in kv.key_to_index:
            matrix[i] = torch.from_numpy(kv[token].copy())
            hits += 1
    matrix[0] = 0
    return matrix, hits / len(itos)


def predict_logits(model: torch.nn.Module, ids: list[list[int]], batch_size: int, device: torch.device) -> np.ndarray:
    model.eval()
    out = np.zeros((len(ids), model.config.num_classes), dtype=np.float32)
    with torch.no_grad():
        for chunk, x, _ in batches(ids, None, batch_size, shuffle=False):
            out[chunk] = torch.softmax(model(x.to(device))[0], dim=1).cpu().numpy()
    return out


def warmup_linear_decay(optimizer, params: TrainConfig, steps_per_epoch: int):
    """Learning rate: linear warm-up over `warmup_ratio` of all steps, then linear decay to 0."""
    total = max(1, steps_per_epoch * params.epochs)
    warmup = int(params.warmup_ratio * total)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / max(warmup, 1), max(0.0, (total - step) / max(total - warmup, 1)))
    )


def class_weight_tensor(y: np.ndarray, num_classes: int) -> torch.Tensor:
    """Inverse class frequency, normalised so a balanced corpus gets weight 1 everywhere."""
    counts = np.bincount(y, minlength=num_classes).astype(np.float32)
    return torch.from_numpy(len(y) / (num_classes * np.maximum(counts, 1)))


# name -> (config dataclass, module, the config's fields taken from the pipeline section)
NETWORKS = {
    "textcnn": (TextCNNConfig, TextCNN, ("kernel_sizes", "num_filters", "dropout", "freeze_embeddings")),
    "bilstm": (BiLSTMConfig, BiLSTMAttention, ("hidden_size", "num_layers", "dropout", "freeze_embeddings")),
}


def train_network(
    kind: str, train: pd.DataFrame, validation: pd.DataFrame, labels: list[str], params: TrainConfig,
    vocab_file: Path, kv_file: Path, out: Path, tracker: Tracker,
) -> dict:
    """Train a PyTorch network with early stopping on validation macro-F1; save the best to `<kind>/model.pt`."""
    from gensim.models import KeyedVectors

    p, device = getattr(params, kind), resolve_device(params.device)
    config_cls, module_cls, fields = NETWORKS[kind]
    seed_everything(params.seed)
    itos = read_vocab(vocab_file)
    stoi = {t: i for i, t in enumerate(itos)}
    kv = KeyedVectors.load(str(kv_file))
    embeddings, coverage = pretrained_matrix(itos, kv, kv.vector_size, params.seed)
    config = config_cls(vocab_size=len(itos), num_classes=len(labels), embed_dim=kv.vector_size,
                        **{f: getattr(p, f) for f in fields})
    model = module_cls(config, embeddings).to(device)
    x_train, y_train = encode(train["words"], stoi, p.max_len), label_ids(train, labels)
    trainable = [w for w in model.parameters() if w.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=p.lr, weight_decay=params.weight_decay)
    scheduler = warmup_linear_decay(optimizer, params, steps_per_epoch=math.ceil(len(x_train) / p.batch_size / params.grad_accum))
    weight = class_weight_tensor(y_train, len(labels)).to(device) if params.class_weights else None
    x_val, y_val = encode(validation["words"], stoi, p.max_len), label_ids(validation, labels)
    rng = np.random.default_rng(params.seed)
    folder = out / kind
    folder.mkdir()
    best, best_epoch, stale, history, t_start = -1.0, 0, 0, [], time.perf_counter()
    for epoch in range(1, params.epochs + 1):
        model.train()
        t0, total, seen = time.perf_counter(), 0.0, 0
        bar = tqdm(total=len(x_train), desc=f"{kind} epoch {epoch}/{params.epochs}", unit="row", leave=False, mininterval=2)
        n_batches = math.ceil(len(x_train) / p.batch_size)
        for i, (chunk, x, y) in enumerate(batches(x_train, y_train, p.batch_size, shuffle=True, rng=rng)):
            logits, _ = model(x.to(device))
            loss = F.cross_entropy(logits, y.to(device), weight=weight)
            (loss / params.grad_accum).backward()
            if (i + 1) % params.grad_accum == 0 or i + 1 == n_batches:
                if params.grad_clip:
                    torch.nn.utils.clip_grad_norm_(trainable, params.grad_clip)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            total += loss.item() * len(chunk)
            seen += len(chunk)
            bar.update(len(chunk))
        bar.close()
        probs = predict_logits(model, x_val, 256, device)
        pred = probs.argmax(1)
        val_loss = float(-np.log(np.clip(probs[np.arange(len(y_val)), y_val], 1e-9, 1)).mean())
        row = {
            "epoch": epoch,
            "train_loss": total / seen,
            "val_loss": val_loss,
            "val_accuracy": float(accuracy_score(y_val, pred)),
            "val_macro_f1": float(f1_score(y_val, pred, average="macro")),
            "samples_per_second": seen / (time.perf_counter() - t0),
            "lr": scheduler.get_last_lr()[0],
        }
        history.append(row)
        tracker.metrics({f"{kind}_{k}": v for k, v in row.items() if k != "epoch"}, step=epoch)
        if row["val_macro_f1"] > best:
            best, best_epoch, stale = row["val_macro_f1"], epoch, 0
            torch.save(
                {"kind": kind, "config": asdict(config), "state_dict": model.state_dict(), "vocab": itos, "labels": labels,
                 "max_len": p.max_len, "epoch": epoch, "val_macro_f1": best},
                folder / "model.pt",
            )
        else:
            stale += 1
            if stale >= params.patience:
                break
    seconds = time.perf_counter() - t_start
    return {
        "path": kind, "kind": kind, "seconds": seconds, "history": history, "best_epoch": best_epoch,
        "embedding_coverage": coverage, "device": str(device),
        "samples_per_second": float(np.median([h["samples_per_second"] for h in history])),
    }


def network_predictor(folder: Path, device: str = "auto") -> Predictor:
    """Probabilities from a saved network checkpoint (kind, config, vocabulary and labels are inside it)."""
    ckpt = torch.load(folder / "model.pt", map_location="cpu", weights_only=False)
    dev = resolve_device(device)
    config_cls, module_cls, _ = NETWORKS[ckpt["kind"]]
    model = module_cls(config_cls(**ckpt["config"])).to(dev)
    model.load_state_dict(ckpt["state_dict"])
    stoi = {t: i for i, t in enumerate(ckpt["vocab"])}

    def predict(df: pd.DataFrame) -> np.ndarray:
        return predict_logits(model, encode(df["words"], stoi, ckpt["max_len"]), 256, dev)

    return predict


PREDICTORS: dict[str, Callable[[Path], Predictor]] = {
    "fasttext": fasttext_predictor, "textcnn": network_predictor, "bilstm": network_predictor, "tfidf_lr": tfidf_predictor,
    "lm_classifier": lm_classifier_predictor,
}


def build(ctx: BuildContext) -> BuildOutput:
    """Train every configured model; write `<model>/` folders and `models.json`."""
    p: TrainConfig = ctx.params
    labels = ctx.input_info["augment"].get("labels")
    if not labels:
        raise DataError("train: the corpus has no labels (source.label_column is unset); classifiers need labelled data")
    train = pd.read_parquet(ctx.inputs["augment"] / "train.parquet")
    validation = pd.read_parquet(ctx.inputs["segment"] / "validation.parquet")
    models = {}
    for name in p.models:
        if name == "fasttext":
            models[name] = train_fasttext(train, labels, p, ctx.out)
        elif name == "tfidf_lr":
            models[name] = train_tfidf_lr(train, labels, p.tfidf_lr, p.seed, ctx.out)
        elif name == "ngram_lm":
            models[name] = train_ngram_lm(train, validation, p.ngram_lm, ctx.out)
            continue  # a language model: no classification metrics
        elif name == "lm_classifier":
            models[name] = train_lm_classifier(train, labels, p.lm_classifier, ctx.out)
        else:
            models[name] = train_network(
                name, train, validation, labels, p, ctx.inputs["vocab"] / "words" / "vocab.txt",
                ctx.inputs["embed"] / "word2vec.kv", ctx.out, ctx.tracker,
            )
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
