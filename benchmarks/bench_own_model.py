"""What zhpipe adds to a team's own scikit-learn estimator (docs/extending.md): the `train.<name>`
and `evaluate.<name>` units of a LinearSVC over character 1-3 grams, against the same estimator
fitted and asked by hand on the same split, in the same process kind (a fresh Python that imports
what it needs), alternating.

    python benchmarks/bench_own_model.py [--rows 7766] [--rounds 3] [--warm]

zhpipe's side: a project made with `zhpipe init --csv` on the bundled ChnSentiCorp reviews (or
`--rows` unique rows of benchmarks/corpora.py's `reviews`), `train.models: [char_svc]`, run once to
build every stage, then each round `zhpipe run --force train` (its only model is `char_svc`: its
units and the stages that gather them); its cost is the two units' wall seconds from their
manifests. The hand side: a Python process that reads the same train split the model is fitted on
(the augment stage's, augmented rows included) and the validation and test splits (the segment
stage's), fits the estimator, and predicts validation and test: its wall time from start to end,
imports included (zhpipe's units pay theirs in the run's process). The overhead is zhpipe's minus
the hand's, per round; its median is the figure. Writes benchmarks/results/own_model.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODEL = """from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import make_pipeline
from sklearn.svm import LinearSVC


def char_svc(C=1.0):
    features = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True)
    return make_pipeline(features, LinearSVC(C=C))
"""

HAND = """import sys, time
t0 = time.perf_counter()
import pandas as pd
sys.path.insert(0, sys.argv[1])
from my_models import char_svc
train, validation, test = (pd.read_parquet(p) for p in sys.argv[2:5])
texts, labels = train["text"].astype(str).tolist(), train["label"].astype(str).to_numpy()
model = char_svc(C=0.5).fit(texts, labels)
model.decision_function(validation["text"].astype(str).tolist())
model.decision_function(test["text"].astype(str).tolist())
print(time.perf_counter() - t0)
"""


def zhpipe(project: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"zhpipe {' '.join(args)} failed: {(done.stdout + done.stderr)[-2000:]}")
    return done


def newest(store: Path, unit: str) -> Path:
    return max(
        (p for p in (store / unit).iterdir() if (p / "manifest.json").exists()),
        key=lambda p: p.stat().st_mtime,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--rows",
        type=int,
        default=0,
        help="unique rows of the larger corpus (0: the bundled 7,766)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--warm",
        action="store_true",
        help="as a project runs every day: its background server and "
        "warm process (which imports skops once for a project that declares an estimator)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zhpipe-bench-own-") as tmp:
        tmp = Path(tmp)
        corpus = ROOT / "data" / "raw" / "ChnSentiCorp_htl_all.csv"
        text_column = "review"
        if args.rows:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from corpora import reviews

            corpus, text_column = tmp / "corpus.csv", "text"
            reviews(args.rows).to_csv(corpus, index=False)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ZHPIPE_", "PREFECT_", "MLFLOW_"))
        }
        env |= (
            {"ZHPIPE_SERVER": "background"}
            if args.warm
            else {"ZHPIPE_SERVER": "temporary", "ZHPIPE_WARM": "off"}
        )
        project = tmp / "p"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "flows.cli",
                "init",
                str(project),
                "--csv",
                str(corpus),
                "--text-column",
                text_column,
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        (project / "my_models.py").write_text(MODEL, encoding="utf-8")
        config = project / "pipelines.yaml"
        config.write_text(
            config.read_text(encoding="utf-8").replace(
                "        models: [tfidf_lr, fasttext, textcnn]\n",
                "        models: [char_svc]\n        char_svc: {estimator: my_models:char_svc, "
                "params: {C: 0.5}}\n",
            ),
            encoding="utf-8",
        )
        zhpipe(project, env, "run")  # every stage built once
        store = project / "data"
        # what zhpipe fits on: the augment stage's train split (augmented rows included); validation
        # and test as segmented
        splits = [
            newest(store, "augment") / "train.parquet",
            *(newest(store, "segment") / f"{s}.parquet" for s in ("validation", "test")),
        ]
        rounds = []
        for n in range(args.rounds):
            hand = float(
                subprocess.run(
                    [sys.executable, "-c", HAND, str(project), *map(str, splits)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
            )
            zhpipe(project, env, "run", "--force", "train")
            manifests = {
                u: json.loads((newest(store, u) / "manifest.json").read_text())
                for u in ("train.char_svc", "evaluate.char_svc")
            }
            units = {u: m["seconds"] for u, m in manifests.items()}
            units["fit (inside train.char_svc)"] = manifests["train.char_svc"]["metrics"][
                "train_seconds"
            ]
            ours = units["train.char_svc"] + units["evaluate.char_svc"]
            rounds.append(
                {
                    "hand_s": round(hand, 2),
                    "zhpipe_units_s": round(ours, 2),
                    **{k: round(v, 2) for k, v in units.items()},
                    "overhead_s": round(ours - hand, 2),
                }
            )
            print(
                f"round {n + 1}: by hand {hand:.2f} s, zhpipe's units {ours:.2f} s ({units}), "
                "overhead "
                f"{ours - hand:+.2f} s",
                flush=True,
            )
        rows = len(__import__("pandas").read_parquet(splits[0]))
        result = {
            "train_rows": rows,
            "rounds": rounds,
            "median_hand_s": statistics.median(r["hand_s"] for r in rounds),
            "median_zhpipe_units_s": statistics.median(r["zhpipe_units_s"] for r in rounds),
            "median_overhead_s": statistics.median(r["overhead_s"] for r in rounds),
        }
        if args.warm:
            zhpipe(project, env, "server", "stop")
        out = (
            ROOT
            / "benchmarks"
            / "results"
            / ("own_model-warm.json" if args.warm else "own_model.json")
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1), encoding="utf-8")
        print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))


if __name__ == "__main__":
    main()
