"""Peak memory of a PyTorch network's training against its number of rows: TextCNN (the train
stage's own code, from splits on disk) for one epoch on synthetic segmented texts (made in a process
of their own), each training in a fresh process, with zhpipe's setting of oneDNN's primitive cache
(8) and with oneDNN's default (1,024) side by side.

    python benchmarks/bench_network_memory.py --rows 10000,40000 --vocab 10000 [--settings zhpipe]

Prints a table of seconds and peak RSS per size and setting; writes
benchmarks/results/network-memory.json.
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

MAKE = r"""
import sys
from pathlib import Path
import numpy as np, pyarrow as pa, pyarrow.parquet as pq

rows, vocab, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
rng = np.random.default_rng(0)
words = np.array([f"w{i}" for i in range(vocab)])
schema = pa.schema([("words", pa.string()), ("label", pa.string()), ("aug_method", pa.string())])
for name, n in (("train", rows), ("validation", max(rows // 10, 100))):
    with pq.ParquetWriter(folder / f"{name}.parquet", schema) as out:
        for part in range(0, n, 20_000):  # written in parts, as a stage writes its split
            k = min(20_000, n - part)
            lengths = rng.integers(20, 300, size=k)
            texts = [" ".join(words[rng.integers(0, vocab, size=m)]) for m in lengths]
            labels = rng.choice(["0", "1"], size=k)
            table = {"words": texts, "label": labels, "aug_method": ["original"] * k}
            out.write_table(pa.table(table, schema=schema))
(folder / "vocab" / "words").mkdir(parents=True)
vocab_txt = "[PAD]\n[UNK]\n" + "".join(f"{w}\n" for w in words)
(folder / "vocab" / "words" / "vocab.txt").write_text(vocab_txt, encoding="utf-8")
"""

TRAIN = r"""
import json, resource, shutil, sys, time
from pathlib import Path
import numpy as np
from gensim.models import KeyedVectors
from tasks.util.io import Rows
from tasks.models import TrainInputs
from tasks.stages import MODELS
from tasks.classification.train import params as _train_params
from tasks.util.vectors import keyed_word_vectors

Params = _train_params()

folder = Path(sys.argv[1])
for name in ("out", "ckpt"):
    shutil.rmtree(folder / name, ignore_errors=True)
(folder / "out").mkdir()
rng = np.random.default_rng(0)
kv = KeyedVectors(vector_size=128)
kv.add_vectors([f"w{i}" for i in range(100)], rng.normal(size=(100, 128)).astype(np.float32))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
train, validation = Rows(folder / "train.parquet"), Rows(folder / "validation.parquet")
MODELS["textcnn"].train(TrainInputs("textcnn", train, validation, ["0", "1"],
                                    Params(epochs=1, patience=1), folder / "vocab",
                                    keyed_word_vectors(kv), folder / "out", folder / "ckpt"))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_mb": peak, "start_mb": before}))
"""

SETTINGS = {
    "zhpipe": ("zhpipe (8 primitives)", None),
    "default": ("oneDNN default (1,024)", "1024"),
}


def child(code: str, args: list[str], capacity: str | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ONEDNN_PRIMITIVE_CACHE_CAPACITY", None)
    if capacity:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = capacity
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(f"{args}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="10000,40000")
    ap.add_argument("--vocab", type=int, default=10_000)
    ap.add_argument(
        "--settings",
        default="zhpipe,default",
        help="comma-separated: zhpipe (8 primitives), default (oneDNN's 1,024)",
    )
    args = ap.parse_args()
    results = []
    print("| rows | setting | seconds | peak RSS (before training) |\n|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            child(MAKE, [str(rows), str(args.vocab), tmp])
            for key in args.settings.split(","):
                name, capacity = SETTINGS[key]
                r = json.loads(child(TRAIN, [tmp], capacity).strip().splitlines()[-1])
                results.append({"rows": rows, "setting": name, **r})
                print(
                    f"| {rows:,} | {name} | {r['seconds']:.1f} | {r['peak_mb']:,.0f} MB "
                    f"({r['start_mb']:,.0f} MB) |",
                    flush=True,
                )
    out = ROOT / "benchmarks" / "results" / "network-memory.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"vocab": args.vocab, "results": results}, indent=2))


if __name__ == "__main__":
    main()
