"""The training budget (`train.budget`) on a newcomer's first run: per network, the estimate it
gives from its first batches against the time its epochs really took; and runs with a budget against
the same models without one (wall time, what each network trained, the registered model and its test
accuracy).

    python benchmarks/bench_budget.py [--corpus reviews|hotel] [--budget 90s]

Each run is a fresh `zhpipe init --csv` project (its own stores and Prefect server, started in the
run's time) on the corpus: `reviews` is 12,000 two-class reviews made from the bundled hotel reviews
(benchmarks/corpora.py), `hotel` the bundled 7,766. Runs: the init template as written (tfidf_lr,
fasttext, textcnn, 4 epochs, the budget), the same without a budget, and the neural zoo (tfidf_lr,
fasttext, textcnn, bilstm, transformer) with and without the budget. Writes
benchmarks/results/budget.json and prints the tables of docs/results/training.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
ZOO = "train.models=[tfidf_lr,fasttext,textcnn,bilstm,transformer]"
ESTIMATE = re.compile(
    r"zhpipe\.train (\w+): about .* more to train \((\d+) epochs? of (\d+) batches at ([\d.]+) s a "
    r"batch"
)
CUT = re.compile(r"zhpipe (\w+): cut short by the budget: (.*)")
SPENT = re.compile(r"train: the models took (\d+) s of the (\d+) s budget")


def first_run(corpus: Path, sets: list[str], env: dict) -> dict:
    """A fresh project on `corpus`, its first `zhpipe run` (with `sets`), timed; what its log and
    MLflow say."""
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "first"
        subprocess.run(
            [sys.executable, "-m", "flows.cli", "init", str(project), "--csv", str(corpus)],
            env=env,
            check=True,
            capture_output=True,
        )
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", *sets],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        log = proc.stdout + proc.stderr
        if proc.returncode:
            raise SystemExit(f"zhpipe run {' '.join(sets)} failed:\n{log[-3000:]}")
        subprocess.run(
            [sys.executable, "-m", "flows.cli", "server", "stop"],
            cwd=project,
            env=env,
            capture_output=True,
        )
        comparison = sorted(
            (project / "data").glob("evaluate/*/comparison.csv"), key=lambda p: p.stat().st_mtime
        )
        table = __import__("pandas").read_csv(comparison[-1], dtype={"budget": str}).fillna("")
        listed = subprocess.run(
            [sys.executable, "-m", "flows.cli", "runs", "--json"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        run = json.loads(listed.splitlines()[0])
        models = {}
        for manifest in (project / "data").glob("train.*/*/manifest.json"):
            doc = json.loads(manifest.read_text(encoding="utf-8"))
            summary = doc.get("facts", {}).get("summary", {})
            history = summary.get("history", [])
            models[doc["stage"].split(".", 1)[1]] = {
                "seconds": doc["seconds"],
                "epochs": len(history),
                "val_accuracy": summary.get("val_accuracy"),
                "cut_short": summary.get("cut_short", ""),
                # each epoch's training time (validation aside, as the estimate): its rows at its
                # throughput
                "epoch_seconds": [
                    doc["rows"] / h["samples_per_second"]
                    for h in history
                    if h.get("samples_per_second") and doc.get("rows")
                ],
            }
    estimates = {
        m.group(1): {
            "epochs": int(m.group(2)),
            "batches": int(m.group(3)),
            "per_batch": float(m.group(4)),
        }
        for m in ESTIMATE.finditer(log)
    }
    spent = SPENT.search(log)
    return {
        "sets": sets,
        "wall": wall,
        "registered": run["registered"],
        "best": run["best model"],
        "test_accuracy": run["test acc"],
        "models": models,
        "estimates": estimates,
        "training_seconds": float(spent.group(1)) if spent else None,
        "comparison": table.to_dict(orient="records"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--corpus", choices=("reviews", "hotel", "pairs"), default="reviews")
    ap.add_argument(
        "--rows",
        type=int,
        default=62_000,
        help="rows of the `pairs` corpus (two reviews of one label each, unique: bench_scale.py's)",
    )
    ap.add_argument("--budget", default="90s")
    ap.add_argument(
        "--runs",
        default="template,template-free,zoo,zoo-free",
        help="which runs, comma-separated (default: all four)",
    )
    args = ap.parse_args()
    from corpora import corpus, pairs, reviews

    if args.corpus == "pairs":
        frame = pairs(args.rows)
    else:
        frame = (
            reviews()
            if args.corpus == "reviews"
            else corpus("hotel").rename(columns={"review": "text"})
        )
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_"))
    }
    env["PYTHONPATH"] = str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / f"{args.corpus}.csv"
        frame[["text", "label"]].to_csv(csv, index=False)
        every = {
            "template": ("template (budget)", []),
            "template-free": ("template, no budget", ["--set", "train.budget=null"]),
            "template-eda": ("template, EDA augmentation", ["--set", "augment.method=eda"]),
            "template-none": ("template, no augmentation", ["--set", "augment.method=none"]),
            "zoo": ("zoo (budget)", ["--set", ZOO, "--set", f"train.budget={args.budget}"]),
            "zoo-free": ("zoo, no budget", ["--set", ZOO, "--set", "train.budget=null"]),
        }
        runs = {every[key][0]: first_run(csv, every[key][1], env) for key in args.runs.split(",")}
    out = ROOT / "benchmarks" / "results" / "budget.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {"corpus": args.corpus, "rows": len(frame), "budget": args.budget, "runs": runs},
            indent=1,
        ),
        encoding="utf-8",
    )
    print(
        "| run | wall s | training s (budget) | registered model | test accuracy | tfidf_lr test "
        "accuracy | "
        "not trained | networks (epochs trained, cut short?) |\n|---|---|---|---|---|---|---|---|"
    )
    for name, r in runs.items():
        nets = ", ".join(
            f"{m} {v['epochs']}{' cut' if v['cut_short'] else ''}"
            for m, v in r["models"].items()
            if v["epochs"]
        )
        rows = {c["model"]: c for c in r["comparison"]}
        skipped = ", ".join(
            m for m, c in rows.items() if str(c.get("budget", "")).startswith("not trained")
        )
        lr = rows.get("tfidf_lr", {}).get("test_accuracy", "")
        print(
            f"| {name} | {r['wall']:.0f} | {r['training_seconds'] or ''} "
            f"({args.budget if 'budget' in name else '-'})"
            f" | {r['best']} | {r['test_accuracy']:.4f} | {lr} | {skipped or '-'} | {nets} |"
        )
    print(
        "\n| run | network | estimated s an epoch | real s an epoch (median of its epochs) | real "
        "/ estimate |\n"
        "|---|---|---|---|---|"
    )
    for name, r in runs.items():
        for model, e in r["estimates"].items():
            times = sorted(r["models"].get(model, {}).get("epoch_seconds", []))
            if not times or r["models"][model]["cut_short"].startswith("stopped in epoch 1"):
                continue  # an epoch cut short is no measure of a whole one
            real, estimate = times[len(times) // 2], e["per_batch"] * e["batches"]
            print(f"| {name} | {model} | {estimate:.1f} | {real:.1f} | {real / estimate:.2f} |")


if __name__ == "__main__":
    main()
