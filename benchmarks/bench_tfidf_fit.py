"""tfidf_lr fitted exactly in memory against the streamed fit (hashed n-grams, SGD over shuffled
batches) on the same split of a pipeline's corpus: validation and test accuracy, seconds, peak
memory of each fit.

    # the bundled reviews (pipeline chnsenticorp)
    python benchmarks/bench_tfidf_fit.py
    python benchmarks/bench_tfidf_fit.py --pipeline full --set train.tfidf_lr.epochs=5

The stages up to augment are built (or reused) in the project's store first."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, tempfile
from pathlib import Path
import pandas as pd
from tasks.util.io import Rows
from tasks.util.pool import peak_rss_mb
from tasks.classification.models.tfidf import Params, train_tfidf_lr, tfidf_predictor
augment, segment = Path(sys.argv[1]), Path(sys.argv[2])
fit, section = sys.argv[3], json.loads(sys.argv[4])
labels = json.loads(sys.argv[5])
index = {label: i for i, label in enumerate(labels)}
out = Path(tempfile.mkdtemp())
t0 = time.perf_counter()
train_tfidf_lr(Rows(augment / "train.parquet"), labels, Params(**{**section, "fit": fit}), 7, out)
seconds = time.perf_counter() - t0
predict = tfidf_predictor(out / "tfidf_lr")
scores = {}
for split in ("validation", "test"):
    frame = pd.read_parquet(segment / f"{split}.parquet")
    scores[split] = float((predict(frame).argmax(1) == frame["label"].map(index).to_numpy()).mean())
print(json.dumps({"fit": fit, "seconds": seconds, "peak_rss_mb": peak_rss_mb(), **scores}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", default="chnsenticorp")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    ap.add_argument("--out")
    args = ap.parse_args()
    from flows import api

    summary = api.run(
        args.pipeline, args.sets, stages=["download", "clean", "split", "segment", "augment"]
    )
    paths = {s["stage"]: s["path"] for s in summary["stages"]}
    config = api.config(args.pipeline, args.sets)
    labels = next(s for s in summary["stages"] if s["stage"] == "augment")["facts"]["labels"]
    section = config.stages.train.tfidf_lr.model_dump()
    rows = []
    # each fit in a fresh process, so that its peak memory is its own
    for fit in ("memory", "stream"):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                paths["augment"],
                paths["segment"],
                fit,
                json.dumps(section),
                json.dumps(labels),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        "\n| fit | validation accuracy | test accuracy | seconds | peak RSS "
        "|\n|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['fit']} | {r['validation']:.4f} | {r['test']:.4f} | {r['seconds']:.1f} | "
            f"{r['peak_rss_mb']:,.0f} MB |"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"pipeline": args.pipeline, "sets": args.sets, "fits": rows}, indent=2),
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
