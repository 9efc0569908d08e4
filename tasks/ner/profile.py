"""Stage `profile` (task ner): what the tagged corpus looks like: entities per type and split,
entity lengths per type, sentence lengths, the most frequent entities of each type, and example
sentences with their entities marked, as pictures, tables and one self-contained HTML report."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.core import BuildContext, BuildOutput
from tasks.ner.tagging import highlighted, spans_of
from tasks.shared.reports import Common, report_html, stats_markdown
from tasks.util.io import SPLITS

LIBRARIES = ("matplotlib", "numpy")
FILES: tuple[str, ...] = ("font",)


class Params(Common):
    """The `profile` section of task ner: what every kind's profile reads (no word clouds, no
    per-label pictures)."""


def entity_rows(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per entity: split, type, text, length."""
    rows = [
        (split, kind, text[s:e], e - s)
        for split, df in frames.items()
        for text, tags in zip(df["text"].astype(str), df["tags"])
        for kind, s, e in spans_of(list(tags))
    ]
    return pd.DataFrame(rows, columns=["split", "type", "entity", "length"])


def plot_types(counts: pd.DataFrame, path: Path) -> Path:
    from tasks.util.plots import save, subplots

    fig, ax = subplots(figsize=(7, 3.6))
    counts.plot.bar(ax=ax, width=0.8)
    ax.set(xlabel="", ylabel="entities", title="entities per type and split")
    ax.tick_params(axis="x", rotation=0)
    return save(fig, path)


def plot_entity_lengths(entities: pd.DataFrame, path: Path) -> Path:
    from tasks.util.plots import save, subplots

    kinds = entities["type"].value_counts().index.tolist()
    fig, ax = subplots(figsize=(7, 3.6))
    ax.boxplot([entities.loc[entities["type"] == k, "length"] for k in kinds], showfliers=True)
    ax.set_xticks(range(1, len(kinds) + 1), kinds)
    ax.set(ylabel="characters", title="entity length per type")
    return save(fig, path)


def plot_sentence_lengths(lengths: pd.Series, path: Path) -> Path:
    from tasks.util.plots import save, subplots

    fig, ax = subplots(figsize=(7, 3.4))
    hi = float(np.quantile(lengths, 0.99)) if len(lengths) else 1.0
    ax.hist(lengths.clip(upper=hi), bins=50)
    ax.set(
        xlabel="characters (clipped at the 99th percentile)",
        ylabel="sentences",
        title="sentence length",
    )
    return save(fig, path)


def build(ctx: BuildContext) -> BuildOutput:
    """`report.html` with the pictures and tables, each also as its own file."""
    from tasks.util.plots import require_cjk_font, use_font

    p: Params = ctx.params
    frames = {
        name: pd.read_parquet(
            ctx.file("segment", f"{name}.parquet"), columns=["id", "text", "tags"]
        )
        for name in SPLITS
    }
    use_font(require_cjk_font(p.font))
    entities = entity_rows(frames)
    lengths = pd.concat([df["text"].str.len() for df in frames.values()], ignore_index=True).astype(
        "float64"
    )
    counts = (
        entities.groupby(["type", "split"])
        .size()
        .unstack(fill_value=0)
        .reindex(columns=list(SPLITS), fill_value=0)
    )
    counts = counts.loc[counts.sum(axis=1).sort_values(ascending=False).index]
    pictures = [
        plot_types(counts, ctx.out / "entity_types.png"),
        plot_entity_lengths(entities, ctx.out / "entity_lengths.png"),
        plot_sentence_lengths(lengths, ctx.out / "sentence_lengths.png"),
    ]
    top = {
        k: Counter(entities.loc[entities["type"] == k, "entity"]).most_common(p.top_k)
        for k in counts.index
    }
    frequent = pd.DataFrame(
        [{"type": k, "entity": e, "count": c} for k, rows in top.items() for e, c in rows]
    )
    train = frames["train"]
    sample = train.sample(min(20, len(train)), random_state=p.seed).sort_values("id")
    examples = pd.DataFrame(
        {
            "id": sample["id"],
            "sentence": [highlighted(t, list(g)) for t, g in zip(sample["text"], sample["tags"])],
        }
    )
    stats = {
        "sentences": int(sum(len(df) for df in frames.values())),
        "entities": len(entities),
        "entity_types": int(len(counts)),
        "entities_per_sentence": len(entities) / max(sum(len(df) for df in frames.values()), 1),
        "entity_length_mean": float(entities["length"].mean()) if len(entities) else 0.0,
        "entity_length_max": int(entities["length"].max()) if len(entities) else 0,
        "chars_p50": float(lengths.median()),
        f"chars_p{round(p.coverage * 100)}": float(np.quantile(lengths, p.coverage)),
        "chars_max": int(lengths.max()),
        "suggested_max_len_chars": int(np.ceil(np.quantile(lengths, p.coverage))),
    }
    tables = {
        "entities per type and split": counts.rename_axis("type").reset_index(),
        "most frequent entities per type": frequent,
        "example sentences (train)": examples,
    }
    for name, table in tables.items():
        table.to_csv(ctx.out / f"{name.split(' (')[0].replace(' ', '_')}.csv", index=False)
    (ctx.out / "stats.json").write_text(json.dumps(stats, indent=2), encoding="utf-8")
    page = report_html(
        f"{ctx.pipeline}: corpus profile",
        stats,
        tables,
        pictures,
        markup=("example sentences (train)",),
    )
    (ctx.out / "report.html").write_text(page, encoding="utf-8")
    files = (
        [q.name for q in pictures]
        + ["report.html", "stats.json"]
        + [f"{n.split(' (')[0].replace(' ', '_')}.csv" for n in tables]
    )
    return BuildOutput(
        rows=stats["sentences"],
        metrics=stats,
        artifacts=files,
        markdown={"profile": stats_markdown(ctx.pipeline, stats)},
        records={
            "entity-types": tables["entities per type and split"].astype(str).to_dict("records")
        },
    )
