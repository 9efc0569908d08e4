"""A registered model under load on loopback: `mlflow models serve` driven by concurrent clients for
a bounded time (throughput, p50/p99 latency, errors, the server's peak memory), then `zhpipe predict
--input` on a file of the same reviews (rows/s, peak memory), and one hostile request (a long text
among many empty ones) to show what the limit in front of the server has to bound.

    zhpipe run              # or any pipeline: its model is models:/zhpipe-<pipeline>@champion
    python benchmarks/bench_serve.py [--model models:/zhpipe-chnsenticorp@champion] [--clients \\
        1,4,8] [--seconds 20] [--batch 8] [--rows 5000]

Writes benchmarks/results/serve.json; docs/results/serving.md has the figures and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd
import psutil

REVIEWS = ROOT / "data" / "raw" / "ChnSentiCorp_htl_all.csv"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PeakMemory:
    """Peak resident memory of a process and its children, sampled every 0.1 s."""

    def __init__(self, pid: int):
        self.proc, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                procs = [self.proc, *self.proc.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in procs))
            except psutil.Error:
                pass
            time.sleep(0.1)

    def current(self) -> int:
        try:
            return sum(
                p.memory_info().rss for p in [self.proc, *self.proc.children(recursive=True)]
            )
        except psutil.Error:
            return 0

    def stop(self) -> int:
        self._stop.set()
        self.thread.join()
        return self.peak


def post(url: str, texts: list[str], timeout: float = 60) -> tuple[int, float]:
    body = json.dumps({"inputs": texts}, ensure_ascii=False).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        status = e.code
    except OSError:
        status = -1
    return status, time.perf_counter() - t0


def load(url: str, texts: list[str], clients: int, seconds: float, batch: int) -> dict:
    """`clients` threads sending batches of `batch` texts for `seconds`."""
    latencies, errors, lock = [], [0], threading.Lock()
    deadline = time.monotonic() + seconds

    def client(offset: int):
        i = offset
        while time.monotonic() < deadline:
            chunk = [texts[(i + k) % len(texts)] for k in range(batch)]
            status, dt = post(url, chunk)
            with lock:
                latencies.append(dt)
                errors[0] += status != 200
            i += batch * clients

    threads = [threading.Thread(target=client, args=(c * batch,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ordered = sorted(latencies)
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": errors[0],
        "texts_per_s": len(latencies) * batch / wall,
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="models:/zhpipe-chnsenticorp@champion")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument(
        "--rows", type=int, default=5000, help="reviews in the zhpipe predict --input file"
    )
    args = ap.parse_args()
    texts = pd.read_csv(REVIEWS)["review"].dropna().astype(str).tolist()
    port = free_port()
    from flows.track.tracker import tracking_uri

    # MLflow starts `uvicorn` by name: the environment's scripts first on PATH
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "models",
            "serve",
            "-m",
            args.model,
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    memory = PeakMemory(server.pid)
    url = f"http://127.0.0.1:{port}/invocations"
    try:
        deadline = time.monotonic() + 180
        while post(url, ["你好"], timeout=5)[0] != 200:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"mlflow models serve did not answer on {url}")
            time.sleep(1)
        idle = memory.current()
        rows = [load(url, texts, int(c), args.seconds, args.batch) for c in args.clients.split(",")]
        loaded = memory.peak
        # one request of 2,000 texts: one of 20,000 characters, the rest empty (a 60 KB body)
        status, dt = post(url, ["好" * 20_000] + [""] * 1999, timeout=300)
        hostile = {"status": status, "seconds": dt, "peak_mb_after": memory.peak / 2**20}
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        memory.stop()
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.csv", Path(tmp) / "out.csv"
        pd.DataFrame({"text": (texts * (args.rows // len(texts) + 1))[: args.rows]}).to_csv(
            src, index=False
        )
        t0 = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "flows.cli",
                "predict",
                "--model",
                args.model,
                "--input",
                str(src),
                "--output",
                str(dst),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        predict_s = time.perf_counter() - t0
        # KiB -> MiB (Linux)
        predict_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        assert done.returncode == 0, done.stderr[-2000:]
    table = pd.DataFrame(rows)
    print(
        f"mlflow models serve, {args.model}, batches of {args.batch} reviews, {args.seconds:g} s "
        "per row, 1 worker, loopback"
    )
    print(table.round(1).to_markdown(index=False))
    print(f"server memory: {idle / 2**20:.0f} MB idle, {loaded / 2**20:.0f} MB peak under load")
    print(
        "hostile request (1 text of 20,000 characters and 1,999 empty ones): HTTP "
        f"{hostile['status']} in {hostile['seconds']:.1f} s, "
        f"server peak {hostile['peak_mb_after']:.0f} MB"
    )
    print(
        f"zhpipe predict --input ({args.rows} reviews): {predict_s:.1f} s wall, "
        f"{args.rows / predict_s:.0f} rows/s "
        f"including start-up, peak {predict_peak:.0f} MB"
    )
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(
        json.dumps(
            {
                "load": rows,
                "idle_mb": idle / 2**20,
                "peak_mb": loaded / 2**20,
                "hostile": hostile,
                "predict": {"rows": args.rows, "seconds": predict_s, "peak_mb": predict_peak},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
