"""Test accuracy, train time and training samples/s per model over several split seeds: mean,
spread, and the goal check (the best model other than tfidf_lr >= tfidf_lr + 1 point and >= 0.92,
averaged over the seeds).

    python benchmarks/bench_quality.py [--pipeline full] [--seeds 1,2,3] [--set train.epochs=6 ...]
                                       [--out benchmarks/results/quality_<pipeline>.json]

Each seed is one ordinary pipeline run (`zhpipe run PIPELINE --set split.seed=S`): it uses the
project's stage store and MLflow, so the runs can be compared in the MLflow UI afterwards, and a
rerun reuses what is cached.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.plan import project

# Prefect's home and start-up timeout, before Prefect is imported
project.activate(project.Project(ROOT))
from rich.console import Console
from rich.table import Table

from flows.orchestrate.pipeline import pipeline_flow

console = Console()
BASELINE = "tfidf_lr"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", default="full")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="STAGE.PARAM=VALUE")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    per_seed: dict[int, dict[str, float]] = {}
    costs: dict[str, list[tuple[float, float]]] = {}
    runs = {}
    for seed in seeds:
        t0 = time.perf_counter()
        out = pipeline_flow(args.pipeline, overrides=[*args.sets, f"split.seed={seed}"])
        evaluation = next(s for s in out["stages"] if s["stage"] == "evaluate")
        per_seed[seed] = {
            m: r["test_accuracy"]
            for m, r in evaluation["facts"]["results"].items()
            if "test_accuracy" in r
        }
        for u in out["units"]:
            if u["stage"].startswith("train."):
                info = u["facts"]["summary"]
                costs.setdefault(u["stage"][6:], []).append(
                    (info.get("seconds", 0.0), info.get("samples_per_second", 0.0))
                )
        runs[seed] = out["parent_run_id"]
        console.print(
            f"seed {seed}: {time.perf_counter() - t0:.0f} s, MLflow parent run "
            f"{out['parent_run_id']}"
        )
    models = list(per_seed[seeds[0]])
    summary = {}
    for m in models:
        values = [per_seed[s][m] for s in seeds]
        summary[m] = {
            "mean": statistics.mean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values),
            "max": max(values),
            "per_seed": dict(zip(map(str, seeds), values)),
            "train_seconds_median": statistics.median(c[0] for c in costs.get(m, [(0.0, 0.0)])),
            "samples_per_second_median": statistics.median(
                c[1] for c in costs.get(m, [(0.0, 0.0)])
            ),
        }
    table = Table(title=f"{args.pipeline}: test accuracy over split seeds {args.seeds}")
    for col in ["model", *map(str, seeds), "mean", "std", "min-max", "train s", "samples/s"]:
        table.add_column(col, justify="left" if col == "model" else "right")
    for m in sorted(models, key=lambda m: -summary[m]["mean"]):
        s = summary[m]
        table.add_row(
            m,
            *(f"{per_seed[seed][m]:.4f}" for seed in seeds),
            f"{s['mean']:.4f}",
            f"{s['std']:.4f}",
            f"{s['min']:.4f}-{s['max']:.4f}",
            f"{s['train_seconds_median']:.0f}",
            f"{s['samples_per_second_median']:.0f}",
        )
    console.print(table)
    goal = {}
    neural = [m for m in models if m != BASELINE]
    if neural and BASELINE in summary:
        best = max(neural, key=lambda m: summary[m]["mean"])
        margin = summary[best]["mean"] - summary[BASELINE]["mean"]
        goal = {
            "best_neural": best,
            "best_neural_mean": summary[best]["mean"],
            "baseline_mean": summary[BASELINE]["mean"],
            "margin_points": 100 * margin,
            "beats_baseline_by_1pt": margin >= 0.01,
            "reaches_0.92": summary[best]["mean"] >= 0.92,
        }
        console.print(
            f"goal: best other model {best} {summary[best]['mean']:.4f} vs {BASELINE} "
            f"{summary[BASELINE]['mean']:.4f} "
            f"({100 * margin:+.2f} points; >= +1: {goal['beats_baseline_by_1pt']}, >= 0.92: "
            f"{goal['reaches_0.92']})"
        )
    out_file = args.out or ROOT / "benchmarks" / "results" / f"quality_{args.pipeline}.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(
        json.dumps(
            {
                "pipeline": args.pipeline,
                "sets": args.sets,
                "seeds": seeds,
                "parent_runs": runs,
                "models": summary,
                "goal": goal,
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    console.print(f"written: {out_file}")


if __name__ == "__main__":
    main()
