"""What a corpus of 60k+ rows costs a newcomer's project, step by step, on `zhpipe init --csv` as
written:

1. the first `zhpipe run` (the template's budget): the training stage's wall time against its
   budget, the models it trained and those it left untrained, the chosen model's test accuracy
   against tfidf_lr's on the same split;
2. the fully cached rerun (three times; the median);
3. the first pipeline run to the embed stage (its word vectors), then a second pipeline over the
   same file that differs only in its label column (`label2`, the same classes renamed), run to the
   embed stage: which stages it rebuilt, which it reused by content, and how many rows its segment
   stage cut again;
4. the source replaced by an edited copy (1% of the rows changed), run to the segment stage: the
   rows cut again and the stage's seconds, against the first run's segment stage.

    python benchmarks/bench_corpus_cost.py [--rows 62000] [--edited 0.01]

The corpus is benchmarks/corpora.py's `pairs` (unique two-review texts of one label, made from the
bundled hotel reviews; nothing of it is committed). Each step is `zhpipe` in a process of its own,
as a user types it. Writes benchmarks/results/corpus_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
SPENT = re.compile(r"train: the models took (\d+) s of the (\d+) s budget")


def zhpipe(project: Path, env: dict, *args: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"zhpipe {' '.join(args)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return wall, done.stdout + done.stderr


def newest(store: Path, unit: str) -> dict:
    folders = [p for p in (store / unit).iterdir() if (p / "manifest.json").is_file()]
    folder = max(folders, key=lambda p: p.stat().st_mtime)
    return {"path": folder, **json.loads((folder / "manifest.json").read_text(encoding="utf-8"))}


def built(log: str) -> list[str]:
    return sorted(set(re.findall(r"zhpipe ([\w.]+): building", log)))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=62_000)
    ap.add_argument(
        "--edited", type=float, default=0.01, help="share of rows the edited copy changes"
    )
    args = ap.parse_args()
    import pandas as pd
    from corpora import pairs

    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_"))
    }
    env["PYTHONPATH"] = str(ROOT)
    result: dict = {"rows": args.rows}
    with tempfile.TemporaryDirectory(
        prefix="zhpipe-bench-cost-", ignore_cleanup_errors=True
    ) as tmp:
        frame = pairs(args.rows)
        frame["label2"] = frame["label"].map({"0": "negative", "1": "positive"})
        csv = Path(tmp) / "reviews.csv"
        frame.to_csv(csv, index=False)
        project = Path(tmp) / "p"
        subprocess.run(
            [sys.executable, "-m", "flows.cli", "init", str(project), "--csv", str(csv)],
            env=env,
            check=True,
            capture_output=True,
        )
        store = project / "data"
        config = project / "pipelines.yaml"
        name = (
            config.read_text(encoding="utf-8").split("pipelines:\n", 1)[1].split(":", 1)[0].strip()
        )

        wall, log = zhpipe(project, env, "run")  # 1: the first run
        spent = SPENT.search(log)
        comparison = pd.read_csv(
            newest(store, "evaluate")["path"] / "comparison.csv", dtype={"budget": str}
        )
        rows = comparison.astype(object).where(comparison.notna(), "").to_dict(orient="records")
        chosen = json.loads(
            (newest(store, "evaluate")["path"] / "chosen.json").read_text(encoding="utf-8")
        )["model"]
        result["first_run"] = {
            "wall_s": round(wall, 1),
            "training_s": float(spent.group(1)) if spent else None,
            "budget_s": float(spent.group(2)) if spent else None,
            "comparison": rows,
            "chosen": chosen,
            "chosen_test_accuracy": next(r["test_accuracy"] for r in rows if r["model"] == chosen),
            "tfidf_lr_test_accuracy": next(
                (r["test_accuracy"] for r in rows if r["model"] == "tfidf_lr"), None
            ),
            "not_trained": [
                r["model"] for r in rows if str(r.get("budget", "")).startswith("not trained")
            ],
            "segment_s": newest(store, "segment")["seconds"],
        }
        print(json.dumps(result["first_run"], indent=1), flush=True)

        cached = [zhpipe(project, env, "run")[0] for _ in range(3)]  # 2: fully cached
        result["cached_run_s"] = {
            "runs": [round(c, 2) for c in cached],
            "median": round(statistics.median(cached), 2),
        }
        print("cached:", result["cached_run_s"], flush=True)

        # 3: a pipeline that differs only in its label column
        yaml = config.read_text(encoding="utf-8")
        body = yaml.split("pipelines:\n", 1)[1].split("\n", 1)[1]
        other = re.sub(r'label_column: "?label"?', "label_column: label2", body)
        assert other != body, "the template's label_column line was not found"
        config.write_text(yaml + f"  {name}-label2:\n" + other, encoding="utf-8")
        # the first pipeline's word vectors (the template's models do not read them)
        first_embed = zhpipe(project, env, "run", "--to", "embed")[0]
        wall, log = zhpipe(project, env, "run", f"{name}-label2", "--to", "embed")
        segment = newest(store, "segment")
        result["label_only"] = {
            "first_pipeline_to_embed_s": round(first_embed, 1),
            "wall_s": round(wall, 1),
            "built": built(log),
            "reused_by_content": sorted(
                set(re.findall(r"zhpipe ([\w.]+): reused by content", log))
            ),
            "rows_segmented": segment["metrics"].get("rows_segmented"),
            "rows_reused": segment["metrics"].get("rows_reused"),
            "segment_s": segment["seconds"],
        }
        print("label only:", result["label_only"], flush=True)

        # 4: an edited copy
        raw = next(p for p in (project / "data" / "raw").iterdir() if p.suffix == ".csv")
        edited = pd.read_csv(raw, dtype=str)
        changed = edited.sample(frac=args.edited, random_state=3).index
        edited.loc[changed, "text"] = edited.loc[changed, "text"] + "（已编辑）"
        edited.to_csv(raw, index=False)
        from tasks.util.io import file_sha256

        config.write_text(
            re.sub(
                r"sha256: [0-9a-f]{64}",
                f"sha256: {file_sha256(raw)}",
                config.read_text(encoding="utf-8"),
            ),
            encoding="utf-8",
        )
        wall, log = zhpipe(project, env, "run", "--to", "segment")
        segment = newest(store, "segment")
        result["edited_copy"] = {
            "rows_changed": len(changed),
            "wall_s": round(wall, 1),
            "built": built(log),
            "rows_segmented": segment["metrics"].get("rows_segmented"),
            "rows_reused": segment["metrics"].get("rows_reused"),
            "segment_s": segment["seconds"],
        }
        print("edited copy:", result["edited_copy"], flush=True)
        out = ROOT / "benchmarks" / "results" / "corpus_cost.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
        subprocess.run(
            [sys.executable, "-m", "flows.cli", "server", "stop"],
            cwd=project,
            env=env,
            capture_output=True,
        )


if __name__ == "__main__":
    main()
