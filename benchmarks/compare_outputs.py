"""Byte for byte: the data stages of each pipeline built by a baseline commit and by this checkout,
each into a store of its own, then every file of each stage's output compared (its manifest aside:
keys, timings and the code fingerprint differ by design). Used to check that a refactoring changes
no output.

    python benchmarks/compare_outputs.py --baseline b66fe85 --to vocab chnsenticorp resume-ner \\
        tatoeba-zh-en
    python benchmarks/compare_outputs.py --baseline b66fe85 --to evaluate --repeat chnsenticorp

With `--to evaluate` each model's test metrics (the evaluate stage's results.json) are compared as
well; `--repeat` builds this checkout twice, so that what varies from run to run (threaded training:
fastText, Word2Vec) is told apart from a change.

The baseline is checked out with `git worktree` beside the checkout; both run with this Python, each
with its own project folder (its MLflow store and Prefect home), `ZHPIPE_SERVER=temporary`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def build(code: Path, pipeline: str, stop: str, store: Path, sets: list[str] = ()) -> float:
    env = {
        **os.environ,
        "ZHPIPE_SERVER": "temporary",
        "PYTHONPATH": str(code),
        "ZHPIPE_WARM": "off",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    }
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "--project",
            str(code),
            "run",
            pipeline,
            "--to",
            stop,
            "--storage",
            str(store),
            *[a for s in sets for a in ("--set", s)],
        ],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(
            f"{code.name}: zhpipe run {pipeline} "
            f"failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return time.perf_counter() - t0


def stage_outputs(store: Path) -> dict[str, Path]:
    """Each whole-stage output folder of a store (one key per stage: one pipeline per store)."""
    out = {}
    for stage in sorted(
        p
        for p in store.iterdir()
        if p.is_dir()
        and not p.name.startswith(("_", "."))
        and "." not in p.name
        and ":" not in p.name
    ):
        keys = [k for k in stage.iterdir() if k.is_dir() and (k / "manifest.json").is_file()]
        if len(keys) == 1:
            out[stage.name] = keys[0]
    return out


def results(store: Path) -> dict[str, dict[str, float]]:
    """Each model's test metrics from the evaluate stage's results.json ({} when the run stopped
    before it)."""
    found = [
        folder / "results.json"
        for folder in stage_outputs(store).values()
        if (folder / "results.json").is_file()
    ]
    return json.loads(found[0].read_text()) if found else {}


def compare(old: dict[str, str], new: dict[str, str], again: dict[str, str] | None) -> str:
    """One stage's verdict: identical, differing (a real change), or varying run to run (this
    checkout's two builds differ as well: threaded training such as fastText's or Word2Vec's)."""
    differ = sorted(n for n in old.keys() | new.keys() if old.get(n) != new.get(n))
    if not differ:
        return "identical"
    if again is not None and any(new.get(n) != again.get(n) for n in differ):
        return "varies run to run: " + ", ".join(differ[:3])
    return "DIFFERS: " + ", ".join(differ[:4])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pipelines", nargs="+")
    ap.add_argument("--baseline", required=True, help="the commit to compare with")
    ap.add_argument(
        "--to",
        default="vocab",
        help="the last stage built (default vocab; evaluate compares metrics too)",
    )
    ap.add_argument(
        "--repeat",
        action="store_true",
        help="build this checkout twice, to tell a change from what "
        "varies run to run (threaded training)",
    )
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="STAGE.PARAM=VALUE",
        help="a setting for both sides (e.g. embed.workers=1: Word2Vec in one thread, bit for bit)",
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zhpipe-compare-"))
    base = work / "baseline"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(base), args.baseline],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    sides = [("baseline", base), ("new", ROOT)] + ([("again", ROOT)] if args.repeat else [])
    rows, metrics, same = [], [], True
    try:
        for pipeline in args.pipelines:
            seconds = {
                side: build(code, pipeline, args.to, work / f"store-{side}-{pipeline}", args.sets)
                for side, code in sides
            }
            built = {side: stage_outputs(work / f"store-{side}-{pipeline}") for side, _ in sides}
            old, new, again = built["baseline"], built["new"], built.get("again")
            for stage in old.keys() | new.keys():
                a, b = (
                    digests(old[stage]) if stage in old else {},
                    digests(new[stage]) if stage in new else {},
                )
                c = digests(again[stage]) if again is not None and stage in again else None
                verdict = compare(a, b, c)
                same &= not verdict.startswith("DIFFERS")
                rows.append((pipeline, stage, len(a), len(b), verdict))
            scores = {side: results(work / f"store-{side}-{pipeline}") for side, _ in sides}
            for model, values in scores["baseline"].items():
                now_all, again_all = (
                    scores["new"].get(model, {}),
                    scores.get("again", {}).get(model),
                )
                # a model that varies does so in every metric
                varies = again_all is not None and again_all != now_all
                for metric, value in values.items():
                    now, second = now_all.get(metric), (again_all or {}).get(metric)
                    same &= now == value or varies
                    metrics.append(
                        (
                            pipeline,
                            model,
                            metric,
                            value,
                            now,
                            second,
                            "equal"
                            if now == value
                            else "varies run to run"
                            if varies
                            else "DIFFERS",
                        )
                    )
            print(
                f"{pipeline}: built in "
                + ", ".join(f"{seconds[side]:.0f} s ({side})" for side, _ in sides),
                flush=True,
            )
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True
        )
    print(
        f"\n| pipeline | stage | files (baseline {args.baseline}) | files (this checkout) | bytes "
        "|\n|---|---|---:|---:|---|"
    )
    order = [
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
    for row in sorted(
        rows, key=lambda r: (args.pipelines.index(r[0]), order.index(r[1]) if r[1] in order else 99)
    ):
        print("| " + " | ".join(map(str, row)) + " |")
    if metrics:
        print(
            f"\n| pipeline | model | metric | baseline {args.baseline} | this checkout | again | "
            "|\n"
            "|---|---|---|---:|---:|---:|---|"
        )
        for pipeline, model, metric, value, now, second, verdict in metrics:
            shown = ["" if v is None else f"{v:.6f}" for v in (value, now, second)]
            print(f"| {pipeline} | {model} | {metric} | " + " | ".join(shown) + f" | {verdict} |")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
