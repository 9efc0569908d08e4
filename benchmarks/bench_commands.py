"""Everyday commands, side by side with a baseline version: wall time of `zhpipe status`, `stages`,
`pipelines`, `models`, `runs`, `--help` (and, with --run, a fully cached `zhpipe run`), each measured as a
fresh process, alternating between this checkout and the baseline (a git ref checked out in a temporary
worktree) so that both see the same machine. Prints medians and ratios; writes benchmarks/results/commands.json.

    python benchmarks/bench_commands.py --baseline ea483db --rounds 5 [--run]

Both versions use this checkout's environment and project (its pipelines.yaml, stage store and MLflow
store): run `zhpipe run` once first so that `status` and `runs` have something to read.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [["status"], ["stages"], ["pipelines"], ["models"], ["runs"], ["--help"]]


def timed(code: Path, args: list[str]) -> float:
    """Seconds for one `python -m flows.cli ARGS` run of the code in `code`, in this project."""
    env = {**os.environ, "ZHPIPE_PROJECT": str(ROOT), "PYTHONPATH": str(code)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=code, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{code}: zhpipe {' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git ref of the version to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--run", action="store_true", help="also time a fully cached `zhpipe run` of the default pipeline")
    args = parser.parse_args()
    commands = COMMANDS + ([["run"]] if args.run else [])
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT, check=True, capture_output=True)
        try:
            for code in (ROOT, base):  # warm the file cache and the bytecode of both before timing
                timed(code, ["stages"])
                if args.run:  # and build what each version's keys name, so that every timed run is fully cached
                    timed(code, ["run"])
            times: dict[str, dict[str, list[float]]] = {" ".join(c): {"zhpipe": [], "baseline": []} for c in commands}
            for r in range(args.rounds):
                for c in commands:
                    order = [("zhpipe", ROOT), ("baseline", base)] if r % 2 == 0 else [("baseline", base), ("zhpipe", ROOT)]
                    for name, code in order:
                        times[" ".join(c)][name].append(timed(code, c))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    rows = []
    print(f"\n| command | zhpipe (median s) | baseline {args.baseline} (median s) | ratio |\n|---|---|---|---|")
    for command, t in times.items():
        now, before = statistics.median(t["zhpipe"]), statistics.median(t["baseline"])
        rows.append({"command": command, "zhpipe_s": now, "baseline_s": before, "ratio": now / before, "runs": t})
        print(f"| `zhpipe {command}` | {now:.2f} | {before:.2f} | {now / before:.2f} |")
    out = ROOT / "benchmarks" / "results" / "commands.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"baseline": args.baseline, "rounds": args.rounds, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
