"""Stage `evaluate` (task ner): entity-level precision, recall and F1 on the test split as the field
reports them (strict span matching, micro and per entity type), a confusion table of entity types,
the worst sentences with gold and predicted entities marked, and the champion chosen by validation
F1."""

from __future__ import annotations

import html
import json
from collections import Counter

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Facts, Section, by_model
from tasks.ner.models import MODELS
from tasks.ner.tagging import highlighted, marked, prf, span_counts, spans_of
from tasks.shared.reports import comparison_output, plot_training_curves
from tasks.shared.selection import ChampionRule

LIBRARIES = ("matplotlib",)  # a model's unit adds its spec's `libraries`
FILES: tuple[str, ...] = ()
MISSED, SPURIOUS = "(missed)", "(none)"


class Params(Section):
    """The `evaluate` section of a ner pipeline: taggers are chosen by validation entity F1."""

    # how a chosen model is promoted, after the stage: not part of its output
    OUTSIDE_KEY = ("champion",)
    champion: ChampionRule = ChampionRule()


def entity_scores(
    gold: list[list[str]], pred: list[list[str]], kinds: list[str]
) -> tuple[dict[str, float], pd.DataFrame]:
    """Micro precision/recall/F1 and a per-type table (precision, recall, f1, support), strict
    spans."""
    tp, fp, fn = span_counts(gold, pred)
    rows = [
        {
            "type": k,
            **dict(zip(("precision", "recall", "f1"), prf(tp[k], fp[k], fn[k]))),
            "support": tp[k] + fn[k],
        }
        for k in sorted(set(kinds) | set(tp) | set(fp) | set(fn))
    ]
    p, r, f = prf(sum(tp.values()), sum(fp.values()), sum(fn.values()))
    per_type = pd.DataFrame(rows, columns=["type", "precision", "recall", "f1", "support"])
    macro = (
        float(per_type.loc[per_type["support"] > 0, "f1"].mean())
        if (per_type["support"] > 0).any()
        else 0.0
    )
    return {"test_precision": p, "test_recall": r, "test_f1": f, "test_macro_f1": macro}, per_type


def type_confusion(gold: list[list[str]], pred: list[list[str]]) -> pd.DataFrame:
    """Gold entity type (rows) against the type predicted for the same span (columns); a gold entity
    with no prediction on its exact span is `(missed)`, a predicted one on no gold span `(none)` in
    the gold column."""
    pairs = Counter()
    for g, p in zip(gold, pred):
        gs = {(s, e): k for k, s, e in spans_of(list(g))}
        ps = {(s, e): k for k, s, e in spans_of(list(p))}
        for span, kind in gs.items():
            pairs[kind, ps.get(span, MISSED)] += 1
        for span, kind in ps.items():
            if span not in gs:
                pairs[SPURIOUS, kind] += 1
    rows = sorted({a for a, _ in pairs} - {SPURIOUS}) + [SPURIOUS]
    cols = sorted({b for _, b in pairs} - {MISSED}) + [MISSED]
    return pd.DataFrame([[pairs[r, c] for c in cols] for r in rows], index=rows, columns=cols)


def worst_sentences(
    test: pd.DataFrame, gold: list[list[str]], pred: list[list[str]], k: int = 50
) -> pd.DataFrame:
    """The sentences with the most entity errors (missed + spurious spans), gold and predicted
    marked."""
    rows = []
    for i, (text, g, p) in enumerate(zip(test["text"].astype(str), gold, pred)):
        gs, ps = set(spans_of(list(g))), set(spans_of(list(p)))
        errors = len(gs - ps) + len(ps - gs)
        if errors:
            rows.append(
                {
                    "id": int(test["id"].iloc[i]),
                    "errors": errors,
                    "gold": marked(text, g),
                    "predicted": marked(text, p),
                    "gold_html": highlighted(text, g),
                    "predicted_html": highlighted(text, p),
                }
            )
    table = pd.DataFrame(
        rows, columns=["id", "errors", "gold", "predicted", "gold_html", "predicted_html"]
    )
    return (
        table.sort_values(["errors", "id"], ascending=[False, True], kind="stable")
        .head(k)
        .reset_index(drop=True)
    )


def worst_html(name: str, table: pd.DataFrame) -> str:
    body = "".join(
        f"<tr><td>{r.id}</td><td>{r.errors}</td>"
        f"<td>{r.gold_html}</td><td>{r.predicted_html}</td></tr>"
        for r in table.itertuples()
    )
    return (
        f"<html><head><meta charset='utf-8'><title>{html.escape(name)}: worst test "
        "sentences</title><style>"
        "body{font-family:sans-serif} td{border-bottom:1px solid "
        "#ddd;padding:4px;vertical-align:top} "
        "mark{background:#ffe08a} sub{color:#a05a00;font-size:70%}</style></head><body>"
        f"<h2>{html.escape(name)}: the {len(table)} test sentences with the most entity errors</h2>"
        "<table><tr><th>id</th><th>errors</th><th>gold</th><th>predicted</th></tr>"
        f"{body}</table></body></html>"
    )


def build_model(ctx: BuildContext, name: str) -> BuildOutput:
    """Score one trained tagger on the test split into `evaluation/`: metrics, per-type scores, the
    type confusion table, the worst sentences and the training curves."""
    trained = ctx.facts["train"]
    labels, summary = trained.labels, trained.summary
    test = pd.read_parquet(ctx.file("segment", "test.parquet"), columns=["id", "text", "tags"])
    folder = ctx.out / "evaluation"
    folder.mkdir()
    gold = [list(t) for t in test["tags"]]
    pred = [
        t.tags
        for t in MODELS[name].load(ctx.inputs["train"] / name)(test["text"].astype(str).tolist())
    ]
    metrics, per_type = entity_scores(gold, pred, labels)
    per_type.to_csv(folder / "per_type.csv", index=False)
    type_confusion(gold, pred).to_csv(folder / "type_confusion.csv")
    worst = worst_sentences(test, gold, pred)
    worst.drop(columns=["gold_html", "predicted_html"]).to_csv(
        folder / "worst_sentences.csv", index=False
    )
    (folder / "worst_sentences.html").write_text(worst_html(name, worst), encoding="utf-8")
    plot_training_curves(
        summary.get("history", []), f"{name}: training", folder / "training_curves.png"
    )
    metrics |= {f"test_f1_{row.type}": row.f1 for row in per_type.itertuples()}
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    return BuildOutput(
        rows=len(test),
        metrics=metrics,
        artifacts=["evaluation"],
        facts=Facts(results=metrics),
        tables={
            "worst_sentences.json": worst.drop(columns=["gold_html", "predicted_html"]).astype(str),
            "per_type.json": per_type,
        },
    )


def build(ctx: BuildContext) -> BuildOutput:
    """Compare the scored taggers: `comparison.csv`; the champion is the best by validation F1."""
    units = by_model(ctx.facts)
    results = {name: facts.results for name, facts in units.items()}
    rows = [
        {
            "model": name,
            "val_f1": units[name].summary["val_f1"],
            "test_f1": r["test_f1"],
            "test_precision": r["test_precision"],
            "test_recall": r["test_recall"],
            "train_seconds": round(units[name].summary["seconds"], 1),
        }
        for name, r in results.items()
    ]
    labels = next(iter(units.values())).labels
    logged = lambda k: not k.startswith("test_f1_")
    return comparison_output(ctx.out, rows, "val_f1", results, logged, "test_f1", labels)
