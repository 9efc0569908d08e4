"""Soft-voting ensembles over models already trained in the stage store, plus a wide TF-IDF linear
model, against `tfidf_lr` in the same splits: which member sets beat the baseline, with weights fit
on validation only (as the `ensemble` model fits them).

    python benchmarks/bench_ensembles.py [--seeds 1,2,3] [--models \\
        tfidf_lr,fasttext,textcnn,lm_classifier,bilstm]

For each split seed it takes, from the manifests in data/, the segmented splits and augmented train
rows with the most trained classifiers (train them first, e.g. `python benchmarks/bench_quality.py
--pipeline best --seeds 1,2,3 --set
'train.models=[tfidf_lr,fasttext,textcnn,lm_classifier,bilstm,ensemble]'`), loads each model as it
is served and scores validation and test. `wide` is tfidf_lr's pipeline with word 1-3-grams,
character 1-5-grams and C=16 on the same augmented rows (benchmarks/bench_linear.py's best variant).
Prints every member set's mean test accuracy and its gap to tfidf_lr; writes
benchmarks/results/ensembles.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "data"


def manifest(stage: str, key: str):
    """The store's manifest of one output, or None where it is gone."""
    from flows.plan.store import Manifest

    folder = DATA / stage / key
    return Manifest.read(folder) if (folder / "manifest.json").is_file() else None


def trained_sets(models: list[str]) -> dict[int, dict]:
    """Per split seed: the (segment, augment) pair with the most of `models` trained, and each
    model's latest unit."""
    found: dict[tuple, dict] = defaultdict(dict)
    for path in DATA.glob("train.*/*/manifest.json"):
        m = manifest(path.parent.parent.name, path.parent.name)
        name = m.stage.partition(".")[2]
        if name not in models or "segment" not in m.inputs or "augment" not in m.inputs:
            continue
        pair = (m.inputs["segment"], m.inputs["augment"])
        if name not in found[pair] or m.created > found[pair][name].created:
            found[pair][name] = m
    best: dict[int, dict] = {}
    for (segment, augment), units in found.items():
        seg = manifest("segment", segment)
        split = manifest("split", seg.inputs["split"]) if seg else None
        if split is None:
            continue
        seed = split.params["seed"]
        if seed not in best or len(units) > len(best[seed]["units"]):
            best[seed] = {"segment": segment, "augment": augment, "units": units}
    return best


def fit_wide(train: pd.DataFrame, y: np.ndarray, seed: int):
    """tfidf_wide's pipeline with its default settings."""
    from tasks.classification.models.tfidf import WideParams, make_pipeline

    return make_pipeline(WideParams(), seed).fit(train[["words", "text"]], y)


def main() -> None:
    from tasks.classification.models.ensemble import fit_weights
    from tasks.stages import MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--models", default="tfidf_lr,fasttext,textcnn,lm_classifier,bilstm")
    parser.add_argument("--max-members", type=int, default=5)
    args = parser.parse_args()
    seeds, models = [int(s) for s in args.seeds.split(",")], args.models.split(",")
    sets = trained_sets(models)
    missing = [s for s in seeds if s not in sets or "tfidf_lr" not in sets[s]["units"]]
    if missing:
        raise SystemExit(
            f"no trained tfidf_lr for split seed(s) {missing} in {DATA}: train the models first "
            "(see --help)"
        )
    rows = []
    for seed in seeds:
        found = sets[seed]
        split = {
            name: pd.read_parquet(DATA / "segment" / found["segment"] / f"{name}.parquet")
            for name in ("validation", "test")
        }
        train = pd.read_parquet(DATA / "augment" / found["augment"] / "train.parquet")
        labels = sorted(train["label"].unique())
        index = {label: i for i, label in enumerate(labels)}
        y = {name: df["label"].map(index).to_numpy() for name, df in split.items()}
        probs = {}
        for name, unit in found["units"].items():
            predict = MODELS[name].load(DATA / unit.stage / unit.key / name)
            probs[name] = {part: predict(df) for part, df in split.items()}
        wide = fit_wide(train, train["label"].map(index).to_numpy(), seed)
        probs["wide"] = {
            part: wide.predict_proba(df[["words", "text"]]) for part, df in split.items()
        }
        row = {"seed": seed}
        for k in range(1, min(args.max_members, len(probs)) + 1):
            for combo in itertools.combinations(sorted(probs), k):
                w = (
                    fit_weights([probs[n]["validation"] for n in combo], y["validation"], 10)
                    if k > 1
                    else [1.0]
                )
                test = sum(wi * probs[n]["test"] for wi, n in zip(w, combo))
                row["+".join(combo)] = float((test.argmax(1) == y["test"]).mean())
        rows.append(row)
        print(f"seed {seed}: {sorted(found['units'])} + wide", file=sys.stderr)
    table = pd.DataFrame(rows).set_index("seed")
    mean = table.mean().sort_values(ascending=False)
    base = mean["tfidf_lr"]
    print("\n| members | mean test accuracy | vs tfidf_lr (points) | per seed |\n|---|---|---|---|")
    for name, value in mean.items():
        if "+" not in name or value >= base:
            print(
                f"| {name} | {value:.4f} | {100 * (value - base):+.2f} | "
                f"{', '.join(f'{v:.4f}' for v in table[name])} |"
            )
    out = ROOT / "benchmarks" / "results" / "ensembles.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"seeds": seeds, "accuracy": table.reset_index().to_dict("records")}, indent=1),
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
