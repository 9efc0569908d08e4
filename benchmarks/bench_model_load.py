"""MLflow's requirements check as zhpipe logs and loads models: the first `save_model` and the first
`load_model` of a fresh process, with zhpipe's pinned requirements, plain (MLflow maps every
installed module to its distribution first) and within `flows.track.requirements.by_name` (the check
by distribution name only). Each measurement is a fresh process, the two ways alternating so that
both see the same machine; prints medians and ratios.

    python benchmarks/bench_model_load.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import contextlib, json, sys, time
sys.path.insert(0, sys.argv[1])
import mlflow.pyfunc
from mlflow.pyfunc import PythonModel
from flows.track.requirements import by_name, pinned

class Echo(PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input

block = by_name if sys.argv[3] == "by-name" else contextlib.nullcontext
folder = sys.argv[2]
out = {}
if sys.argv[4] == "save":
    t = time.perf_counter()
    with block():
        mlflow.pyfunc.save_model(folder, python_model=Echo(), pip_requirements=pinned())
    out["save"] = time.perf_counter() - t
else:
    t = time.perf_counter()
    with block():
        mlflow.pyfunc.load_model(folder)
    out["load"] = time.perf_counter() - t
print(json.dumps(out))
"""


def once(folder: Path, way: str, what: str) -> float:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(folder), way, what],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])[what]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="zhpipe-bench-load-") as tmp:
        for r in range(args.rounds):
            for way in ("plain", "by-name"):
                saved = Path(tmp) / f"{way}-{r}"
                times.setdefault((way, "save"), []).append(once(saved, way, "save"))
                times.setdefault((way, "load"), []).append(once(saved, way, "load"))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(
        f"| first call in a fresh process ({args.rounds} rounds, medians) | plain | by name | "
        "ratio |"
    )
    print("|---|---|---|---|")
    for what in ("save", "load"):
        plain, by_name = (
            statistics.median(times[("plain", what)]),
            statistics.median(times[("by-name", what)]),
        )
        print(
            f"| `mlflow.pyfunc.{what}_model` | {plain:.2f} s | {by_name:.2f} s | "
            f"{by_name / plain:.2f}x |"
        )


if __name__ == "__main__":
    main()
