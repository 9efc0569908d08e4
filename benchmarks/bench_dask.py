"""Segmentation of a large corpus: one process vs a 2-worker local Dask cluster (Prefect's Dask task
runner).

The bundled ChnSentiCorp reviews are repeated until the text reaches --mb megabytes (UTF-8), written
as the split stage writes its Parquet files (row groups of 20,000 rows), and segmented by the
segment stage's own code (`tasks.shared.segment.segment_file`), once in one process and once on the
cluster, each in a fresh subprocess. Reported: wall time, the ratio, the peak memory (VmHWM) of
every process that segmented, and whether the two output files are byte-identical. Run at a second,
smaller size (--small-mb) it shows whether a worker's memory follows the chunk size or the corpus
size.

    python benchmarks/bench_dask.py                  # 200 MB and 50 MB, chunks of 5,000 rows
    python benchmarks/bench_dask.py --mb 20 --small-mb 5   # a quick look
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
_TMP = Path(tempfile.mkdtemp(prefix="zhpipe-bench-dask-"))
os.environ.setdefault("PREFECT_HOME", str(_TMP / "prefect"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
RESULTS = ROOT / "benchmarks" / "results"


def make_corpus(mb: float, path: Path) -> dict:
    """Repeat the bundled reviews until the text is `mb` MB; written with the stages' row groups."""
    import pandas as pd

    from tasks.util.io import write_parquet

    reviews = (
        pd.read_csv(ROOT / "data" / "raw" / "ChnSentiCorp_htl_all.csv")["review"]
        .fillna("")
        .astype(str)
        .tolist()
    )
    per_copy = sum(len(t.encode("utf-8")) for t in reviews)
    copies = max(1, -(-int(mb * 1e6) // per_copy))
    texts = reviews * copies
    write_parquet(pd.DataFrame({"id": range(len(texts)), "text": texts}), path)
    return {
        "rows": len(texts),
        "text_mb": round(per_copy * copies / 1e6, 1),
        "parquet_mb": round(path.stat().st_size / 1e6, 1),
    }


def child(mode: str, src: str, dst: str, chunk_rows: int, workers: int) -> None:
    """One measured segmentation in this (fresh) process; prints a JSON line."""
    from prefect import flow

    from flows.pools.chunks import DaskPool, shutdown
    from tasks.shared.segment import Params as SegmentConfig
    from tasks.shared.segment import segment_file
    from tasks.util.pool import ChunkPool, peak_rss_mb

    @flow(name="bench-dask-warmup")
    def warmup():  # starts Prefect's temporary server outside the timed part
        return 1

    warmup()
    pool = (
        DaskPool("local", workers)
        if mode == "dask"
        else ChunkPool(1 if mode == "single" else workers)
    )
    t0 = time.perf_counter()
    counts = segment_file(
        Path(src), Path(dst), SegmentConfig(chunk_rows=chunk_rows), pool, ROOT, desc=mode
    )
    seconds = time.perf_counter() - t0
    shutdown()
    per_process: dict[int, float] = {}
    for r in pool.ran_on:
        per_process[r["pid"]] = max(per_process.get(r["pid"], 0.0), r["max_rss_mb"])
    print(
        json.dumps(
            {
                "mode": mode,
                "seconds": seconds,
                "rows": counts["rows"],
                "chunks": len(pool.ran_on),
                "segmenting_processes_max_rss_mb": sorted(
                    round(v, 1) for v in per_process.values()
                ),
                "driver_max_rss_mb": round(peak_rss_mb(), 1),
            }
        )
    )


def measure(mode: str, src: Path, dst: Path, chunk_rows: int, workers: int) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--src",
            str(src),
            "--dst",
            str(dst),
            "--chunk-rows",
            str(chunk_rows),
            "--workers",
            str(workers),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["sha256"] = hashlib.sha256(dst.read_bytes()).hexdigest()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mb", type=float, default=200, help="corpus size in MB of UTF-8 text (default 200)"
    )
    parser.add_argument(
        "--small-mb", type=float, default=50, help="a second, smaller corpus (0 = none; default 50)"
    )
    parser.add_argument(
        "--chunk-rows",
        type=int,
        default=5000,
        help="rows per chunk (segment.chunk_rows; default 5000)",
    )
    parser.add_argument("--workers", type=int, default=2, help="Dask workers (default 2)")
    parser.add_argument("--child", choices=["single", "dask"], help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--dst", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.src, args.dst, args.chunk_rows, args.workers)
        return

    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    sizes = [args.mb] + ([args.small_mb] if args.small_mb else [])
    rows = []
    for mb in sizes:
        src = _TMP / f"corpus-{mb:g}.parquet"
        corpus = make_corpus(mb, src)
        console.print(f"corpus {mb:g} MB: {corpus}")
        single = measure("single", src, _TMP / f"single-{mb:g}.parquet", args.chunk_rows, 1)
        console.print(f"  one process: {single['seconds']:.1f} s")
        dask = measure("dask", src, _TMP / f"dask-{mb:g}.parquet", args.chunk_rows, args.workers)
        console.print(f"  dask x{args.workers}: {dask['seconds']:.1f} s")
        rows.append(
            {
                "corpus": corpus,
                "single": single,
                "dask": dask,
                "speedup": single["seconds"] / dask["seconds"],
                "identical": single["sha256"] == dask["sha256"],
            }
        )
        for p in (src, _TMP / f"single-{mb:g}.parquet", _TMP / f"dask-{mb:g}.parquet"):
            p.unlink()

    table = Table(
        title=f"segmentation: one process vs {args.workers}-worker local Dask cluster (chunks of "
        f"{args.chunk_rows} rows)"
    )
    for col in (
        "text MB",
        "rows",
        "one process s",
        "dask s",
        "speedup",
        "identical",
        "one process max RSS MB",
        "dask workers max RSS MB",
        "dask driver max RSS MB",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['corpus']['text_mb']:g}",
            f"{r['corpus']['rows']:,}",
            f"{r['single']['seconds']:.1f}",
            f"{r['dask']['seconds']:.1f}",
            f"{r['speedup']:.2f}x",
            "yes" if r["identical"] else "NO",
            ", ".join(f"{v:.0f}" for v in r["single"]["segmenting_processes_max_rss_mb"]),
            ", ".join(f"{v:.0f}" for v in r["dask"]["segmenting_processes_max_rss_mb"]),
            f"{r['dask']['driver_max_rss_mb']:.0f}",
        )
    console.print(table)
    if len(rows) == 2:
        big, small = (max(r["dask"]["segmenting_processes_max_rss_mb"]) for r in rows)
        console.print(
            f"worker peak memory at {rows[0]['corpus']['text_mb']:g} MB vs "
            f"{rows[1]['corpus']['text_mb']:g} MB of text: "
            f"{big:.0f} vs {small:.0f} MB ({big / small:.2f}x for "
            f"{rows[0]['corpus']['text_mb'] / rows[1]['corpus']['text_mb']:.1f}x the text)"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "dask_segment.json"
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "cpu_count": os.cpu_count(),
                "rows": rows,
                "median_speedup": statistics.median(r["speedup"] for r in rows),
            },
            indent=2,
        )
    )
    console.print(f"written {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
