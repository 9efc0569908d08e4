"""The segment stage's row cache at scale: what filling it costs on a first build, and what it saves
on an edited copy of the source. Side by side, in one run, each in a fresh project of its own:

    python benchmarks/bench_row_cache.py --mb 300 [--baseline COMMIT] [--out FILE]

- `off`: `zhpipe run --to segment` with `segment.row_cache=false` (no cache: the cost of cutting);
- `fill`: the same with the row cache (every row cut and kept);
- `edited`: then the same project on a copy of the corpus with 1% of its rows edited (the cache
  answers the other 99%);
- with `--baseline COMMIT`, `fill` again with that commit's code (checked out with `git worktree`).

The corpus is bench_scale.py's (unique two-review rows made from the bundled reviews). The segment
stage's seconds are its `seconds` in the run summary; its metrics say how many rows it cut and
reused; `peak_mb` is the run's own process's peak resident memory. Writes the figures as JSON
with `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_scale import make_corpus

PIPELINE = """pipelines:
  cache:
    source: {path: data/raw/reviews.csv, text_column: review, label_column: label}
"""


def run(code: Path, project: Path, sets: list[str]) -> dict:
    """`zhpipe run cache --to segment` in `project` with `code`; the segment stage's figures."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_"))
    }
    env.update(PYTHONPATH=str(code), ZHPIPE_SERVER="temporary", ZHPIPE_WARM="off")
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    args = [sys.executable, "-c", SUMMARY, str(project), *sets]
    done = subprocess.run(args, cwd=project, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"zhpipe run failed in {project}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# the run through the Python API, which returns the summary (seconds and metrics per stage)
SUMMARY = """
import json, resource, sys
from flows import api
stages = ["download", "clean", "split", "segment"]
out = api.run("cache", overrides=sys.argv[2:], stages=stages, project=sys.argv[1])
stage = next(s for s in out["stages"] if s["stage"] == "segment")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the driver's, MB
figures = {"seconds": stage["seconds"], "metrics": stage.get("metrics", {}), "peak_mb": peak}
print(json.dumps(figures))
"""


def project(work: Path, name: str, corpus: Path) -> Path:
    folder = work / name
    (folder / "data" / "raw").mkdir(parents=True)
    shutil.copy(corpus, folder / "data" / "raw" / "reviews.csv")
    (folder / "pipelines.yaml").write_text(PIPELINE, encoding="utf-8")
    return folder


def edit(corpus: Path, share: float = 0.01) -> None:
    """Edit `share` of the rows in place (every 100th row gets a word appended)."""
    lines = corpus.read_text(encoding="utf-8").split("\n")
    step = round(1 / share)
    for i in range(1, len(lines), step):
        if lines[i].endswith('"'):
            lines[i] = lines[i][:-1] + ' 另外"'
    corpus.write_text("\n".join(lines), encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=300)
    ap.add_argument("--baseline", help="a commit whose row cache to fill side by side")
    ap.add_argument("--out")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zhpipe-rowcache-"))
    corpus = work / "reviews.csv"
    rows, mb = make_corpus(args.mb, corpus)
    print(f"corpus: {rows:,} rows, {mb:.0f} MB", flush=True)
    figures = {"rows": rows, "mb": mb}
    figures["off"] = run(ROOT, project(work, "off", corpus), ["segment.row_cache=false"])
    print("off ", figures["off"]["seconds"], "s", flush=True)
    filled = project(work, "fill", corpus)
    figures["fill"] = run(ROOT, filled, [])
    print("fill", figures["fill"]["seconds"], "s", flush=True)
    edit(filled / "data" / "raw" / "reviews.csv")
    figures["edited"] = run(ROOT, filled, [])
    print("edited", figures["edited"]["seconds"], "s", figures["edited"]["metrics"], flush=True)
    if args.baseline:
        code = work / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "-f", "--detach", str(code), args.baseline],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            figures["baseline_fill"] = run(code, project(work, "base", corpus), [])
            print("baseline fill", figures["baseline_fill"]["seconds"], "s", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(code)], cwd=ROOT)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2), encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
