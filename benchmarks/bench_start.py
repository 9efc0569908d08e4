"""When a cold `zhpipe run` starts its first stage, and when it ends, for two checkouts of zhpipe
side by side (alternating rounds, each in fresh stores, a Prefect home of each checkout's own kept
across its rounds): what a change to the start of a run gains. Both run with this interpreter and
its packages.

git worktree add /tmp/base <commit> python benchmarks/bench_start.py /tmp/base . [--rounds 4]
[--server temporary|background]

The first round of each checkout migrates its new Prefect home; the medians are of the rounds after
it."""

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

from bench_cold import SETS

STAGES: dict[Path, dict[str, list[float]]] = {}  # per checkout, each stage's seconds in each round


def one_run(checkout: Path, home: str, server: str) -> tuple[float, float]:
    """(seconds to the first stage's start, seconds to exit) of one cold run of the default
    pipeline."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ZHPIPE_WARM")}
        env.update(
            {
                "ZHPIPE_DATA": f"{tmp}/store",
                "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db",
                "ZHPIPE_WARM": "off",
                "ZHPIPE_SERVER": server,
                "PREFECT_HOME": home,
                "ZHPIPE_USER_CACHE": f"{home}/user-cache",  # MLflow's schema: the first round
            }
        )
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "run", "chnsenticorp", "--force", *SETS],
            cwd=checkout,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        first = None
        for line in proc.stdout:
            if first is None and re.search(r"zhpipe [\w.]+: building", line):
                first = time.perf_counter() - t0
        if proc.wait():
            raise SystemExit(f"zhpipe run in {checkout} failed")
        done = time.perf_counter() - t0
        for manifest in Path(tmp, "store").glob("*/*/manifest.json"):
            doc = json.loads(manifest.read_text(encoding="utf-8"))
            STAGES.setdefault(checkout, {}).setdefault(doc["stage"], []).append(doc["seconds"])
        return first or float("nan"), done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--server", default="temporary", choices=("temporary", "background"))
    args = parser.parse_args()
    checkouts = [args.base.resolve(), args.new.resolve()]
    times: dict[Path, list[tuple[float, float]]] = {c: [] for c in checkouts}
    with tempfile.TemporaryDirectory() as homes:
        for r in range(args.rounds):
            for checkout in checkouts if r % 2 == 0 else checkouts[::-1]:
                got = one_run(checkout, f"{homes}/{checkouts.index(checkout)}", args.server)
                times[checkout].append(got)
                first, done = got
                said = f"first stage at {first:.1f} s, done at {done:.1f} s"
                print(f"round {r + 1}: {checkout}: {said}", file=sys.stderr)
        if args.server == "background":
            for i, checkout in enumerate(checkouts):
                subprocess.run(
                    [sys.executable, "-m", "flows.cli", "server", "stop"],
                    cwd=checkout,
                    env={**os.environ, "PREFECT_HOME": f"{homes}/{i}"},
                    capture_output=True,
                )
    print("\n| checkout | first stage at (median s) | whole run (median s) |\n|---|---|---|")
    for checkout, got in times.items():
        later = got[1:] or got
        print(
            f"| {checkout} | {statistics.median(g[0] for g in later):.1f} | "
            f"{statistics.median(g[1] for g in later):.1f} |"
        )
    heading = " | ".join(str(c) for c in checkouts)
    print(f"\n| stage (median s of all rounds) | {heading} |\n|---|---|---|")
    for name in STAGES.get(checkouts[1], {}):
        seconds = [STAGES.get(c, {}).get(name, [float("nan")]) for c in checkouts]
        print(f"| {name} | " + " | ".join(f"{statistics.median(s):.1f}" for s in seconds) + " |")


if __name__ == "__main__":
    main()
