"""Back-translation cost, side by side in one run: batched generation vs one sentence at a time
(goal >= 5x sentences/s on CPU), and the translation cache's hit rate on a rerun (goal 100%).

Without --forward/--backward it builds a MarianMT pair shaped like opus-mt but smaller (random
weights, so outputs are nonsense and often run to --max-length tokens). With real model folders
(e.g. opus-mt-zh-en / opus-mt-en-zh) it measures those.

    python benchmarks/bench_backtranslation.py [--sentences 64] [--batch-size 16] [--max-length 48]
                                               [--forward DIR --backward DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd
from rich.console import Console
from rich.table import Table

from tasks.classification.backtranslation import round_trip
from tasks.classification.translators import BackTranslationParams as BackTranslationConfig
from tasks.classification.translators import (
    Seq2SeqTranslator,
    TranslationCache,
    split_sentences,
)

console = Console()


def build_models(root: Path, d_model: int, layers: int) -> tuple[str, str]:
    """A zh->en / en->zh MarianMT pair with random weights (tokenizers trained on fixture text)."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    from tests.helpers.tiny_marian import build_pair

    paths = []
    for folder in build_pair(root):
        config = MarianConfig.from_pretrained(folder)
        config.update(
            {
                "d_model": d_model,
                "encoder_layers": layers,
                "decoder_layers": layers,
                "encoder_attention_heads": 8,
                "decoder_attention_heads": 8,
                "encoder_ffn_dim": 4 * d_model,
                "decoder_ffn_dim": 4 * d_model,
            }
        )
        torch.manual_seed(0)
        MarianMTModel(config).save_pretrained(folder)
        paths.append(str(folder))
    return paths[0], paths[1]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--forward")
    ap.add_argument("--backward")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zhpipe-bt-bench-"))
    forward, backward = args.forward, args.backward
    if not forward:
        forward, backward = build_models(tmp / "models", args.d_model, args.layers)
    reviews = (
        pd.read_csv(ROOT / "data" / "raw" / "ChnSentiCorp_htl_all.csv")["review"]
        .dropna()
        .astype(str)
    )
    sentences = [s for r in reviews for s in split_sentences(r, 40)][: args.sentences]
    params = BackTranslationConfig(
        max_length=args.max_length, num_beams=1, batch_size=args.batch_size
    )
    model = Seq2SeqTranslator(forward, params, "auto")
    batched, single = [], []
    for r in range(args.rounds):
        t0 = time.perf_counter()
        for i in range(0, len(sentences), args.batch_size):
            model.translate(sorted(sentences, key=len)[i : i + args.batch_size], 1)
        batched.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for s in sentences:
            model.translate([s], 1)
        single.append(time.perf_counter() - t0)
        console.print(
            f"  round {r + 1}/{args.rounds}: batched {batched[-1]:.1f} s, one at a time "
            f"{single[-1]:.1f} s"
        )
    b, s = statistics.median(batched), statistics.median(single)

    pivots = [{"lang": "en", "forward": forward, "backward": backward}]
    bt = params.model_copy(update={"pivots": BackTranslationConfig(pivots=pivots).pivots})
    cache = TranslationCache(tmp / "cache.sqlite")
    t0 = time.perf_counter()
    _, first, _ = round_trip(sentences, bt.pivots[0], bt, cache, "auto")
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, again, _ = round_trip(sentences, bt.pivots[0], bt, cache, "auto")
    rerun_s = time.perf_counter() - t0
    hit_rate = again["cache_hits"] / (again["cache_hits"] + again["cache_misses"])

    table = Table(
        title=f"back-translation, {len(sentences)} sentences, max_length {args.max_length}, "
        "greedy, CPU"
    )
    for col in ("measure", "zhpipe", "baseline", "ratio", "goal"):
        table.add_column(col)
    table.add_row(
        f"zh->en generation, batches of {args.batch_size}",
        f"{len(sentences) / b:.1f} sent/s",
        f"{len(sentences) / s:.1f} sent/s (one at a time)",
        f"{s / b:.1f}x",
        ">= 5x",
    )
    table.add_row(
        "round trip zh->en->zh, rerun vs first",
        f"{rerun_s:.2f} s",
        f"{first_s:.1f} s",
        f"hit rate {hit_rate:.0%}",
        "100%",
    )
    console.print(table)


if __name__ == "__main__":
    main()
