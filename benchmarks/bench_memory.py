"""Bounded memory on a large corpus: the data stages (download, clean, split) of `zhpipe run` on a
corpus of about 1 GB, with 1 and 2 clean workers, and the peak resident memory of every process (the
driver and each worker) next to the wall time. A smaller corpus is run too, so the table shows
whether memory grows with the corpus.

    python benchmarks/bench_memory.py [--sizes-mb 256,1024] [--workers 1,2] [--keep]

The corpus is the bundled ChnSentiCorp file repeated with variations until it reaches the size: each
copy tags every review with the copy's number (so copies are distinct rows), and 2% of each copy's
reviews are left untagged (exact duplicates, for the dedupe to find). Each run starts in fresh
stores and runs `zhpipe run chnsenticorp --source BIG.csv --to split --force --set clean.workers=N`
as a user would. Writes benchmarks/results/memory.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "data" / "raw" / "ChnSentiCorp_htl_all.csv"


def make_corpus(path: Path, megabytes: int, seed: int = 0) -> dict:
    """The bundled corpus repeated with variations up to `megabytes` MB; returns its rows and
    bytes."""
    with open(BUNDLED, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f))
    rng = random.Random(seed)
    target = megabytes * 1_000_000
    written = copies = 0
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f)
        out.writerow(["label", "review"])
        while written < target:
            lines = []
            for row in rows:
                text = (
                    row["review"]
                    if copies and rng.random() < 0.02
                    else f"{row['review']}（第{copies}批）"
                )
                lines.append((row["label"], text))
            out.writerows(lines)
            written = f.tell()
            copies += 1
    return {"bytes": path.stat().st_size, "rows": copies * len(rows), "copies": copies}


class Sampler(threading.Thread):
    """Polls a process tree's resident memory; keeps each process's peak (RSS) and what it was."""

    def __init__(self, pid: int, interval: float = 0.2):
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peaks: dict[int, dict] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    entry = self.peaks.setdefault(p.pid, {"rss": 0, "what": role(p, self.root)})
                    entry["rss"] = max(entry["rss"], rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            time.sleep(self.interval)


def role(p: psutil.Process, root: psutil.Process) -> str:
    """What a process of the run is: the driver, Prefect's server, or a worker of the chunk pool."""
    line = " ".join(p.cmdline())
    if p.pid == root.pid:
        return "driver (zhpipe run)"
    if "uvicorn" in line:
        return "Prefect server"
    if "forkserver" in line:  # the pool's workers are forked from it and keep its command line
        parent = p.parent()
        return (
            "pool worker"
            if parent is not None and "forkserver" in " ".join(parent.cmdline())
            else "pool forkserver"
        )
    if "resource_tracker" in line:
        return "resource tracker"
    return "pool worker" if "multiprocessing" in line else line[:60]


def run(corpus: Path, workers: int, tmp: Path) -> dict:
    env = {
        **os.environ,
        "ZHPIPE_DATA": str(tmp / "store"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "ZHPIPE_SERVER": "temporary",
    }
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        "chnsenticorp",
        "--source",
        str(corpus),
        "--text-column",
        "review",
        "--label-column",
        "label",
        "--to",
        "split",
        "--force",
        "--set",
        f"clean.workers={workers}",
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = Sampler(proc.pid)
    sampler.start()
    log = proc.communicate()[0]
    wall = time.perf_counter() - t0
    sampler.done.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"zhpipe run failed:\n{log[-3000:]}")
    seconds, rows = {}, {}
    for manifest in (tmp / "store").glob("*/*/manifest.json"):
        doc = json.loads(manifest.read_text(encoding="utf-8"))
        seconds[doc["stage"]] = round(doc["seconds"], 1)
        rows[doc["stage"]] = doc.get("metrics", {})
    peaks = sorted(
        (
            {"pid": pid, "peak_mb": round(e["rss"] / 2**20), "what": e["what"]}
            for pid, e in sampler.peaks.items()
        ),
        key=lambda e: -e["peak_mb"],
    )
    return {
        "workers": workers,
        "wall_s": round(wall, 1),
        "stages_s": seconds,
        "metrics": rows,
        "driver_peak_mb": next(e["peak_mb"] for e in peaks if e["pid"] == proc.pid),
        "max_process_peak_mb": peaks[0]["peak_mb"],
        "processes": peaks[:8],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="256,1024")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument(
        "--keep", action="store_true", help="keep the generated corpora (in the system temp folder)"
    )
    args = parser.parse_args()
    results = []
    tmpdir = Path(tempfile.mkdtemp(prefix="zhpipe-mem-"))
    try:
        for size in map(int, args.sizes_mb.split(",")):
            corpus = tmpdir / f"corpus-{size}mb.csv"
            facts = make_corpus(corpus, size)
            print(
                f"corpus {corpus.name}: {facts['bytes'] / 1e6:.0f} MB, {facts['rows']:,} rows",
                flush=True,
            )
            for workers in map(int, args.workers.split(",")):
                with tempfile.TemporaryDirectory(dir=tmpdir) as run_dir:
                    r = run(corpus, workers, Path(run_dir))
                r.update(corpus_mb=round(facts["bytes"] / 1e6), corpus_rows=facts["rows"])
                results.append(r)
                print(
                    f"  {workers} worker(s): {r['wall_s']} s wall, stages {r['stages_s']}, driver "
                    f"peak {r['driver_peak_mb']} MB, "
                    f"largest process peak {r['max_process_peak_mb']} MB",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(tmpdir)
    print(
        "\n| corpus | clean workers | wall | download | clean | split | driver peak RSS | largest "
        "other process | processes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        others = [e["peak_mb"] for e in r["processes"] if e["peak_mb"] != r["driver_peak_mb"]]
        s = r["stages_s"]
        print(
            f"| {r['corpus_mb']} MB ({r['corpus_rows']:,} rows) | {r['workers']} | {r['wall_s']} s "
            f"| {s.get('download')} s | "
            f"{s.get('clean')} s | {s.get('split')} s | {r['driver_peak_mb']} MB | "
            f"{max(others, default=0)} MB | {len(r['processes'])} |"
        )
    out = ROOT / "benchmarks" / "results" / "memory.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
