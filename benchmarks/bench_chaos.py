"""Crash safety under fire: `zhpipe run` SIGKILLed at random moments (seeded), over and over, each
kill followed by another run that may itself be killed; every few kills a run is let finish. At the
end: `zhpipe verify` over the store, the data outputs compared byte for byte with an uninterrupted
run in a store of its own, and no MLflow run left RUNNING.

    python benchmarks/bench_chaos.py --kills 100 --seed 7 --out benchmarks/results/chaos.json

A background `zhpipe server start` serves every run (so a kill can land in any stage, not mostly in
the temporary server's start-up); each run builds from the store the killed ones left."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# deterministic outputs (embed's fastText is not)
DATA = ("download", "clean", "split", "segment", "augment", "vocab")


def zhpipe(env, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def digests(store: Path, keys: dict[str, str]) -> dict[str, str]:
    out = {}
    for stage in DATA:
        folder = store / stage / keys[stage]
        for f in sorted(folder.rglob("*")):
            if f.is_file() and f.name != "manifest.json":
                out[f"{stage}/{f.relative_to(folder)}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--finish-every", type=int, default=10, help="let a run finish after this many kills"
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="zhpipe-chaos-"))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_API"))
    }
    env.update(
        PREFECT_HOME=str(work / "prefect"),
        MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}",
        ZHPIPE_PROJECT=str(ROOT),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
    )
    sets = ["--set", "train.models=[tfidf_lr, fasttext]"]
    started = zhpipe(env, "server", "start")
    if started.returncode:
        raise SystemExit(started.stderr)
    chaos, calm = work / "chaos-store", work / "calm-store"
    kills, finished, where = 0, 0, Counter()
    t0 = time.perf_counter()
    try:
        # one uninterrupted run first: how long a run takes, and the reference outputs
        t = time.perf_counter()
        ref = zhpipe({**env, "ZHPIPE_DATA": str(calm)}, "run", "smoke", *sets)
        if ref.returncode:
            raise SystemExit(ref.stderr[-3000:])
        span = time.perf_counter() - t
        print(f"uninterrupted run: {span:.1f} s", flush=True)
        stages = [
            "download",
            "clean",
            "split",
            "segment",
            "profile",
            "augment",
            "vocab",
            "embed",
            "train",
            "evaluate",
        ]
        building = re.compile(r"zhpipe(?:\.\w+)? (\S+): building")
        while kills < args.kills:
            if kills and kills % args.finish_every == 0 and finished < kills // args.finish_every:
                calm_run = zhpipe(
                    {**env, "ZHPIPE_DATA": str(chaos)}, "run", "smoke", *sets, timeout=900
                )
                if calm_run.returncode:
                    raise SystemExit(
                        f"a run after {kills} kills failed:\n{calm_run.stderr[-3000:]}"
                    )
                finished += 1
                print(f"  after {kills} kills: a run finished cleanly", flush=True)
                continue
            # work for the run to be killed in: that stage and every later one
            force = rng.choice(stages)
            proc = subprocess.Popen(
                [sys.executable, "-m", "flows.cli", "run", "smoke", *sets, "--force", force],
                cwd=ROOT,
                env={**env, "ZHPIPE_DATA": str(chaos)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            time.sleep(rng.uniform(0.3, span))
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                out = proc.communicate()[0]
                found = [m.group(1) for m in map(building.search, out.splitlines()) if m]
                where[found[-1] if found else "start-up"] += 1
                kills += 1
                if kills % 10 == 0:
                    print(f"  {kills} kills ({time.perf_counter() - t0:.0f} s)", flush=True)
            else:
                proc.communicate()
        last = zhpipe({**env, "ZHPIPE_DATA": str(chaos)}, "run", "smoke", *sets)
        if last.returncode:
            raise SystemExit(f"the run after the last kill failed:\n{last.stderr[-3000:]}")
        verify = zhpipe({**env, "ZHPIPE_DATA": str(chaos)}, "verify")
        sys.path.insert(0, str(ROOT))
        os.environ.update(
            {k: env[k] for k in ("PREFECT_HOME", "MLFLOW_TRACKING_URI", "ZHPIPE_PROJECT")}
        )
        from flows.plan import project

        project.activate(project.find())
        from flows.plan.config import load_pipeline
        from flows.plan.keys import plan_keys
        from flows.track.tracker import client

        keys = plan_keys(load_pipeline("smoke", overrides=["train.models=[tfidf_lr, fasttext]"]))
        same = digests(chaos, keys) == digests(calm, keys)
        c = client()
        running = [
            r.info.run_id
            for e in c.search_experiments()
            for r in c.search_runs([e.experiment_id], "attributes.status = 'RUNNING'")
        ]
    finally:
        zhpipe(env, "server", "stop")
    result = {
        "kills": kills,
        "runs_finished": finished,
        "kills_by_unit": dict(where.most_common()),
        "verify": verify.stdout.strip().splitlines()[-1],
        "verify_ok": verify.returncode == 0,
        "data_outputs_identical": same,
        "runs_left_running": len(running),
        "seconds": time.perf_counter() - t0,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
