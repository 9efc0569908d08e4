"""Stage `profile` (task translation): what the pairs look like: sentence lengths of each side per
split, the length ratio of the two sides, the most frequent tokens of each side, and example pairs,
as pictures, tables and one self-contained HTML report. The suggested `max_len` covers
`profile.coverage` of the sentences."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core import BuildContext, BuildOutput
from tasks.shared.reports import Common, report_html, stats_markdown
from tasks.translation.text import en_tokens
from tasks.util.io import SPLITS

LIBRARIES = ("matplotlib", "numpy")
FILES: tuple[str, ...] = ("font",)


class Params(Common):
    """The `profile` section of task translation: what every kind's profile reads (no word clouds,
    no per-label pictures)."""


def plot_lengths(lengths: dict[str, pd.Series], path: Path) -> Path:
    from tasks.util.plots import save, subplots

    fig, axes = subplots(1, 2, figsize=(9, 3.4))
    for ax, (side, values) in zip(axes, lengths.items()):
        hi = float(np.quantile(values, 0.99)) if len(values) else 1.0
        ax.hist(values.clip(upper=hi), bins=min(50, max(int(hi), 1)))
        ax.set(
            xlabel=f"{side} (clipped at the 99th percentile)",
            ylabel="pairs",
            title=f"{side.split()[0]} sentence length",
        )
    return save(fig, path)


def plot_ratio(ratio: pd.Series, path: Path) -> Path:
    from tasks.util.plots import save, subplots

    fig, ax = subplots(figsize=(7, 3.4))
    ax.hist(ratio.clip(upper=float(np.quantile(ratio, 0.995))), bins=60)
    ax.set(
        xlabel="English tokens per Chinese character",
        ylabel="pairs",
        title="length ratio of the two sides",
    )
    return save(fig, path)


def build(ctx: BuildContext) -> BuildOutput:
    from tasks.util.plots import require_cjk_font, use_font

    p: Params = ctx.params
    frames = {
        name: pd.read_parquet(
            ctx.file("segment", f"{name}.parquet"), columns=["id", "text", "en", "words"]
        )
        for name in SPLITS
    }
    use_font(require_cjk_font(p.font))
    pairs = pd.concat(frames.values(), ignore_index=True)
    zh_len = pairs["text"].str.len().astype("float64")
    en_tok = [en_tokens(t) for t in pairs["en"].astype(str)]
    en_len = pd.Series([len(t) for t in en_tok], dtype="float64")
    ratio = en_len / zh_len.clip(lower=1)
    pictures = [
        plot_lengths(
            {"Chinese characters": zh_len, "English tokens": en_len},
            ctx.out / "sentence_lengths.png",
        ),
        plot_ratio(ratio, ctx.out / "length_ratio.png"),
    ]
    q = round(p.coverage * 100)
    stats = {
        "pairs": len(pairs),
        **{f"pairs_{name}": len(df) for name, df in frames.items()},
        "distinct_zh": int(pairs["text"].nunique()),
        "distinct_en": int(pairs["en"].nunique()),
        "zh_chars_p50": float(zh_len.median()),
        f"zh_chars_p{q}": float(np.quantile(zh_len, p.coverage)),
        "zh_chars_max": int(zh_len.max()),
        "en_tokens_p50": float(en_len.median()),
        f"en_tokens_p{q}": float(np.quantile(en_len, p.coverage)),
        "en_tokens_max": int(en_len.max()),
        "length_ratio_median": float(ratio.median()),
        "suggested_max_len": int(
            np.ceil(max(np.quantile(zh_len, p.coverage), np.quantile(en_len, p.coverage)))
        ),
    }
    zh_top = Counter(w for line in frames["train"]["words"] for w in line.split()).most_common(
        p.top_k
    )
    en_top = Counter(
        t.lstrip("\u2581").lower() for row in en_tok[: len(frames["train"])] for t in row
    ).most_common(p.top_k)
    # fewer English tokens than Chinese words: the rows are padded
    missing = max(0, len(zh_top) - len(en_top))
    frequent = pd.DataFrame(
        {
            "zh word": [w for w, _ in zh_top],
            "zh count": [c for _, c in zh_top],
            "en token": [w for w, _ in en_top][: len(zh_top)] + [""] * missing,
            "en count": [c for _, c in en_top][: len(zh_top)] + [0] * missing,
        }
    )
    train = frames["train"]
    examples = train.sample(min(20, len(train)), random_state=p.seed).sort_values("id")[
        ["id", "text", "en"]
    ]
    tables = {"most frequent tokens (train)": frequent, "example pairs (train)": examples}
    frequent.to_csv(ctx.out / "most_frequent_tokens.csv", index=False)
    examples.to_csv(ctx.out / "example_pairs.csv", index=False)
    (ctx.out / "stats.json").write_text(json.dumps(stats, indent=2), encoding="utf-8")
    (ctx.out / "report.html").write_text(
        report_html(f"{ctx.pipeline}: corpus profile", stats, tables, pictures), encoding="utf-8"
    )
    files = [q.name for q in pictures] + [
        "report.html",
        "stats.json",
        "most_frequent_tokens.csv",
        "example_pairs.csv",
    ]
    return BuildOutput(
        rows=len(pairs),
        metrics=stats,
        artifacts=files,
        markdown={"profile": stats_markdown(ctx.pipeline, stats)},
    )
