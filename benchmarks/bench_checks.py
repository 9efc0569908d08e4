"""The data checks' margins, without a pipeline: a reference of earlier nights, then many ordinary
nights and each kind of bad night, judged by `tasks.shared.checks.judge` exactly as a run judges a
cleaned partition. Printed per corpus: for each blocking check, the largest figure an ordinary night
reached and its limit (false alarms), and the figure of each bad night (caught or not).

    # hotel reviews and Resume NER sentences, 30 ordinary nights each
    python benchmarks/bench_checks.py
    python benchmarks/bench_checks.py --nights 60 --rows 200

The corpora are the ones `bench_nightly.py --corpus` makes (unique texts; nothing is written to
disk).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def nights_of(
    rows: pd.DataFrame, reference_rows: int, night_rows: int, count: int
) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    reference = rows.iloc[:reference_rows]
    rest = rows.iloc[reference_rows:]
    count = min(count, len(rest) // night_rows)
    return reference, [rest.iloc[i * night_rows : (i + 1) * night_rows] for i in range(count)]


def bad_kinds(night: pd.DataFrame, reference: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, int]]:
    """Each bad night made from an ordinary one: (rows after clean, rows that arrived)."""
    labels = sorted(reference["label"].unique())
    shuffled = night.assign(label=np.random.default_rng(3).permutation(night["label"].to_numpy()))
    flipped = night.assign(
        label=[
            labels[(labels.index(v) + 1) % len(labels)] if i % 20 == 0 else v
            for i, v in enumerate(night["label"])
        ]
    )
    cut = night.assign(text=night["text"].str[:3])
    kept = cut.drop_duplicates("text")  # what clean keeps of it: three-character prefixes repeat
    return {
        "labels shuffled (shares kept)": (shuffled, len(night)),
        "5% of labels flipped (must pass)": (flipped, len(night)),
        "text cut to 3 characters": (kept, len(night)),
        "one class": (night.assign(label=labels[0]), len(night)),
        # clean quarantines rows that repeat earlier ones: nothing of such a night is kept
        "duplicates of earlier rows": (reference.iloc[:0], len(night)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--rows", type=int, default=200, help="rows per night")
    ap.add_argument(
        "--reference", type=int, default=2000, help="rows of the reference (earlier kept nights)"
    )
    args = ap.parse_args()

    from benchmarks.corpora import corpus
    from tasks.shared.checks import CHECKS, Checks, Sample, judge
    from tasks.shared.normalise import Normalise, clean_text

    settings = Checks()
    for name in ("hotel", "resume"):
        rows = (
            corpus(name)
            .rename(columns={"review": "text"})
            .sample(frac=1.0, random_state=7)
            .reset_index(drop=True)
        )
        rows = rows.assign(text=[clean_text(t, Normalise()) for t in rows["text"]])
        reference, nights = nights_of(rows, args.reference, args.rows, args.nights)
        ref = Sample(
            reference,
            len(reference),
            len(reference),
            (len(reference), args.rows, args.rows),
            (0.02, 0.02, 0.02),
        )
        t0 = time.perf_counter()
        ordinary = [
            {v.check: v for v in judge(Sample(n, int(len(n) / 0.98), len(n)), ref, settings)}
            for n in nights
        ]
        seconds = (time.perf_counter() - t0) / len(nights)
        print(
            f"\n## {name}: reference {len(reference)} rows, {len(nights)} ordinary nights of "
            f"{args.rows} rows, "
            f"{reference['label'].nunique()} labels; {seconds:.2f} s per night judged\n"
        )
        print(
            "| check | severity | ordinary nights failed | largest ordinary figure | its limit "
            "then |"
        )
        print("|---|---|---|---|---|")
        for check in CHECKS:
            figures = [
                (o[check].figure, o[check])
                for o in ordinary
                if check in o and o[check].figure is not None
            ]
            if not figures:
                continue
            failed = sum(o[check].passed is False for o in ordinary if check in o)
            top, verdict = max(figures, key=lambda f: f[0])
            allowed = (
                verdict.note.rsplit("allowed ", 1)[-1][:40]
                if "allowed" in verdict.note
                else verdict.threshold
            )
            print(
                f"| {check} | {verdict.severity} | {failed} of {len(ordinary)} | {top:.3f} | "
                f"{allowed} |"
            )
        print("\n| night | blocking checks failed | held |")
        print("|---|---|---|")
        for what, (frame, arrived) in bad_kinds(nights[0], reference).items():
            result = judge(Sample(frame, arrived, len(frame)), ref, settings)
            blocking = [f"{v.check} {v.figure:.2f}" for v in result if v.blocks]
            print(f"| {what} | {', '.join(blocking) or 'none'} | {'yes' if blocking else 'no'} |")


if __name__ == "__main__":
    main()
