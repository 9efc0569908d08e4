"""Linear variants against the `tfidf_lr` baseline, over split seeds: wider n-gram ranges, weaker
regularisation, and NB-weighted features (NB-LR / NB-SVM, Wang & Manning 2012), on the pipeline's
own segmented splits (before augmentation), so every variant sees exactly the baseline's rows.

    python benchmarks/bench_linear.py [--pipeline best] [--seeds 1,2,3]

Each seed's splits come from `zhpipe run PIPELINE --set split.seed=S --to segment` (cached after the
first time). Prints mean validation and test accuracy per variant; writes
benchmarks/results/linear.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def features(train, others, word_ngrams=(1, 2), char_ngrams=(1, 3), binary=False):
    """TF-IDF over jieba words and characters, as tfidf_lr builds them (binary: presence, no
    sublinear tf)."""
    from scipy.sparse import hstack
    from sklearn.feature_extraction.text import TfidfVectorizer

    words = TfidfVectorizer(
        tokenizer=str.split,
        token_pattern=None,
        lowercase=False,
        ngram_range=word_ngrams,
        min_df=2,
        sublinear_tf=not binary,
        binary=binary,
    )
    chars = TfidfVectorizer(
        analyzer="char", ngram_range=char_ngrams, min_df=2, sublinear_tf=not binary, binary=binary
    )
    x = hstack([words.fit_transform(train["words"]), chars.fit_transform(train["text"])]).tocsr()
    return [x] + [
        hstack([words.transform(o["words"]), chars.transform(o["text"])]).tocsr() for o in others
    ]


def nb_ratio(x, y, alpha=1.0):
    """Log-count ratio of each feature between the positive class and the rest."""
    p = alpha + x[y == 1].sum(0)
    q = alpha + x[y != 1].sum(0)
    return np.asarray(np.log((p / p.sum()) / (q / q.sum()))).ravel()


def variants(train, validation, test):
    """(name, validation accuracy, test accuracy) per variant."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    y, yv, yt = (d["label"].astype(str).to_numpy() for d in (train, validation, test))
    classes = np.unique(y)
    out = []

    def score(name, model, x, xv, xt):
        model.fit(x, y)
        out.append(
            (name, float((model.predict(xv) == yv).mean()), float((model.predict(xt) == yt).mean()))
        )

    x, xv, xt = features(train, [validation, test])
    score("tfidf_lr (words 1-2, chars 1-3, C=4)", LogisticRegression(C=4, max_iter=3000), x, xv, xt)
    for c in (16, 64):
        score(f"same features, C={c}", LogisticRegression(C=c, max_iter=3000), x, xv, xt)
    x, xv, xt = features(train, [validation, test], (1, 3), (1, 5))
    for c in (4, 16):
        score(f"words 1-3, chars 1-5, C={c}", LogisticRegression(C=c, max_iter=3000), x, xv, xt)
    if len(classes) == 2:  # NB weighting is defined for two classes
        y01 = (y == classes[1]).astype(int)
        for ngrams, label in (
            (((1, 2), (1, 3)), "words 1-2, chars 1-3"),
            (((1, 3), (1, 5)), "words 1-3, chars 1-5"),
        ):
            x, xv, xt = features(train, [validation, test], *ngrams, binary=True)
            r = nb_ratio(x, y01)
            x, xv, xt = (m.multiply(r).tocsr() for m in (x, xv, xt))
            for c in (4, 16, 64):
                score(f"NB-LR, {label}, C={c}", LogisticRegression(C=c, max_iter=3000), x, xv, xt)
            score(f"NB-SVM, {label}, C=1", LinearSVC(C=1), x, xv, xt)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="best")
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    from flows import api

    results: dict[str, list] = {}
    for seed in map(int, args.seeds.split(",")):
        sets = [f"split.seed={seed}"]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "flows.cli",
                "run",
                args.pipeline,
                "--set",
                sets[0],
                "--to",
                "segment",
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        frames = [
            api.load(args.pipeline, "segment", split, overrides=sets)
            for split in ("train", "validation", "test")
        ]
        for name, val, test in variants(*frames):
            results.setdefault(name, []).append({"seed": seed, "validation": val, "test": test})
        print(f"seed {seed} done", flush=True)
    print("\n| variant | validation accuracy | test accuracy | test per seed |\n|---|---|---|---|")
    for name, rows in results.items():
        v, t = np.mean([r["validation"] for r in rows]), np.mean([r["test"] for r in rows])
        per_seed = ", ".join(f"{r['test']:.4f}" for r in rows)
        print(f"| {name} | {v:.4f} | {t:.4f} | {per_seed} |")
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    (ROOT / "benchmarks" / "results" / "linear.json").write_text(
        json.dumps(results, indent=2), encoding="utf-8"
    )


if __name__ == "__main__":
    main()
