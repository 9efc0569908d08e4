"""The NER taggers on a GPU: `bilstm_crf` and `lexicon_tagger` (the lexicon adapter) trained on the
Resume NER train split, on the CPU in fp32 and on CUDA in fp32, bf16 autocast and fp16 with a
gradient scaler, through the model registry as the train stage trains them. Each GPU training must
reach the CPU's best validation entity F1 within a tolerance, and its saved model, loaded onto the
GPU, must tag the test split as well as the CPU's tags it. Prints a table of seconds, samples/second
and F1 per model, device and precision; exits 1 when a check fails.

    # on any machine: the resume-ner pipeline to its embed stage, the taggers' inputs copied
    # into DIR (a few MB)
    python benchmarks/gpu_ner_check.py --prepare DIR
    python benchmarks/gpu_ner_check.py --inputs DIR [--epochs 3] [--tolerance 0.03] [--out FILE]

The second needs only PyTorch with CUDA, pydantic, pandas, pyarrow, gensim and jieba: no Prefect, no
MLflow.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODELS_CHECKED = ("bilstm_crf", "lexicon_tagger")
RUNS = (("cpu", "fp32"), ("cuda", "fp32"), ("cuda", "bf16"), ("cuda", "fp16"))


def prepare(folder: Path) -> None:
    """The resume-ner stages up to embed into a scratch store, and what the taggers read copied out
    of it."""
    store = Path(tempfile.mkdtemp(prefix="zhpipe-ner-inputs-"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "run",
            "resume-ner",
            "--to",
            "embed",
            "--storage",
            str(store),
        ],
        cwd=ROOT,
        check=True,
    )

    def only(stage: str) -> Path:
        (found,) = [
            p for p in (store / stage).iterdir() if p.is_dir() and not p.name.startswith(".")
        ]
        return found

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(only("augment") / "train.parquet", folder / "train.parquet")
    for split in ("validation", "test"):
        shutil.copy(only("segment") / f"{split}.parquet", folder / f"{split}.parquet")
    for stage in ("vocab", "embed"):
        shutil.copytree(only(stage), folder / stage, dirs_exist_ok=True)
    shutil.rmtree(store)
    print(
        f"inputs in {folder} "
        f"({sum(p.stat().st_size for p in folder.rglob('*') if p.is_file()) / 1e6:.1f} MB)"
    )


def train_one(name: str, device: str, precision: str, inputs: Path, epochs: int, frames) -> dict:
    import torch

    from flows.plan.config import load_pipeline
    from tasks.models import TrainInputs
    from tasks.ner.tagged import entity_f1
    from tasks.stages import MODELS

    train, validation, test = frames
    sets = [f"train.device={device}", f"train.precision={precision}"]
    sets += [f"train.{name}.{key}={epochs}" for key in ("epochs", "patience")]
    params = load_pipeline("resume-ner", overrides=sets).stages.train
    spec = MODELS[name]
    labels = sorted({t.split("-", 1)[1] for tags in train["tags"] for t in tags if t != "O"})
    out = Path(tempfile.mkdtemp(prefix=f"zhpipe-{name}-"))
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    summary = spec.train(
        TrainInputs(
            name,
            train,
            validation,
            labels,
            spec.view(params),
            inputs / "vocab",
            None,
            out,
            out / "ckpt",
            embed=inputs / "embed",
        )
    )
    seconds = time.perf_counter() - t0
    from tasks.ner.models import tagger_from

    tag = tagger_from(out / name, device=device)
    t1 = time.perf_counter()
    tagged = tag(test["text"].astype(str).tolist())
    tag_seconds = time.perf_counter() - t1
    scores = entity_f1([list(t) for t in test["tags"]], [t.tags for t in tagged])
    shutil.rmtree(out, ignore_errors=True)
    return {
        "model": name,
        "device": device,
        "precision": summary.get("precision", precision),
        "seconds": round(seconds, 1),
        "samples_per_second": round(float(summary.get("samples_per_second") or 0), 1),
        "val_f1_best": round(max(h["val_f1"] for h in summary["history"]), 4),
        "test_f1": round(scores["f1"], 4),
        "tag_seconds": round(tag_seconds, 2),
        "ran_on": summary.get("device"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", type=Path, metavar="DIR")
    parser.add_argument("--inputs", type=Path, metavar="DIR")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return 0
    import pandas as pd
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this check needs one")
        return 1
    frames = [
        pd.read_parquet(args.inputs / f"{split}.parquet")
        for split in ("train", "validation", "test")
    ]
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {len(frames[0])} train, "
        f"{len(frames[1])} validation, "
        f"{len(frames[2])} test sentences, {args.epochs} epochs",
        flush=True,
    )
    rows, failed = [], 0
    for name in MODELS_CHECKED:
        for device, precision in RUNS:
            try:
                row = train_one(name, device, precision, args.inputs, args.epochs, frames)
            except Exception as e:  # noqa: BLE001 - a failure is a row of the table and exit 1
                row = {
                    "model": name,
                    "device": device,
                    "precision": precision,
                    "error": f"{type(e).__name__}: {e}"[:300],
                }
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
    print(
        f"\n{'model':15s} {'device':6s} {'precision':10s} {'s':>7s} {'samples/s':>10s} "
        f"{'val F1':>7s} {'test F1':>7s}  check"
    )
    for row in rows:
        cpu = next(r for r in rows if r["model"] == row["model"] and r["device"] == "cpu")
        if "error" in row:
            failed += 1
            print(
                f"{row['model']:15s} {row['device']:6s} {row['precision']:10s} FAIL {row['error']}"
            )
            continue
        ok = (
            "error" not in cpu
            and row["ran_on"].startswith(row["device"])
            and (
                row["device"] == "cpu"
                or (
                    row["val_f1_best"] >= cpu["val_f1_best"] - args.tolerance
                    and row["test_f1"] >= cpu["test_f1"] - args.tolerance
                )
            )
        )
        failed += not ok
        print(
            f"{row['model']:15s} {row['device']:6s} {row['precision']:10s} {row['seconds']:7.1f} "
            f"{row['samples_per_second']:10.1f} "
            f"{row['val_f1_best']:7.4f} {row['test_f1']:7.4f}  {'ok' if ok else 'FAIL'}"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, ensure_ascii=False, indent=1))
    print(f"{len(rows) - failed} of {len(rows)} runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
