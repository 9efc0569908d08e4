"""Everyday commands, side by side with a baseline version: wall time of `zhpipe status`, `stages`,
`pipelines`, `models`, `runs`, `--help` (and, with --run, a fully cached `zhpipe run`), each
measured as a fresh process, alternating between this checkout and the baseline (a git ref checked
out in a temporary worktree) so that both see the same machine. Prints medians and ratios; writes
benchmarks/results/commands.json.

    python benchmarks/bench_commands.py --baseline ea483db --rounds 5 [--run] [--cold]

Both versions use this checkout's environment and project (its pipelines.yaml, stage store and
MLflow store): run `zhpipe run` once first so that `status` and `runs` have something to read. Each
version keeps a Prefect home of its own (this checkout the project's `.prefect/`, the baseline a
temporary one), so that each has its own background server and warm process and neither replaces the
other's. `--cold` adds each command with `ZHPIPE_WARM=off` (every command in its own process, no
resident process).
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


HOMES: dict[Path, str] = {}  # a version's own Prefect home (the baseline's), by its code folder


def timed(code: Path, args: list[str], extra: dict | None = None) -> float:
    """Seconds for one `python -m flows.cli ARGS` run of the code in `code`, in this project."""
    env = {**os.environ, "ZHPIPE_PROJECT": str(ROOT), "PYTHONPATH": str(code), **(extra or {})}
    if code in HOMES:
        env["PREFECT_HOME"] = HOMES[code]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{code}: zhpipe {' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1:]}"
        )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", required=True, help="a git ref of the version to compare with"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--run",
        action="store_true",
        help="also time a fully cached `zhpipe run` of the default pipeline",
    )
    parser.add_argument(
        "--cold", action="store_true", help="also time each command with ZHPIPE_WARM=off"
    )
    args = parser.parse_args()
    commands = COMMANDS + ([["run"]] if args.run else [])
    variants = [(c, {}) for c in commands] + (
        [(c, {"ZHPIPE_WARM": "off"}) for c in commands if c[0] in ("run", "status")]
        if args.cold
        else []
    )
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        HOMES[base] = str(Path(tmp) / "baseline-prefect")
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base), args.baseline],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            for code in (ROOT, base):  # warm the file cache and the bytecode of both before timing
                timed(code, ["stages"])
                # and build what each version's keys name, so that every timed run is fully cached
                if args.run:
                    timed(code, ["run"])
            # the first runs left each version's server and warm process: a second run finds them
            # ready
            if args.run:
                for code in (ROOT, base):
                    timed(code, ["run"])
            label = lambda c, extra: " ".join(c) + (" (ZHPIPE_WARM=off)" if extra else "")
            times: dict[str, dict[str, list[float]]] = {
                label(c, e): {"zhpipe": [], "baseline": []} for c, e in variants
            }
            for r in range(args.rounds):
                for c, extra in variants:
                    order = (
                        [("zhpipe", ROOT), ("baseline", base)]
                        if r % 2 == 0
                        else [("baseline", base), ("zhpipe", ROOT)]
                    )
                    for name, code in order:
                        times[label(c, extra)][name].append(timed(code, c, extra))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            # each version's background server and warm process
            for code in (base, ROOT) if args.run else ():
                subprocess.run(
                    [sys.executable, "-m", "flows.cli", "server", "stop"],
                    cwd=code,
                    capture_output=True,
                    env={
                        **os.environ,
                        "ZHPIPE_PROJECT": str(ROOT),
                        "PYTHONPATH": str(code),
                        **({"PREFECT_HOME": HOMES[code]} if code in HOMES else {}),
                    },
                )
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True
            )
    rows = []
    print(
        f"\n| command | zhpipe (median s) | baseline {args.baseline} (median s) | ratio "
        "|\n|---|---|---|---|"
    )
    for command, t in times.items():
        now, before = statistics.median(t["zhpipe"]), statistics.median(t["baseline"])
        rows.append(
            {
                "command": command,
                "zhpipe_s": now,
                "baseline_s": before,
                "ratio": now / before,
                "runs": t,
            }
        )
        print(
            f"| `zhpipe {command}` | {now:.2f} (rounds "
            f"{min(t['zhpipe']):.2f}-{max(t['zhpipe']):.2f}) | {before:.2f} "
            f"(rounds {min(t['baseline']):.2f}-{max(t['baseline']):.2f}) | {now / before:.2f} |"
        )
    out = ROOT / "benchmarks" / "results" / "commands.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"baseline": args.baseline, "rounds": args.rounds, "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
