"""A corpus of N MB made from the bundled reviews, run end to end with the cheap models, measured
per stage: seconds, MB/s and the peak memory of each process (the driver and every worker it
starts).

    python benchmarks/bench_scale.py --mb 30                     # tfidf_lr + fasttext
    python benchmarks/bench_scale.py --mb 300 --out benchmarks/results/scale_300.json
    # any --set of `zhpipe run`
    python benchmarks/bench_scale.py --mb 1024 --set embed.word2vec.epochs=1

Rows are unique: each is a real review followed by another real review of the same label (pairs
drawn with a fixed seed, repeated pairs dropped). The run is `zhpipe run` in a project of its own,
in a subprocess; the process tree's memory is sampled every 0.2 s and each sample is charged to the
stage whose `<stage>: building` line came last."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_corpus(mb: float, path: Path, seed: int = 5) -> tuple[int, float]:
    """Unique two-review rows of one label each, until the file holds `mb` MB; returns (rows,
    MB)."""
    import numpy as np
    import pandas as pd

    base = pd.read_csv(ROOT / "data/raw/ChnSentiCorp_htl_all.csv", dtype=str).dropna()
    rng = np.random.default_rng(seed)
    by_label = {label: part["review"].tolist() for label, part in base.groupby("label")}
    target, size, rows, seen = mb * 2**20, 0, 0, set()
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("label,review\n")
        while size < target:
            label = rng.choice(list(by_label))
            texts = by_label[label]
            i, j = rng.integers(len(texts), size=2)
            if (i, j) in seen:
                continue
            seen.add((i, j))
            text = (texts[i] + " " + texts[j]).replace('"', '""')
            line = f'{label},"{text}"\n'
            f.write(line)
            size += len(line.encode("utf-8"))
            rows += 1
    return rows, size / 2**20


def process_tree_rss(pid: int) -> dict[int, tuple[str, int]]:
    """pid -> (command, RSS bytes) of a process and all its descendants."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out = {}
    for p in procs:
        try:
            out[p.pid] = (" ".join(p.cmdline()[:3])[:80], p.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=30)
    ap.add_argument("--models", default="tfidf_lr,fasttext")
    ap.add_argument("--keep", action="store_true", help="keep the project folder")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        dest="sets",
        metavar="KEY=VALUE",
        help="a `zhpipe run --set` (repeatable)",
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix=f"zhpipe-scale-{args.mb:g}mb-"))
    (work / "data" / "raw").mkdir(parents=True)
    rows, mb = make_corpus(args.mb, work / "data" / "raw" / "reviews.csv")
    print(f"corpus: {rows:,} unique rows, {mb:.1f} MB in {work}", flush=True)
    (work / "pipelines.yaml").write_text(
        "pipelines:\n  scale:\n    source: {path: data/raw/reviews.csv, text_column: review, "
        "label_column: label}\n"
        f"    stages:\n      augment: {{method: eda, num_aug: 1}}\n      train: {{models: "
        f"[{args.models}]}}\n",
        encoding="utf-8",
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_API"))
    }
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    # the run's own temporary server, stopped with it (none left behind)
    env["ZHPIPE_SERVER"] = "temporary"
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        "scale",
        *[x for kv in args.sets for x in ("--set", kv)],
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    current = {"stage": "start-up"}
    peaks: dict[str, dict[int, tuple[str, int]]] = {}
    starts: dict[str, float] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid, (what, rss) in process_tree_rss(proc.pid).items():
                stage = peaks.setdefault(current["stage"], {})
                if rss > stage.get(pid, ("", 0))[1]:
                    stage[pid] = (what, rss)
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()
    building = re.compile(r"zhpipe(?:\.\w+)? (\w+)(?:\.\w+)?: building")
    t0 = time.perf_counter()
    log = []
    for line in proc.stdout:
        log.append(line)
        found = building.search(line)
        if found and found.group(1) != current["stage"]:
            current["stage"] = found.group(1)
            starts.setdefault(current["stage"], time.perf_counter() - t0)
            print(f"  {time.perf_counter() - t0:7.1f} s  {current['stage']}", flush=True)
    proc.wait()
    wall = time.perf_counter() - t0
    done.set()
    if proc.returncode:
        print("".join(log[-40:]))
        raise SystemExit(f"zhpipe run failed with {proc.returncode}")
    order = list(starts)
    seconds = {
        s: (starts[order[i + 1]] if i + 1 < len(order) else wall) - starts[s]
        for i, s in enumerate(order)
    }
    result = {"mb": mb, "rows": rows, "wall_s": wall, "sets": args.sets, "stages": {}}
    print(
        "\n| stage | seconds | MB/s | peak RSS, largest process | processes "
        "|\n|---|---|---|---|---|"
    )
    for stage in order:
        procs = peaks.get(stage, {})
        top = max(procs.values(), key=lambda v: v[1], default=("", 0))
        result["stages"][stage] = {
            "seconds": seconds[stage],
            "mb_per_s": mb / seconds[stage] if seconds[stage] else None,
            "peak_rss_mb": top[1] / 2**20,
            "peak_process": top[0],
            "processes": len(procs),
        }
        print(
            f"| {stage} | {seconds[stage]:.1f} | {mb / seconds[stage]:.2f} | {top[1] / 2**20:,.0f} "
            f"MB | {len(procs)} |"
        )
    overall = max((v[1] for p in peaks.values() for v in p.values()), default=0)
    result["peak_rss_mb"] = overall / 2**20
    print(
        f"\n{mb:.1f} MB, {rows:,} rows: {wall:.0f} s wall, peak of one process "
        f"{overall / 2**20:,.0f} MB"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
