"""Segmentation backends side by side on one corpus: token agreement of jieba-rs with jieba, what
the differences look like, and single-process speed of each (alternating rounds, medians).

    python benchmarks/bench_segment.py                                   # the bundled hotel reviews
    python benchmarks/bench_segment.py --csv reviews.csv --column review --rounds 5 --out \\
        results/segment.json

Agreement is counted per text (the whole token list equal) and per token (tokens of jieba's cut that
jieba-rs cuts at the same character offsets)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.util.segmenter import Segmenter, SegmenterParams


def spans(tokens: list[str]) -> set[tuple[int, int]]:
    out, at = set(), 0
    for t in tokens:
        out.add((at, at + len(t)))
        at += len(t)
    return out


def agreement(texts: list[str], a: Segmenter, b: Segmenter, examples: int = 12) -> dict:
    same_text = same_tokens = total_tokens = 0
    kinds: Counter = Counter()
    shown = []
    for text in texts:
        ta, tb = list(a.tokenizer.cut(text, HMM=True)), list(b.tokenizer.cut(text, HMM=True))
        if ta == tb:
            same_text += 1
        else:
            diff = [t for t in ta if t not in set(tb)]
            kinds.update(
                "digits/latin/punct"
                if all(not ("\u4e00" <= c <= "\u9fff") for c in t)
                else "chinese"
                for t in diff
            )
            if len(shown) < examples:
                only_a, only_b = (
                    sorted(sa_ - sb_ for sa_, sb_ in [(set(ta), set(tb))])[0],
                    set(tb) - set(ta),
                )
                shown.append(
                    {
                        "text": text[:60],
                        "jieba": " ".join(sorted(only_a)),
                        "jieba-rs": " ".join(sorted(only_b)),
                    }
                )
        sa, sb = spans(ta), spans(tb)
        same_tokens += len(sa & sb)
        total_tokens += len(sa)
    return {
        "texts": len(texts),
        "same_texts": same_text / len(texts),
        "same_tokens": same_tokens / max(total_tokens, 1),
        "differing_jieba_tokens_by_kind": dict(kinds),
        "examples": shown,
    }


def speed(texts: list[str], seg: Segmenter) -> float:
    t0 = time.perf_counter()
    for text in texts:
        seg.words(text)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(ROOT / "data/raw/ChnSentiCorp_htl_all.csv"))
    ap.add_argument("--column", default="review")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    import pandas as pd

    texts = pd.read_csv(args.csv, dtype=str)[args.column].dropna().astype(str).tolist()
    mb = sum(len(t.encode("utf-8")) for t in texts) / 2**20
    py, rs = (
        Segmenter(SegmenterParams(backend="jieba")),
        Segmenter(SegmenterParams(backend="jieba-rs")),
    )
    py.words("预热"), rs.words("预热")  # dictionaries loaded before timing
    result = {"corpus": args.csv, "mb": round(mb, 2), **agreement(texts, py, rs)}
    times: dict[str, list[float]] = {"jieba": [], "jieba-rs": []}
    for _ in range(args.rounds):  # alternating, so drift on a shared machine hits both
        times["jieba"].append(speed(texts, py))
        times["jieba-rs"].append(speed(texts, rs))
    for name, rounds in times.items():
        result[f"{name}_seconds_median"] = statistics.median(rounds)
        result[f"{name}_mb_per_s"] = mb / statistics.median(rounds)
    result["speedup"] = result["jieba_seconds_median"] / result["jieba-rs_seconds_median"]
    print(
        f"{len(texts)} texts, {mb:.1f} MB: same token list on {result['same_texts']:.1%} of texts, "
        f"{result['same_tokens']:.2%} of jieba's tokens at the same offsets"
    )
    print(f"differing jieba tokens by kind: {result['differing_jieba_tokens_by_kind']}")
    print("| backend | median s | MB/s (one process) |\n|---|---|---|")
    for name in times:
        print(
            f"| {name} | {result[f'{name}_seconds_median']:.2f} | {result[f'{name}_mb_per_s']:.2f} "
            "|"
        )
    print(f"jieba-rs is {result['speedup']:.1f}x faster")
    for ex in result["examples"][:6]:
        print(
            f"- {ex['text']}\n    only jieba:    {ex['jieba']}\n    only jieba-rs: {ex['jieba-rs']}"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(result, ensure_ascii=False, indent=2), encoding="utf-8"
        )


if __name__ == "__main__":
    main()
