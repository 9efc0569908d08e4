"""Training throughput (samples/second) of every model, through the train stage's own functions, on
the CPU and, when there is one, on the GPU (bf16 autocast) with the GPU/CPU ratio. Medians over
--epochs epochs.

    python benchmarks/bench_train.py [--rows 2048] [--epochs 3] [--models textcnn,bert] \\
        [--devices cpu,cuda]
                                     [--out benchmarks/results/train_throughput.json]

Inputs: the first --rows bundled reviews (label-balanced), segmented by the segment stage's
Segmenter, with vocabularies built as the vocab stage does and a 1-epoch Word2Vec. Model sizes are
those of the `full` pipeline.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd
import torch
from rich.console import Console
from rich.table import Table

from flows.plan import project

# Prefect's home and start-up timeout, before Prefect is imported
project.activate(project.Project(ROOT))
from flows.plan.config import load_pipeline
from tasks.classification.vocab import Params as VocabConfig
from tasks.shared.segment import Params as SegmentConfig

console = Console()
MODELS = ("tfidf_lr", "fasttext", "textcnn", "bilstm", "transformer", "bert", "rnn_lm")
TORCH_MODELS = {"textcnn", "bilstm", "transformer", "bert", "rnn_lm"}


def corpus(rows: int, folder: Path) -> pd.DataFrame:
    """Balanced reviews with words/chars columns, plus vocab files and Word2Vec vectors in
    `folder`."""
    from gensim.models import Word2Vec

    from tasks.classification.vocab import count_tokens
    from tasks.util.segmenter import Segmenter
    from tasks.util.text import build_vocab

    raw = pd.read_csv(ROOT / "data" / "raw" / "ChnSentiCorp_htl_all.csv").dropna()
    raw = raw.groupby("label").head(rows // 2).sample(frac=1.0, random_state=0)
    texts = raw["review"].astype(str).tolist()
    df = pd.DataFrame(
        {
            "text": texts,
            **Segmenter(SegmentConfig()).rows(texts),
            "label": raw["label"].astype(str).tolist(),
            "aug_method": "original",
        }
    )
    for kind in ("words", "chars"):
        (folder / kind).mkdir(parents=True, exist_ok=True)
        vocab = build_vocab(count_tokens(df[kind]), VocabConfig())
        (folder / kind / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    w2v = Word2Vec(
        [s.split() for s in df["words"]], vector_size=128, min_count=2, epochs=1, workers=2, seed=1
    )
    w2v.wv.save_word2vec_format(str(folder / "word2vec.bin"), binary=True)
    return df


def throughput(name: str, df: pd.DataFrame, params, folder: Path) -> dict[str, float]:
    """Median training samples/second of one model (the summary the train stage itself reports);
    bert gives its masked-LM pretraining (`bert_mlm`) and its fine-tuning."""
    from tasks.models import TrainInputs
    from tasks.stages import MODELS
    from tasks.util.vectors import load_word_vectors

    out = Path(tempfile.mkdtemp(dir=folder))
    labels = sorted(df["label"].unique())
    spec = MODELS[name]
    vectors = load_word_vectors(folder, "word2vec") if spec.uses_vectors else None
    summary = spec.train(
        TrainInputs(name, df, df.head(256), labels, params, folder, vectors, out, out / "ckpt")
    )
    if name == "bert":
        return {
            "bert_mlm": summary["pretrain_samples_per_second"],
            "bert": summary["samples_per_second"],
        }
    return {name: summary["samples_per_second"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument(
        "--epochs",
        type=int,
        default=3,
        help="epochs per model; the median epoch's throughput is reported",
    )
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "train_throughput.json"
    )
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="zhpipe-bench-train-"))
    # models, vectors and checkpoints (about 70 MB)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    t0 = time.perf_counter()
    df = corpus(args.rows, folder)
    console.print(
        f"corpus: {len(df)} reviews, segmented in {time.perf_counter() - t0:.1f} s; torch "
        f"{torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    models, devices = args.models.split(","), args.devices.split(",")
    results: dict[str, dict[str, float]] = {}
    for name in models:
        for device in devices if name in TORCH_MODELS else ["cpu"]:
            # the full pipeline's model sizes; every model for the same number of epochs, no early
            # stop
            params = load_pipeline(
                "full",
                overrides=[
                    f"train.epochs={args.epochs}",
                    f"train.patience={args.epochs}",
                    f"train.device={device}",
                    f"train.bert.pretrain_epochs={args.epochs}",
                ],
            ).stages.train
            t = time.perf_counter()
            for row, value in throughput(name, df, params, folder).items():
                results.setdefault(row, {})[device] = value
                console.print(
                    f"  {row} on {device}: {value:.0f} samples/s ({time.perf_counter() - t:.0f} s)"
                )
    table = Table(
        title=f"training throughput, samples/s (median of {args.epochs} epochs; {len(df)} reviews)"
    )
    for col in ["model", *devices] + (["gpu/cpu"] if "cuda" in devices else []):
        table.add_column(col, justify="right" if col != "model" else "left")
    for name, by_device in results.items():
        cells = [f"{by_device[d]:.0f}" if d in by_device else "-" for d in devices]
        if "cuda" in devices:
            cells.append(
                f"{by_device['cuda'] / by_device['cpu']:.1f}x" if "cuda" in by_device else "-"
            )
        table.add_row(name, *cells)
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "rows": len(df),
                "epochs": args.epochs,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                "samples_per_second": results,
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    console.print(f"written: {args.out}")


if __name__ == "__main__":
    main()
