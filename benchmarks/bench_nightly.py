"""A corpus that grows every night: the bundled reviews as a first night of 70% and six drops of 5%, one file
per night in a partitioned source (data/raw/reviews/*.csv), `zhpipe run` once per night in one project.
Printed per night: new and total rows, seconds per stage, cache hits, the champion decision with both scores
on that night's test split, and how many of the previous night's test rows are still test rows.

    python benchmarks/bench_nightly.py                       # tfidf_lr + fasttext, 7 nights
    python benchmarks/bench_nightly.py --models tfidf_lr --nights 4 --out benchmarks/results/nightly.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="zhpipe-nightly-"))
os.environ["PREFECT_HOME"] = str(WORK / "prefect")
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{WORK / 'mlflow.db'}"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
for name in ("ZHPIPE_DATA", "ZHPIPE_STORAGE", "ZHPIPE_PROJECT"):
    os.environ.pop(name, None)

import pandas as pd  # noqa: E402
import yaml  # noqa: E402

DATA = ("download", "clean", "split", "segment", "augment")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=7)
    ap.add_argument("--first", type=float, default=0.70, help="share of the corpus on the first night")
    ap.add_argument("--drop", type=float, default=0.05, help="share added each later night")
    ap.add_argument("--models", default="tfidf_lr,fasttext")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()

    rows = pd.read_csv(ROOT / "data/raw/ChnSentiCorp_htl_all.csv", dtype=str).dropna().sample(frac=1.0, random_state=11)
    cuts = [0, int(len(rows) * args.first)] + [int(len(rows) * (args.first + args.drop * i)) for i in range(1, args.nights)]
    drops = WORK / "project" / "data" / "raw" / "reviews"
    drops.mkdir(parents=True)
    doc = {"pipelines": {"nightly": {
        "source": {"path": "data/raw/reviews/*.csv", "text_column": "review", "label_column": "label"},
        "stages": {"augment": {"method": "eda", "num_aug": 1}, "train": {"models": args.models.split(",")}}}}}
    (WORK / "project" / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")

    from flows.plan import project

    project.activate(project.Project(WORK / "project"))
    from flows.orchestrate.pipeline import pipeline_flow
    from flows.track.tracker import client

    nights, previous_test = [], None
    for night in range(1, args.nights + 1):
        part = rows.iloc[cuts[night - 1] : cuts[night]] if night < len(cuts) else rows.iloc[cuts[-1] :]
        part.to_csv(drops / f"night-{night:02d}.csv", index=False)
        t0 = time.perf_counter()
        out = pipeline_flow("nightly", config_file=str(WORK / "project" / "pipelines.yaml"))
        wall = time.perf_counter() - t0
        stages = {s["stage"]: s for s in out["stages"]}
        units = {u["stage"]: u for u in out["units"]}
        tags = client().get_run(out["parent_run_id"]).data
        test = set(pd.read_parquet(project.current().data / "segment" / stages["segment"]["key"] / "test.parquet")["text"])
        kept = len(previous_test & test) / len(previous_test) if previous_test else None
        previous_test = test
        row = {
            "night": night, "rows_new": len(part), "rows_total": cuts[night] if night < len(cuts) else len(rows),
            "wall_s": wall, "seconds": {s: stages[s]["seconds"] for s in stages},
            "data_stage_s": sum(stages[s]["seconds"] for s in DATA),
            "train_s": sum(u["seconds"] for name, u in units.items() if name.startswith("train.")),
            "partition_units_built": sum(u["cache"] == "miss" for name, u in units.items() if ":" in name),
            "partition_units_cached": sum(u["cache"] == "hit" for name, u in units.items() if ":" in name),
            "old_test_rows_still_test": kept,
            "champion": tags.tags.get("zhpipe.champion"), "decision": tags.tags.get("zhpipe.champion_reason"),
            "registered": tags.tags.get("zhpipe.registered"), "best_model": tags.tags.get("zhpipe.best_model"),
            "challenger": tags.metrics.get("challenger_test_accuracy"), "champion_score": tags.metrics.get("champion_test_accuracy"),
        }
        nights.append(row)
        print(f"night {night}: +{row['rows_new']} rows ({row['rows_total']} in all), {wall:.1f} s wall, data stages "
              f"{row['data_stage_s']:.1f} s, partition units {row['partition_units_built']} built / {row['partition_units_cached']} cached"
              + (f", {kept:.2%} of last night's test rows still test" if kept is not None else ""), flush=True)
        print(f"  champion: {row['decision']}", flush=True)

    print("\n| night | new rows | total | data stages s | " + " | ".join(DATA) + " | train s | units built/cached | old test kept | "
          "challenger acc | champion acc (same split) | champion moved |")
    print("|" + "---|" * (10 + len(DATA)))
    for r in nights:
        s = r["seconds"]
        print(f"| {r['night']} | {r['rows_new']} | {r['rows_total']} | {r['data_stage_s']:.2f} | "
              + " | ".join(f"{s[x]:.2f}" for x in DATA) + f" | {r['train_s']:.1f} | {r['partition_units_built']}/{r['partition_units_cached']} | "
              + (f"{r['old_test_rows_still_test']:.2%}" if r["old_test_rows_still_test"] is not None else "-") + " | "
              + (f"{r['challenger']:.4f}" if r["challenger"] is not None else "-") + " | "
              + (f"{r['champion_score']:.4f}" if r["champion_score"] is not None else "-") + f" | {r['champion']} |")
    first = nights[0]["data_stage_s"]
    print("\ndata stages relative to night 1: " + ", ".join(f"night {r['night']} {r['data_stage_s'] / first:.2f}" for r in nights[1:]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(nights, indent=2, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
