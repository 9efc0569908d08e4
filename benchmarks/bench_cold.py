"""A cold `zhpipe run` against the hand-written script doing the same work
(benchmarks/hand_script.py), alternating, each round in fresh stores: wall time overall and per
step, and the ratio.

    python benchmarks/bench_cold.py [--rounds 3] [--server | --warm]

zhpipe runs `chnsenticorp --force` with EDA off, models tfidf_lr and fasttext and Word2Vec at 100d x
5 epochs (fastText vectors are 100d x 5 epochs by default), with profile, MLflow tracking and
registration on, as a user would from the command line. --server: with a background Prefect server
(`zhpipe server start`) instead of a temporary one per run. --warm: what a project has after its
first run, the background server and the warm zhpipe process beside it (the first round starts it;
each round rebuilds every stage with --force into the same stores, as a new night of a project
does). Writes benchmarks/results/cold.json (cold-server.json, cold-warm.json).
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
SETS = [
    "--set",
    "augment.method=none",
    "--set",
    "train.models=[tfidf_lr,fasttext]",
    "--set",
    "embed.word2vec.vector_size=100",
    "--set",
    "embed.word2vec.epochs=5",
]
# zhpipe stage(s) -> the script's step with the same work
STEPS = {
    "read_clean": ("download", "clean"),
    "split": ("split",),
    "segment": ("segment",),
    "profile": ("profile",),
    "embed": ("embed",),
    "train_fasttext": ("train.fasttext",),
    "train_tfidf_lr": ("train.tfidf_lr",),
    "vocab + evaluate + registration": (
        "vocab",
        "evaluate.tfidf_lr",
        "evaluate.fasttext",
        "evaluate",
    ),
}


def run_zhpipe(tmp: Path, env: dict) -> dict:
    env = {
        "ZHPIPE_DATA": str(tmp / "store"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}",
        **env,
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "chnsenticorp", "--force", *SETS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"zhpipe run failed: {proc.stderr.strip().splitlines()[-1:]}")
    seconds = {}
    for manifest in Path(env["ZHPIPE_DATA"]).glob("*/*/manifest.json"):
        doc = json.loads(manifest.read_text(encoding="utf-8"))
        seconds[doc["stage"]] = doc["seconds"]
    return {"total": wall, "stages": seconds}


def run_script(tmp: Path) -> dict:
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "hand_script.py"),
            "--json",
            str(tmp / "script.json"),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - t0
    return {"total": wall, "steps": json.loads((tmp / "script.json").read_text())["times"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", action="store_true")
    parser.add_argument("--warm", action="store_true")
    args = parser.parse_args()
    args.server |= args.warm
    # stores of each round's own, or (--warm) the project's
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PREFECT_API_URL",
            "ZHPIPE_SERVER",
            "ZHPIPE_WARM",
            "ZHPIPE_DATA",
            "MLFLOW_TRACKING_URI",
        )
    }
    # each command starts its own temporary server, or uses the one `server start` starts
    if not args.warm:
        env["ZHPIPE_SERVER"] = "temporary"
    rounds = []
    with tempfile.TemporaryDirectory() as home:
        env["PREFECT_HOME"] = home
        # MLflow's schema: the first round makes it
        env["ZHPIPE_USER_CACHE"] = str(Path(home) / "user-cache")
        # the project's stores, the same every round (the warm process serves only the same
        # settings)
        if args.warm:
            env.update(
                {
                    "ZHPIPE_DATA": str(Path(home) / "store"),
                    "MLFLOW_TRACKING_URI": f"sqlite:///{Path(home) / 'mlflow.db'}",
                }
            )
        if args.server:
            out = subprocess.run(
                [sys.executable, "-m", "flows.cli", "server", "start"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
            )
            print(out.stdout.strip(), file=sys.stderr)
        try:
            for r in range(args.rounds):
                with tempfile.TemporaryDirectory() as tmp:
                    order = ["script", "zhpipe"] if r % 2 == 0 else ["zhpipe", "script"]
                    got = {
                        name: run_script(Path(tmp))
                        if name == "script"
                        else run_zhpipe(Path(tmp), env)
                        for name in order
                    }
                rounds.append(got)
                print(
                    f"round {r + 1}: script {got['script']['total']:.1f} s, zhpipe "
                    f"{got['zhpipe']['total']:.1f} s",
                    file=sys.stderr,
                )
        finally:
            if args.server:
                subprocess.run(
                    [sys.executable, "-m", "flows.cli", "server", "stop"],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                )
    med = statistics.median
    print("\n| step | script (median s) | zhpipe (median s) | ratio |\n|---|---|---|---|")
    for step, stages in STEPS.items():
        script = med(r["script"]["steps"].get(step, 0.0) for r in rounds)
        ours = med(sum(r["zhpipe"]["stages"].get(s, 0.0) for s in stages) for r in rounds)
        print(
            f"| {step} ({', '.join(stages)}) | {script:.1f} | {ours:.1f} | {ours / script:.2f} |"
            if script
            else f"| {step} ({', '.join(stages)}) | - | {ours:.1f} | |"
        )
    script, ours = (
        med(r["script"]["total"] for r in rounds),
        med(r["zhpipe"]["total"] for r in rounds),
    )
    print(
        f"| **total wall** (process start to exit) | {script:.1f} | {ours:.1f} | "
        f"**{ours / script:.2f}** |"
    )
    name = "cold-warm.json" if args.warm else "cold-server.json" if args.server else "cold.json"
    out = ROOT / "benchmarks" / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"server": args.server, "warm": args.warm, "rounds": rounds}, indent=2)
    )


if __name__ == "__main__":
    main()
