"""The GPU paths that no CPU test reaches, checked on a CUDA machine: every PyTorch classifier and
two translators train on the GPU in each precision (fp32, bf16 autocast, fp16 with a gradient
scaler) and learn as on the CPU; a saved model predicts on the GPU as its validation said; a
training killed on the GPU resumes there; data-parallel training starts NCCL; asking for more
training processes than GPUs is one clear error. Prints a table of samples/second and validation
scores per model, device and precision; exits 1 when a check fails.

    python benchmarks/gpu_check.py [--rows 2048] [--epochs 3] [--models textcnn,bilstm,...] \\
        [--out FILE]

Inputs: those of bench_train.py (bundled reviews, the `full` pipeline's model sizes) and the test
suite's Tatoeba pairs for the translators (tests/fixtures/mt/pairs.tsv).
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import ROOT, console, corpus  # noqa: E402  (activates the project first)

from flows.plan.config import load_pipeline
from tasks.errors import ConfigError
from tasks.models import (
    MODELS,
    TrainInputs,
    trainer,
)

CLASSIFIERS = ("textcnn", "bilstm", "transformer", "bert", "rnn_lm")
checks: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str) -> None:
    checks.append((name, bool(ok), detail))
    console.print(f"[{'green' if ok else 'red'}]{'ok  ' if ok else 'FAIL'}[/] {name}: {detail}")


def train_params(device: str, precision: str, epochs: int):
    sets = [
        f"train.epochs={epochs}",
        f"train.patience={epochs}",
        f"train.device={device}",
        f"train.precision={precision}",
        f"train.bert.pretrain_epochs={epochs}",
    ]
    return load_pipeline("full", overrides=sets).stages.train


def classify(
    name: str, df: pd.DataFrame, folder: Path, params, scratch: Path | None = None
) -> tuple[dict, Path]:
    """Train one classifier through the registry, as the train stage does; its summary and saved
    folder."""
    from tasks.util.vectors import load_word_vectors

    out = Path(tempfile.mkdtemp(dir=folder))
    spec = MODELS[name]
    vectors = load_word_vectors(folder, "word2vec") if spec.uses_vectors else None
    labels = sorted(df["label"].unique())
    summary = spec.train(
        TrainInputs(
            name,
            df,
            df.head(256),
            labels,
            spec.view(params),
            folder,
            vectors,
            out,
            scratch or out / "ckpt",
        )
    )
    return summary, out / summary["path"]


def score(name: str, summary: dict) -> tuple[str, float]:
    best = summary["history"][summary["best_epoch"] - 1]
    key = "val_perplexity" if name == "rnn_lm" else "val_accuracy"
    return key, best[key]


def precisions(
    models: list[str], df: pd.DataFrame, folder: Path, epochs: int, rows: list[dict]
) -> None:
    """Every classifier on the CPU (fp32) and on the GPU in fp32, bf16 and fp16: it runs where
    asked, in the precision asked, learns, scores as on the CPU, and its saved model predicts on the
    GPU as its validation said."""
    for name in models:
        reference = None
        for device, precision in (
            ("cpu", "fp32"),
            ("cuda", "fp32"),
            ("cuda", "bf16"),
            ("cuda", "fp16"),
        ):
            t = time.perf_counter()
            summary, saved = classify(name, df, folder, train_params(device, precision, epochs))
            key, value = score(name, summary)
            history = summary["history"]
            rows.append(
                {
                    "model": name,
                    "device": device,
                    "precision": precision,
                    "samples_per_second": summary["samples_per_second"],
                    key: value,
                    "first_loss": history[0]["train_loss"],
                    "last_loss": history[-1]["train_loss"],
                    "seconds": time.perf_counter() - t,
                }
            )
            console.print(
                f"  {name} {device} {precision}: {summary['samples_per_second']:.0f} samples/s, "
                f"{key} {value:.3f}"
            )
            if device == "cpu":
                reference = value
                continue
            want = {"fp32": "fp32", "bf16": "bfloat16", "fp16": "float16"}[precision]
            where = f"{name} on cuda, {precision}"
            check(
                f"{where}: device and precision",
                summary["device"].startswith("cuda") and summary.get("precision") == want,
                f"ran on {summary['device']} in {summary.get('precision')}",
            )
            check(
                f"{where}: learns",
                history[-1]["train_loss"] < history[0]["train_loss"],
                f"train loss {history[0]['train_loss']:.3f} -> {history[-1]['train_loss']:.3f}",
            )
            # accuracy within two standard errors of the difference of two accuracies on the same
            # 256 rows
            tolerance = (
                0.2 * reference
                if key == "val_perplexity"
                else 2 * (2 * reference * (1 - reference) / 256) ** 0.5
            )
            check(
                f"{where}: scores as on the CPU",
                abs(value - reference) <= tolerance,
                f"{key} {value:.3f} (CPU fp32 {reference:.3f}, allowed ±{tolerance:.3f})",
            )
            if name != "rnn_lm" and precision == "bf16":
                predicted = MODELS[name].load(saved)(df.head(256))
                accuracy = float(
                    (
                        np.asarray(sorted(df["label"].unique()))[predicted.argmax(1)]
                        == df["label"].head(256)
                    ).mean()
                )
                check(
                    f"{where}: the saved model predicts on the GPU",
                    abs(accuracy - value) <= 0.02,
                    f"accuracy {accuracy:.3f} on the validation rows (validation said {value:.3f})",
                )


def resume(df: pd.DataFrame, folder: Path) -> None:
    """A textcnn killed in its second epoch on the GPU resumes there from the first epoch's
    checkpoint."""
    params = train_params("cuda", "bf16", 3)
    straight, _ = classify("textcnn", df, folder, params)
    scratch = folder / "killed-ckpt"
    plain = trainer._train_epoch

    def crash(*args, **kwargs):  # args[10]: the epoch
        if args[10] == 2:
            raise KeyboardInterrupt("killed in epoch 2")
        return plain(*args, **kwargs)

    trainer._train_epoch = crash
    try:
        classify("textcnn", df, folder, params, scratch)
    except KeyboardInterrupt:
        pass
    finally:
        trainer._train_epoch = plain
    again, _ = classify("textcnn", df, folder, params, scratch)
    a, b = straight["history"][-1]["val_accuracy"], again["history"][-1]["val_accuracy"]
    check(
        "textcnn killed on cuda: resumes after epoch 1",
        again["resumed_from_epoch"] == 1 and len(again["history"]) == 3,
        f"resumed from epoch {again['resumed_from_epoch']}, {len(again['history'])} epochs in its "
        "history",
    )
    check(
        "textcnn killed on cuda: ends where an unbroken run ends",
        abs(a - b) <= 0.02,
        f"last val_accuracy {b:.3f} (unbroken {a:.3f}; GPU kernels are not bit-reproducible)",
    )


def tiny_task(rows: int = 64) -> tuple[torch.nn.Module, trainer.Task]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(rows, 8, generator=g), torch.randint(0, 2, (rows,), generator=g)
    model = torch.nn.Linear(8, 2)

    def batches(rng):
        for i in range(0, rows, 16):
            yield 16, {"x": x[i : i + 16], "y": y[i : i + 16]}

    def validate(m):
        with torch.no_grad():
            probs = torch.softmax(m(x.to(next(m.parameters()).device)).float(), 1).cpu().numpy()
        return trainer.validation_metrics(probs, y.numpy())

    return model, trainer.Task(
        batches,
        rows // 16,
        lambda m, b: torch.nn.functional.cross_entropy(m(b["x"]), b["y"]),
        validate,
    )


def data_parallel(folder: Path) -> None:
    """NCCL data-parallel training (one process per GPU), before and after this process has used
    CUDA itself; more processes than GPUs is one clear error."""
    gpus = torch.cuda.device_count()
    for when in ("before this process used CUDA", "after this process used CUDA"):
        if when.startswith("after"):
            torch.zeros(1, device="cuda")
        model, task = tiny_task()
        cfg = trainer.LoopConfig(
            lr=0.05, epochs=2, patience=2, device="cuda", precision="bf16", processes=min(gpus, 2)
        )
        try:
            result = trainer.fit_data_parallel(
                "linear", model, task, cfg, folder / f"dp-{len(checks)}"
            )
            check(
                f"data-parallel on {cfg.processes} GPU(s), {when}",
                result.extra.get("backend") == "nccl" and result.device.startswith("cuda"),
                f"backend {result.extra.get('backend')}, device {result.device}",
            )
        except Exception as e:  # noqa: BLE001  (the check reports what went wrong)
            check(
                f"data-parallel on {cfg.processes} GPU(s), {when}",
                False,
                f"{type(e).__name__}: {str(e).strip()[-300:]}",
            )
    model, task = tiny_task()
    cfg = trainer.LoopConfig(lr=0.05, epochs=1, patience=1, device="cuda", processes=gpus + 1)
    try:
        trainer.fit(f"linear-{gpus + 1}", model, task, cfg, folder / "dp-too-many")
        check(
            f"train.processes={gpus + 1} on {gpus} GPU(s)",
            False,
            "trained instead of one clear error",
        )
    except ConfigError as e:
        check(
            f"train.processes={gpus + 1} on {gpus} GPU(s): one clear error", "GPU" in str(e), str(e)
        )


def translators(folder: Path, rows: list[dict], device: str = "cuda") -> None:
    """The GRU encoder-decoder with attention and the Transformer translator learn 40 pairs on the
    GPU in bf16."""
    # the test suite's translator inputs, on its Tatoeba pairs
    from tests.tasks.models.test_seq2seq import tiny_inputs

    sections = {
        "seq2seq_attention": {
            "epochs": 40,
            "embed_dim": 32,
            "hidden_size": 64,
            "lr": 5e-3,
            "dropout": 0.0,
            "label_smoothing": 0.0,
        },
        "transformer_mt": {
            "epochs": 40,
            "d_model": 64,
            "num_heads": 2,
            "num_encoder_layers": 1,
            "num_decoder_layers": 1,
            "ff_dim": 128,
            "lr": 3e-3,
            "dropout": 0.0,
            "label_smoothing": 0.0,
            "warmup_ratio": 0.05,
        },
    }
    for name, section in sections.items():
        inputs, frame = tiny_inputs(
            Path(tempfile.mkdtemp(dir=folder)),
            name,
            pairs=40,
            common={"device": device, "precision": "bf16"},
            beam_size=2,
            train_batch_size=8,
            **section,
        )
        summary = MODELS[name].train(inputs)
        rows.append(
            {
                "model": name,
                "device": device,
                "precision": "bf16",
                "samples_per_second": summary["samples_per_second"],
                "val_bleu": summary["val_bleu"],
            }
        )
        answers = MODELS[name].load(inputs.out / name)(frame.head(5))
        right = sum(a.text == ref for a, ref in zip(answers, frame["en"].head(5)))
        check(
            f"{name} on cuda, bf16: learns 40 pairs",
            summary["device"].startswith("cuda") and summary["val_bleu"] > 60,
            f"device {summary['device']}, BLEU {summary['val_bleu']:.1f} on the pairs it saw; "
            f"{right}/5 translated exactly",
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--models", default=",".join(CLASSIFIERS))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU "
            "machine"
        )
    folder = Path(tempfile.mkdtemp(prefix="zhpipe-gpu-check-"))
    # models, vectors and checkpoints (about 70 MB)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    rows: list[dict] = []
    # first: this process has not used CUDA yet
    steps = [
        ("data-parallel", lambda: data_parallel(folder)),
        (
            "header",
            lambda: console.print(
                f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA "
                f"{torch.version.cuda}, "
                f"bf16 {torch.cuda.is_bf16_supported()}"
            ),
        ),
        (
            "precisions",
            lambda: precisions(
                args.models.split(","), corpus(args.rows, folder), folder, args.epochs, rows
            ),
        ),
        ("resume", lambda: resume(corpus(512, folder / "small"), folder / "small")),
        ("translators", lambda: translators(folder, rows)),
    ]
    for step, run in steps:
        try:
            run()
        # a step that breaks is a failed check; the others still run
        except Exception:  # noqa: BLE001
            check(f"{step}: ran to the end", False, traceback.format_exc().strip().splitlines()[-1])
    from rich.table import Table

    gpu = torch.cuda.get_device_name()
    table = Table(
        title=f"training on {gpu}: samples/s and best validation score ({args.epochs} epochs, "
        f"{args.rows} reviews)"
    )
    for col in ("model", "device", "precision", "samples/s", "score"):
        table.add_column(
            col, justify="left" if col in ("model", "device", "precision") else "right"
        )
    for r in rows:
        key = next(k for k in ("val_accuracy", "val_perplexity", "val_bleu") if k in r)
        table.add_row(
            r["model"],
            r["device"],
            r["precision"],
            f"{r['samples_per_second']:.0f}",
            f"{key.removeprefix('val_')} {r[key]:.3f}",
        )
    console.print(table)
    failed = [c for c in checks if not c[1]]
    console.print(f"{len(checks) - len(failed)} of {len(checks)} checks passed")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "gpu": gpu,
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "rows": args.rows,
                "epochs": args.epochs,
                "runs": rows,
                "checks": [{"check": n, "ok": ok, "detail": d} for n, ok, d in checks],
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    console.print(f"written: {args.out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
