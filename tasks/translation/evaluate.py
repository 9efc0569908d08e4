"""Stage `evaluate` (task translation): each translator's beam-search translations of the test split
scored as the field reports them (sacrebleu corpus BLEU and chrF, with their signatures), BLEU per
source-length bucket, attention heat maps of a few test sentences, and the worst translations by
sentence chrF; the best model is chosen by validation BLEU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field

from tasks.core import BuildContext, BuildOutput, Facts, Section, by_model
from tasks.shared.reports import comparison_output, plot_training_curves
from tasks.shared.selection import ChampionRule
from tasks.translation.models import MODELS, corpus_scores
from tasks.translation.text import side_tokens, sides

LIBRARIES = ("sacrebleu", "matplotlib")  # a model's unit adds its spec's `libraries`
FILES: tuple[str, ...] = ()
BUCKETS = (5, 10, 15, 20)  # source tokens: 1-5, 6-10, 11-15, 16-20, 21+


class Params(Section):
    """The `evaluate` section of a translation pipeline: translators are chosen by validation
    BLEU."""

    # test sentences drawn with their attention (models that have it)
    heat_maps: int = Field(4, ge=0)
    worst: int = Field(50, ge=0)  # rows of the worst-translations table
    # how a chosen model is promoted, after the stage: not part of its output
    OUTSIDE_KEY = ("champion",)
    champion: ChampionRule = ChampionRule()


def bucket_names() -> list[str]:
    edges = [0, *BUCKETS]
    return [f"{a + 1}-{b}" for a, b in zip(edges, edges[1:])] + [f"{BUCKETS[-1] + 1}+"]


def bucket_bleu(hyps: list[str], refs: list[str], lengths: list[int], lang: str) -> pd.DataFrame:
    """Corpus BLEU of the test sentences grouped by source length."""
    which = np.searchsorted(np.array(BUCKETS), np.array(lengths), side="left")
    rows = []
    for i, name in enumerate(bucket_names()):
        picked = np.flatnonzero(which == i)
        if len(picked):
            score = corpus_scores([hyps[j] for j in picked], [refs[j] for j in picked], lang)
            rows.append(
                {
                    "source_tokens": name,
                    "sentences": len(picked),
                    "bleu": score["bleu"],
                    "chrf": score["chrf"],
                }
            )
    return pd.DataFrame(rows, columns=["source_tokens", "sentences", "bleu", "chrf"])


def worst_translations(
    frame: pd.DataFrame, src_lang: str, refs: list[str], hyps: list[str], k: int
) -> pd.DataFrame:
    """The test sentences with the lowest sentence chrF."""
    from sacrebleu.metrics import CHRF

    chrf = CHRF()
    scores = [chrf.sentence_score(h, [r]).score for h, r in zip(hyps, refs)]
    table = pd.DataFrame(
        {
            "id": frame["id"].to_numpy(),
            "source": frame["text" if src_lang == "zh" else "en"].astype(str).to_numpy(),
            "reference": refs,
            "translation": hyps,
            "chrf": np.round(scores, 2),
        }
    )
    return table.sort_values(["chrf", "id"], kind="stable").head(k).reset_index(drop=True)


def plot_attention(
    items: list[tuple[list[str], list[str], np.ndarray]], title: str, path: Path
) -> Path | None:
    """Heat maps of attention weights: target tokens (rows) over source tokens (columns), one panel
    per sentence."""
    from tasks.util.plots import save, subplots

    items = [it for it in items if it[2] is not None and it[2].size]
    if not items:
        return None
    fig, axes = subplots(1, len(items), figsize=(4.2 * len(items), 4.4), squeeze=False)
    for ax, (src, tgt, weights) in zip(axes[0], items):
        weights = weights[: len(tgt), : len(src)]
        ax.imshow(weights, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(src)), [t.lstrip("\u2581") for t in src], rotation=90, fontsize=8)
        ax.set_yticks(range(len(tgt)), [t.lstrip("\u2581") for t in tgt], fontsize=8)
    fig.suptitle(title)
    return save(fig, path)


def build_model(ctx: BuildContext, name: str) -> BuildOutput:
    """Translate the test split with one model into `evaluation/`: metrics, buckets, heat maps,
    worst sentences."""
    from tasks.util.plots import require_cjk_font, use_font

    p: Params = ctx.params
    summary = ctx.facts["train"].summary
    src_lang, tgt_lang = sides(summary["direction"])
    test = pd.read_parquet(
        ctx.file("segment", "test.parquet"), columns=["id", "text", "en", "words", "chars"]
    )
    translate = MODELS[name].load(ctx.inputs["train"] / name)
    hyps = [t.text for t in translate(test)]
    refs = test["text" if tgt_lang == "zh" else "en"].astype(str).tolist()
    scores = corpus_scores(hyps, refs, tgt_lang)
    lengths = [len(t) for t in side_tokens(test, src_lang, translate.zh_tokens)]
    folder = ctx.out / "evaluation"
    folder.mkdir()
    buckets = bucket_bleu(hyps, refs, lengths, tgt_lang)
    buckets.to_csv(folder / "bleu_by_length.csv", index=False)
    worst = worst_translations(test, src_lang, refs, hyps, p.worst)
    worst.to_csv(folder / "worst_translations.csv", index=False)
    pd.DataFrame({"id": test["id"], "reference": refs, "translation": hyps}).to_csv(
        folder / "translations.csv", index=False
    )
    # mid-length sentences read best
    picked = test.iloc[np.argsort([abs(n - 8) for n in lengths], kind="stable")[: p.heat_maps]]
    if p.heat_maps and len(picked):
        use_font(require_cjk_font(None))
        maps = translate(picked, attention=True)
        src_tokens = side_tokens(picked, src_lang, translate.zh_tokens)
        plot_attention(
            [(s, t.tokens + ["[SEP]"], t.attention) for s, t in zip(src_tokens, maps)],
            f"{name}: attention (test sentences)",
            folder / "attention.png",
        )
    plot_training_curves(
        summary.get("history", []), f"{name}: training", folder / "training_curves.png"
    )
    metrics = {"test_bleu": scores["bleu"], "test_chrf": scores["chrf"]}
    metrics |= {
        f"test_bleu_len_{row.source_tokens.replace('+', 'plus')}": row.bleu
        for row in buckets.itertuples()
    }
    facts = {
        **metrics,
        "bleu_signature": scores["bleu_signature"],
        "chrf_signature": scores["chrf_signature"],
    }
    (folder / "metrics.json").write_text(json.dumps(facts, indent=2), encoding="utf-8")
    return BuildOutput(
        rows=len(test),
        metrics=metrics,
        artifacts=["evaluation"],
        tags={
            "zhpipe.bleu_signature": scores["bleu_signature"],
            "zhpipe.chrf_signature": scores["chrf_signature"],
        },
        facts=Facts(labels=[], model=name, results=metrics, summary=summary),
        tables={"worst_translations.json": worst.astype(str), "bleu_by_length.json": buckets},
    )


def build(ctx: BuildContext) -> BuildOutput:
    """Compare the scored translators: `comparison.csv`; the best is the best by validation BLEU."""
    units = by_model(ctx.facts)
    results = {name: facts.results for name, facts in units.items()}
    rows = [
        {
            "model": name,
            "val_bleu": units[name].summary["val_bleu"],
            "test_bleu": r["test_bleu"],
            "test_chrf": r["test_chrf"],
            "parameters": units[name].summary.get("parameters"),
            "train_seconds": round(units[name].summary["seconds"], 1),
        }
        for name, r in results.items()
    ]
    logged = lambda k: k in ("test_bleu", "test_chrf")
    return comparison_output(ctx.out, rows, "val_bleu", results, logged, "test_bleu", [])
