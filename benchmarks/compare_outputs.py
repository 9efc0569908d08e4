"""Byte for byte: the data stages of each pipeline built by a baseline commit and by this checkout, each into a
store of its own, then every file of each stage's output compared (its manifest aside: keys, timings and the
code fingerprint differ by design). Used to check that a refactoring changes no output.

    python benchmarks/compare_outputs.py --baseline b66fe85 --to vocab chnsenticorp resume-ner tatoeba-zh-en

The baseline is checked out with `git worktree` beside the checkout; both run with this Python, each with its
own project folder (its MLflow store and Prefect home), `ZHPIPE_SERVER=temporary`.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def build(code: Path, pipeline: str, stop: str, store: Path) -> float:
    env = {**os.environ, "ZHPIPE_SERVER": "temporary", "PYTHONPATH": str(code), "ZHPIPE_WARM": "off",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flows.cli", "--project", str(code), "run", pipeline, "--to", stop, "--storage", str(store)],
                          cwd=code, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{code.name}: zhpipe run {pipeline} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - t0


def stage_outputs(store: Path) -> dict[str, Path]:
    """Each whole-stage output folder of a store (one key per stage: one pipeline per store)."""
    out = {}
    for stage in sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")) and "." not in p.name and ":" not in p.name):
        keys = [k for k in stage.iterdir() if k.is_dir() and (k / "manifest.json").is_file()]
        if len(keys) == 1:
            out[stage.name] = keys[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pipelines", nargs="+")
    ap.add_argument("--baseline", required=True, help="the commit to compare with")
    ap.add_argument("--to", default="vocab", help="the last stage built (default vocab)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zhpipe-compare-"))
    base = work / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT, check=True, capture_output=True)
    rows, same = [], True
    try:
        for pipeline in args.pipelines:
            seconds = {side: build(code, pipeline, args.to, work / f"store-{side}-{pipeline}") for side, code in (("baseline", base), ("new", ROOT))}
            old, new = stage_outputs(work / f"store-baseline-{pipeline}"), stage_outputs(work / f"store-new-{pipeline}")
            for stage in old.keys() | new.keys():
                a, b = digests(old[stage]) if stage in old else {}, digests(new[stage]) if stage in new else {}
                differ = sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
                same &= not differ
                rows.append((pipeline, stage, len(a), len(b), "identical" if not differ else "DIFFERS: " + ", ".join(differ[:4])))
            print(f"{pipeline}: built in {seconds['baseline']:.0f} s (baseline) and {seconds['new']:.0f} s (this checkout)", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    print(f"\n| pipeline | stage | files (baseline {args.baseline}) | files (this checkout) | bytes |\n|---|---|---:|---:|---|")
    order = ["download", "clean", "split", "segment", "profile", "augment", "vocab", "embed"]
    for row in sorted(rows, key=lambda r: (args.pipelines.index(r[0]), order.index(r[1]) if r[1] in order else 99)):
        print("| " + " | ".join(map(str, row)) + " |")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
