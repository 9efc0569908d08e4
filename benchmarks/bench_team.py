"""A team's set-up against one machine's, in one run: the pipeline through the team's servers
(PostgreSQL behind an `mlflow server` with basic auth and proxied artifacts, a `prefect server` with
an auth string, the store in an S3 server; tests/helpers/team.py starts them all on loopback)
against the same pipeline on a machine of its own (SQLite store, its own Prefect server, the store
in its folder). Then 8 overlapping runs of one pipeline from two machines.

    python benchmarks/bench_team.py [--pipeline chnsenticorp] [--set KEY=VALUE ...] [--rounds 3] \\
        [--overlap 8]

Reports: the cold run on each (ratio team/local; aim <= 1.5x), a cached run of the team's pipeline
from the other engineer's machine, in its own process and through the warm process (aim <= 3 s), the
same on one machine; and for the overlapping runs: failures, units built more than once, champion
decisions per run, the wall time. Writes benchmarks/results/team.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers.team import machine, start, start_team, zhpipe

CORPORA = {
    "chnsenticorp": ("data/raw/ChnSentiCorp_htl_all.csv",),
    "smoke": ("tests/fixtures/smoke.csv",),
}


def timed(env, project, *argv) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = zhpipe(env, project, *argv, timeout=3600)
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"`zhpipe {' '.join(argv)}` failed: {(done.stdout + done.stderr)[-3000:]}")
    return seconds, done.stdout + done.stderr


def cached(env, project, argv, rounds: int, warm: bool) -> list[float]:
    """`rounds` timed cached runs (after one untimed run that leaves the warm process, when
    `warm`)."""
    env = {**env, "ZHPIPE_WARM": "on" if warm else "off"}
    if warm:
        timed(env, project, *argv)
    times = []
    for _ in range(rounds):
        seconds, out = timed(env, project, *argv)
        assert "│ miss" not in out, out[-2000:]
        times.append(seconds)
    return times


def overlap(machines, argv, count: int, folder: Path) -> dict:
    t0 = time.perf_counter()
    procs = [
        (
            start(*machines[i % 2], *argv, log=folder / f"overlap-{i}.log"),
            folder / f"overlap-{i}.log",
        )
        for i in range(count)
    ]
    codes = [proc.wait(3600) for proc, _ in procs]
    wall = time.perf_counter() - t0
    logs = [log.read_text() for _, log in procs]
    built = Counter(
        k for text in logs for k in re.findall(r"zhpipe [\w.]+: building \(([0-9a-f]{16})\)", text)
    )
    decisions = [len(re.findall(r"zhpipe registry: \S+ version \d+", text)) for text in logs]
    waited = sum("waiting for it" in text for text in logs)
    return {
        "runs": count,
        "failed": sum(c != 0 for c in codes),
        "units": len(built),
        "built_twice": sum(n > 1 for n in built.values()),
        "decisions_per_run": sorted(set(decisions)),
        "runs_that_waited": waited,
        "wall_s": round(wall, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", default="chnsenticorp")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--overlap", type=int, default=8)
    args = parser.parse_args()
    argv = ["run", args.pipeline, *[x for s in args.sets for x in ("--set", s)]]
    corpora = CORPORA.get(args.pipeline, CORPORA["chnsenticorp"])
    folder = Path(tempfile.mkdtemp(prefix="zhpipe-bench-team-"))
    (folder / "team").mkdir()
    team = start_team(folder / "team")
    result: dict = {"pipeline": args.pipeline, "sets": args.sets, "rounds": args.rounds}
    try:
        alice, bob = (machine(team, folder / u, u, corpora) for u in ("alice", "bob"))
        local = machine(None, folder / "local", "local", corpora)
        # one machine's Prefect server, started before the clock as the team's were
        timed(*local, "server", "start")
        print("cold runs ...", flush=True)
        result["local_cold_s"] = round(timed(*local, *argv)[0], 1)
        result["team_cold_s"] = round(timed(*alice, *argv)[0], 1)
        result["cold_ratio"] = round(result["team_cold_s"] / result["local_cold_s"], 2)
        print("cached runs ...", flush=True)
        for name, (env, project), warm in (
            ("team_cached_s", bob, False),
            ("team_cached_warm_s", bob, True),
            ("local_cached_s", local, False),
            ("local_cached_warm_s", local, True),
        ):
            times = cached(env, project, argv, args.rounds, warm)
            result[name] = {
                "median": round(statistics.median(times), 2),
                "all": [round(t, 2) for t in times],
            }
        timed(*local, "server", "stop")
        print(f"{args.overlap} overlapping runs ...", flush=True)
        result["overlap"] = overlap(
            {0: alice, 1: bob}, [*argv, "--set", "split.seed=7"], args.overlap, folder
        )
    finally:
        team.close()
    print(f"\n{'':32s} {'team':>8s} {'one machine':>12s} {'ratio':>6s}")
    print(
        f"{'cold run (s)':32s} {result['team_cold_s']:8.1f} {result['local_cold_s']:12.1f} "
        f"{result['cold_ratio']:6.2f}"
    )
    for label, key in (
        ("cached run, own process (s)", "cached_s"),
        ("cached run, warm process (s)", "cached_warm_s"),
    ):
        team_s, local_s = result[f"team_{key}"]["median"], result[f"local_{key}"]["median"]
        print(f"{label:32s} {team_s:8.2f} {local_s:12.2f} {team_s / local_s:6.2f}")
    o = result["overlap"]
    print(
        f"\n{o['runs']} overlapping runs from two machines: {o['failed']} failed, {o['units']} "
        f"units, {o['built_twice']} built "
        f"twice, decisions per run {o['decisions_per_run']}, {o['runs_that_waited']} said they "
        f"waited, {o['wall_s']} s"
    )
    out = ROOT / "benchmarks" / "results" / "team.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
