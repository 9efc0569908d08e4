"""Peak memory of a PyTorch network's training against its number of rows: TextCNN (the train stage's own
code, from splits on disk) for one epoch on synthetic segmented texts, each size in a fresh process, with
zhpipe's setting of oneDNN's primitive cache (8) and with oneDNN's default (1,024) side by side.

    python benchmarks/bench_network_memory.py --rows 10000,40000 --vocab 10000

Prints a table of seconds and peak RSS per size and setting; writes benchmarks/results/network-memory.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import numpy as np, pandas as pd
from tasks.io import Rows, write_parquet
from tasks.models import MODELS, TrainInputs
from tasks.train import Params
from tasks.vectors import keyed_word_vectors
from gensim.models import KeyedVectors

rows, vocab, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
rng = np.random.default_rng(0)
words = np.array([f"w{i}" for i in range(vocab)])
for name, n in (("train", rows), ("validation", max(rows // 10, 100))):
    lengths = rng.integers(20, 300, size=n)
    write_parquet(pd.DataFrame({"words": [" ".join(words[rng.integers(0, vocab, size=k)]) for k in lengths],
                                "label": rng.choice(["0", "1"], size=n), "aug_method": "original"}), folder / f"{name}.parquet")
(folder / "vocab" / "words").mkdir(parents=True)
(folder / "vocab" / "words" / "vocab.txt").write_text("[PAD]\n[UNK]\n" + "".join(f"{w}\n" for w in words), encoding="utf-8")
(folder / "out").mkdir()
kv = KeyedVectors(vector_size=128)
kv.add_vectors(list(words[:100]), rng.normal(size=(100, 128)).astype(np.float32))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
MODELS["textcnn"].train(TrainInputs("textcnn", Rows(folder / "train.parquet"), Rows(folder / "validation.parquet"), ["0", "1"],
                                    Params(epochs=1, patience=1), folder / "vocab", keyed_word_vectors(kv), folder / "out", folder / "ckpt"))
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "data_mb": before}))
"""


def run(rows: int, vocab: int, capacity: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
    if capacity:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = capacity
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(rows), str(vocab), tmp], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"rows={rows}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="10000,40000")
    ap.add_argument("--vocab", type=int, default=10_000)
    args = ap.parse_args()
    results = []
    print("| rows | setting | seconds | peak RSS |\n|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, capacity in (("zhpipe (8 primitives)", None), ("oneDNN default (1,024)", "1024")):
            r = run(rows, args.vocab, capacity)
            results.append({"rows": rows, "setting": name, **r})
            print(f"| {rows:,} | {name} | {r['seconds']:.1f} | {r['peak_mb']:,.0f} MB |", flush=True)
    out = ROOT / "benchmarks" / "results" / "network-memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"vocab": args.vocab, "results": results}, indent=2))


if __name__ == "__main__":
    main()
