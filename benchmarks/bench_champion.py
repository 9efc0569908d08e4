"""Does the champion move on noise? The bundled reviews in a fresh project: fastText trained with
seeds 1-4 (runs that differ only in the seed, each registered against the champion of the run
before), then a weak champion (fastText, one epoch, a high learning rate) replaced by a clearly
better model (tfidf_lr). Printed per run: the version, its test score, the champion's on the same
rows, the paired difference with its interval, and whether the alias moved.

    python benchmarks/bench_champion.py --out benchmarks/results/champion.json
    python benchmarks/bench_champion.py --seeds 4,3,2,1 --out \\
        benchmarks/results/champion_reversed.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="zhpipe-champion-"))
os.environ["PREFECT_HOME"] = str(WORK / "prefect")
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{WORK / 'mlflow.db'}"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
for name in ("ZHPIPE_DATA", "ZHPIPE_STORAGE", "ZHPIPE_PROJECT"):
    os.environ.pop(name, None)

import yaml


def runs(seeds: list[int]) -> list[tuple[str, str, list[str]]]:
    return [
        (f"fastText, seed {seed}", "seeds", ["train.models=[fasttext]", f"train.seed={seed}"])
        for seed in seeds
    ] + [
        (
            "fastText, 1 epoch, lr 0.01 (weak)",
            "clear",
            ["train.models=[fasttext]", "train.fasttext.epoch=1", "train.fasttext.lr=0.01"],
        ),
        ("tfidf_lr", "clear", ["train.models=[tfidf_lr]"]),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--seeds",
        default="1,2,3,4",
        help="fastText's seeds, in the order the runs register (default 1,2,3,4)",
    )
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    project_dir = WORK / "project"
    (project_dir / "data" / "raw").mkdir(parents=True)
    shutil.copy(ROOT / "data/raw/ChnSentiCorp_htl_all.csv", project_dir / "data/raw/reviews.csv")
    doc = {
        "pipelines": {
            "seeds": {
                "source": {
                    "path": "data/raw/reviews.csv",
                    "text_column": "review",
                    "label_column": "label",
                },
                "stages": {"augment": {"method": "none"}},
            },
            "clear": {
                "source": {
                    "path": "data/raw/reviews.csv",
                    "text_column": "review",
                    "label_column": "label",
                },
                "stages": {"augment": {"method": "none"}},
            },
        }
    }
    (project_dir / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    from flows.plan import project

    project.activate(project.Project(project_dir))
    from flows.orchestrate.pipeline import pipeline_flow
    from flows.track.tracker import client

    rows = []
    for what, pipeline, sets in runs([int(x) for x in args.seeds.split(",")]):
        out = pipeline_flow(
            pipeline, overrides=sets, config_file=str(project_dir / "pipelines.yaml")
        )
        run = client().get_run(out["parent_run_id"]).data
        alias = client().get_model_version_by_alias(f"zhpipe-{pipeline}", "champion").version
        rows.append(
            {
                "run": what,
                "pipeline": pipeline,
                "registered": run.tags.get("zhpipe.registered"),
                "test_accuracy": run.metrics.get("challenger_test_accuracy"),
                "champion_test_accuracy": run.metrics.get("champion_test_accuracy"),
                "decision": run.tags.get("zhpipe.champion"),
                "reason": run.tags.get("zhpipe.champion_reason"),
                "champion_after": alias,
            }
        )
        print(
            f"{what}: {rows[-1]['registered']} -> champion version {alias}: {rows[-1]['reason']}",
            flush=True,
        )
    print("\n| run | registered | test acc | champion's, same rows | champion after | why |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        champion = (
            f"{r['champion_test_accuracy']:.4f}" if r["champion_test_accuracy"] is not None else "-"
        )
        reason = (
            (r["reason"] or "").split(": ", 1)[-1]
            if "interval" in (r["reason"] or "")
            else r["reason"]
        )
        print(
            f"| {r['run']} | {r['registered']} | {r['test_accuracy']:.4f} | {champion} | version "
            f"{r['champion_after']} | {reason} |"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
