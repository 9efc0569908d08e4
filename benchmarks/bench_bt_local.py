"""Back-translation with zhpipe's own translators on the bundled hotel reviews: how many paraphrases
the filters accept, what they look like, and what they do to test accuracy, against no augmentation
and EDA, over split seeds. Needs the two translators registered first:

    zhpipe run tatoeba-zh-en && zhpipe run tatoeba-en-zh
    python benchmarks/bench_bt_local.py [--seeds 1,2,3] [--max-rows 1000] [--models \\
        tfidf_lr,textcnn]

Each (seed, method) is one run of the `chnsenticorp-bt-local` pipeline (`--set split.seed=S
augment.method=M`), so the data stages and the translations are cached across them. Prints the
tables and writes benchmarks/results/bt_local.json and bt_local.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd

PIPELINE = "chnsenticorp-bt-local"
METHODS = ("none", "eda", "backtranslation")


def run(seed: int, method: str, args) -> dict:
    from flows.orchestrate.pipeline import pipeline_flow

    overrides = [
        f"split.seed={seed}",
        f"augment.method={method}",
        f"augment.backtranslation.max_rows={args.max_rows}",
        f"train.models=[{','.join(args.models)}]",
        f"train.epochs={args.epochs}",
    ]
    out = pipeline_flow(PIPELINE, overrides=overrides)
    stages = {s["stage"]: s for s in out["stages"]}
    results = stages["evaluate"]["facts"]["results"]
    return {
        "seed": seed,
        "method": method,
        "augment": stages["augment"]["metrics"],
        "used": stages["augment"]["facts"]["augment_method_used"],
        "augment_path": stages["augment"]["path"],
        **{m: results[m]["test_accuracy"] for m in args.models},
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--max-rows", type=int, default=1000)
    ap.add_argument("--models", default="tfidf_lr,textcnn")
    ap.add_argument("--epochs", type=int, default=6)
    args = ap.parse_args()
    args.models = args.models.split(",")
    from flows.track.champion import resolve

    for uri in ("models:/zhpipe-tatoeba-zh-en@champion", "models:/zhpipe-tatoeba-en-zh@champion"):
        resolve(uri)  # one clear error when a translator is not registered yet
    rows = [run(int(seed), method, args) for seed in args.seeds.split(",") for method in METHODS]
    accuracy = pd.DataFrame([{k: r[k] for k in ("seed", "method", *args.models)} for r in rows])
    summary = accuracy.groupby("method", sort=False)[args.models].agg(["mean", "std"]).round(4)
    bt = [r for r in rows if r["method"] == "backtranslation"]
    acceptance = pd.DataFrame(
        [
            {
                "seed": r["seed"],
                "candidates": r["augment"].get("candidates", 0),
                "accepted": r["augment"]["rows_added"],
                "accepted_%": round(
                    100 * r["augment"]["rows_added"] / max(r["augment"].get("candidates", 0), 1), 1
                ),
                **{
                    k.removeprefix("filtered_"): v
                    for k, v in r["augment"].items()
                    if k.startswith("filtered_")
                },
                "method_used": r["used"],
            }
            for r in bt
        ]
    )
    sample = pd.read_csv(Path(bt[0]["augment_path"]) / "sample.csv")
    examples = pd.concat([sample[sample["kept"]].head(8), sample[~sample["kept"]].head(4)])[
        ["source", "pivot_text", "back_translation", "kept", "reason"]
    ]
    md = [
        "## Test accuracy per method (mean and std over seeds " + args.seeds + ")",
        "",
        summary.to_markdown(),
        "",
        "## Per seed",
        "",
        accuracy.to_markdown(index=False),
        "",
        "## Back-translations accepted by the filters",
        "",
        acceptance.to_markdown(index=False),
        "",
        f"## Examples (seed {bt[0]['seed']})",
        "",
        examples.to_markdown(index=False),
    ]
    text = "\n".join(md)
    print(text)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "bt_local.md").write_text(text + "\n", encoding="utf-8")
    (out / "bt_local.json").write_text(
        json.dumps(
            {
                "rows": [{k: v for k, v in r.items() if k != "augment_path"} for r in rows],
                "median_accepted_%": statistics.median(acceptance["accepted_%"]),
            },
            indent=2,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
