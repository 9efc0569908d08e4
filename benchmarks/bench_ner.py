"""NER quality and throughput: entity F1 (test and validation), train time and training samples/s
per tagger over several training seeds, and the lexicon adapter's effect (bilstm_crf and
lexicon_tagger are the same encoder without and with it).

    python benchmarks/bench_ner.py [--pipeline resume-ner] [--seeds 1,2,3] \\
        [--set train.crf.c1=0.1 ...]
                                   [--out benchmarks/results/ner_<pipeline>.json]

Each seed is one ordinary pipeline run (`zhpipe run resume-ner --set train.seed=S`) in the project's
stage store and MLflow: the runs can be compared in the MLflow UI, and a rerun reuses what is cached
(the CRF and everything before train do not depend on the seed, so they are built once).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", default="resume-ner")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="STAGE.PARAM=VALUE")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows: dict[str, dict[int, dict]] = {}
    runs = {}
    for seed in seeds:
        t0 = time.perf_counter()
        out = pipeline_flow(args.pipeline, overrides=[*args.sets, f"train.seed={seed}"])
        info = next(s for s in out["stages"] if s["stage"] == "evaluate")["facts"]
        units = {
            u["stage"].partition(".")[2]: u for u in out["units"] if u["stage"].startswith("train.")
        }
        for model, result in info["results"].items():
            summary = units[model]["facts"]["summary"]
            rows.setdefault(model, {})[seed] = {
                "test_f1": result["test_f1"],
                "val_f1": summary["val_f1"],
                "train_seconds": summary["seconds"],
                "samples_per_second": summary.get("samples_per_second"),
                "best_epoch": summary.get("best_epoch"),
            }
        runs[seed] = out["parent_run_id"]
        console.print(
            f"seed {seed}: {time.perf_counter() - t0:.0f} s, champion {info['best_model']}, MLflow "
            f"parent run {out['parent_run_id']}"
        )
    summary = {}
    for model, per_seed in rows.items():
        f1 = [per_seed[s]["test_f1"] for s in seeds]
        summary[model] = {
            "test_f1_mean": statistics.mean(f1),
            "test_f1_std": statistics.stdev(f1) if len(f1) > 1 else 0.0,
            "val_f1_mean": statistics.mean(per_seed[s]["val_f1"] for s in seeds),
            "train_seconds_median": statistics.median(per_seed[s]["train_seconds"] for s in seeds),
            "samples_per_second_median": statistics.median(
                per_seed[s]["samples_per_second"] or 0 for s in seeds
            ),
            "per_seed": {str(s): per_seed[s] for s in seeds},
        }
    table = Table(title=f"{args.pipeline}: entity F1 over training seeds {args.seeds}")
    for col in [
        "model",
        *(f"test F1 s{s}" for s in seeds),
        "test mean",
        "std",
        "val mean",
        "train s (median)",
        "samples/s",
    ]:
        table.add_column(col, justify="left" if col == "model" else "right")
    for model, s in summary.items():
        table.add_row(
            model,
            *(f"{s['per_seed'][str(k)]['test_f1']:.4f}" for k in seeds),
            f"{s['test_f1_mean']:.4f}",
            f"{s['test_f1_std']:.4f}",
            f"{s['val_f1_mean']:.4f}",
            f"{s['train_seconds_median']:.0f}",
            f"{s['samples_per_second_median']:.0f}" if s["samples_per_second_median"] else "",
        )
    console.print(table)
    if "bilstm_crf" in summary and "lexicon_tagger" in summary:
        gain = [
            rows["lexicon_tagger"][s]["test_f1"] - rows["bilstm_crf"][s]["test_f1"] for s in seeds
        ]
        console.print(
            f"lexicon adapter: test F1 {statistics.mean(gain):+.4f} on average (per seed: "
            f"{', '.join(f'{g:+.4f}' for g in gain)})"
        )
    out_file = args.out or ROOT / "benchmarks" / "results" / f"ner_{args.pipeline}.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(
        json.dumps(
            {
                "pipeline": args.pipeline,
                "seeds": seeds,
                "sets": args.sets,
                "runs": runs,
                "models": summary,
            },
            indent=2,
        )
    )
    console.print(f"written to {out_file}")


if __name__ == "__main__":
    main()
