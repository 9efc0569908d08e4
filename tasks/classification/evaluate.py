"""Stage `evaluate`: test-split metrics per model, confusion matrices and a comparison table."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from tasks.classification.models import REGISTRY as MODELS
from tasks.core import BuildContext, BuildOutput, Facts, Section, by_model
from tasks.models.base import label_ids
from tasks.shared.reports import comparison_markdown, plot_training_curves
from tasks.shared.selection import ChampionRule
from tasks.util.io import Rows, batches_of, predict_batches

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output, and the params that name files (counted by content)
LIBRARIES = ("scikit-learn", "numpy", "matplotlib")  # a model's unit adds its spec's `libraries`
FILES: tuple[str, ...] = ()


class Params(Section):
    """The `evaluate` section."""

    # picks the best model, on the validation split
    metric: Literal["accuracy", "macro_f1"] = "accuracy"
    # simplest: the cheapest model (ModelSpec.cost) the best one does not beat beyond the noise, row
    # by row on the validation split (a lead inside the noise picks no costlier model); best: the
    # best score alone
    select: Literal["simplest", "best"] = "simplest"
    # how a chosen model is promoted, after the stage: not part of its output
    OUTSIDE_KEY = ("champion",)
    champion: ChampionRule = ChampionRule()


def right_rows(summary: dict) -> np.ndarray | None:
    """Which validation rows a trained classifier got right (from its training summary), or None."""
    packed, rows = summary.get("validation_right"), summary.get("validation_rows")
    if not packed or not rows:
        return None
    return np.unpackbits(np.frombuffer(base64.b64decode(packed), dtype=np.uint8))[:rows].astype(
        bool
    )


def paired_gap(better: np.ndarray, cheaper: np.ndarray) -> tuple[float, float]:
    """(accuracy of `better` minus `cheaper`, the standard error of that difference) on the same
    validation rows: only the rows where one is right and the other wrong carry the difference (as
    in McNemar's test)."""
    n = len(better)
    only_better, only_cheaper = float(np.sum(better & ~cheaper)), float(np.sum(cheaper & ~better))
    gap = (only_better - only_cheaper) / n
    return gap, math.sqrt(max(only_better + only_cheaper - n * gap * gap, 0.0)) / n


def choose(
    table: pd.DataFrame,
    metric: str,
    right: dict[str, np.ndarray | None],
    select: str,
    z: float = 1.96,
) -> tuple[str, str]:
    """(the chosen model, why) from the comparison table sorted best first by `val_<metric>`: with
    `simplest`, the cheapest model (ModelSpec.cost) that the best is not better than beyond the
    noise, row by row on the same validation rows (its lead under `z` standard errors of the paired
    difference: a 95% interval holding zero)."""
    best, top = table.iloc[0]["model"], float(table.iloc[0][f"val_{metric}"])
    # no rows to compare (a summary from before they were kept)
    if select == "best" or right.get(best) is None:
        return best, f"best validation {metric} ({top:.4f})"
    scores = table.set_index("model")[f"val_{metric}"]
    for model in sorted(table["model"], key=lambda m: (MODELS[m].cost, -float(scores[m]))):
        if model == best or MODELS[model].cost >= MODELS[best].cost or right.get(model) is None:
            continue
        gap, se = paired_gap(right[best], right[model])
        if gap <= z * se:
            return model, (
                f"validation {metric} {float(scores[model]):.4f} against {best}'s {top:.4f}: "
                f"{best} is "
                f"ahead by {100 * gap:.2f} points of accuracy on the same {len(right[best])} rows, "
                "inside "
                f"the noise ({z:g} x {100 * se:.2f}); the cheaper model is chosen "
                f"(evaluate.select: simplest)"
            )
    return (
        best,
        f"best validation {metric} ({top:.4f}), better than every cheaper model beyond the noise",
    )


def metric_name(label: str) -> str:
    """A label as part of an MLflow metric name (letters, digits, `_ - . /` and spaces are allowed
    there)."""
    import re

    return re.sub(r"[^\w\-./ ]", "_", str(label)).strip() or "_"


def score(
    y_true: np.ndarray, y_pred: np.ndarray, labels: list[str]
) -> tuple[dict[str, float], pd.DataFrame, np.ndarray]:
    """Accuracy, macro-F1, a per-class precision/recall/F1 table and the confusion matrix."""
    ids = list(range(len(labels)))
    from sklearn.metrics import (
        accuracy_score,
        confusion_matrix,
        f1_score,
        precision_recall_fscore_support,
    )

    p, r, f, support = precision_recall_fscore_support(y_true, y_pred, labels=ids, zero_division=0)
    per_class = pd.DataFrame(
        {"label": labels, "precision": p, "recall": r, "f1": f, "support": support}
    )
    metrics = {
        "test_accuracy": float(accuracy_score(y_true, y_pred)),
        "test_macro_f1": float(
            f1_score(y_true, y_pred, labels=ids, average="macro", zero_division=0)
        ),
    }
    return metrics, per_class, confusion_matrix(y_true, y_pred, labels=ids)


def tick_labels(labels: list[str]) -> tuple[list[str], str]:
    """Labels as they can be drawn: Chinese needs a CJK font, else class indices (named in the
    CSV)."""
    from tasks.util.plots import cjk_font

    if not any(ord(c) > 0x2E80 for label in labels for c in label) or cjk_font():
        return labels, ""
    return [
        str(i) for i in range(len(labels))
    ], "\n(no CJK font: class indices; names in confusion_matrix.csv)"


def plot_confusion(matrix: np.ndarray, labels: list[str], title: str, path: Path) -> None:
    """Confusion matrix heat map with counts, true labels on rows."""
    from tasks.util.plots import cjk_font, save, subplots, use_font

    shown, note = tick_labels(labels)
    size = 2.5 + 0.45 * len(labels)
    fig, ax = subplots(figsize=(size, size))
    if cjk_font():
        use_font(cjk_font())
    ax.imshow(matrix, cmap="Blues")
    ax.set(
        xticks=range(len(labels)),
        yticks=range(len(labels)),
        xticklabels=shown,
        yticklabels=shown,
        xlabel="predicted" + note,
        ylabel="true",
        title=title,
    )
    if max(map(len, shown)) > 3:
        ax.tick_params(axis="x", labelrotation=45)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(
                j,
                i,
                int(matrix[i, j]),
                ha="center",
                va="center",
                color="white" if matrix[i, j] > matrix.max() / 2 else "black",
            )
    save(fig, path)


def plot_pr_curves(
    y_true: np.ndarray, probs: np.ndarray, labels: list[str], title: str, path: Path
) -> dict[str, float]:
    """One-vs-rest precision-recall curve per class; returns each class's average precision."""
    from sklearn.metrics import average_precision_score, precision_recall_curve

    from tasks.util.plots import save, subplots

    shown, note = tick_labels(labels)
    fig, ax = subplots(figsize=(5.5, 4.2))
    ap = {}
    for i, label in enumerate(labels):
        positive = (y_true == i).astype(int)
        if positive.sum() == 0:
            continue
        precision, recall, _ = precision_recall_curve(positive, probs[:, i])
        ap[label] = float(average_precision_score(positive, probs[:, i]))
        ax.step(recall, precision, where="post", label=f"{shown[i]} (AP {ap[label]:.3f})")
    ax.set(xlabel="recall" + note, ylabel="precision", xlim=(0, 1), ylim=(0, 1.02), title=title)
    ax.legend(loc="lower left")
    save(fig, path)
    return ap


def worst_mistakes(
    test, y_true: np.ndarray, probs: np.ndarray, labels: list[str], k: int = 50
) -> pd.DataFrame:
    """The wrong predictions the model was most sure of: text, true label, predicted label,
    confidence. `test` is the split as a frame or a `Rows` (only the rows shown are kept while
    reading it)."""
    pred = probs.argmax(1)
    wrong = np.flatnonzero(pred != y_true)
    order = wrong[np.argsort(-probs[wrong, pred[wrong]], kind="stable")][:k]
    rows, start, wanted = [], 0, pd.Series(range(len(order)), index=order)
    for batch in batches_of(test, ["id", "text"]):
        hit = wanted.index[(wanted.index >= start) & (wanted.index < start + len(batch))]
        rows.append(batch.iloc[hit - start].assign(_rank=wanted[hit].to_numpy()))
        start += len(batch)
    shown = pd.concat(rows).sort_values("_rank") if rows else pd.DataFrame({"id": [], "text": []})
    return pd.DataFrame(
        {
            "id": shown["id"].to_numpy(),
            "text": shown["text"].to_numpy(),
            "true": [labels[i] for i in y_true[order]],
            "predicted": [labels[i] for i in pred[order]],
            "confidence": probs[order, pred[order]].round(4),
        }
    )


def build_model(ctx: BuildContext, name: str) -> BuildOutput:
    """Score one trained model (the `train.<name>` unit's output) on the test split: its metrics,
    and for a classifier the per-class scores, confusion matrix, PR curves, training curves and
    worst mistakes in `evaluation/`."""
    trained = ctx.facts["train"]
    labels, summary, spec = trained.labels, trained.summary, MODELS[name]
    test = Rows(ctx.file("segment", "test.parquet"))
    folder = ctx.out / "evaluation"
    folder.mkdir()
    if spec.is_language_model:
        # read in batches
        metrics = {"test_perplexity": spec.perplexity(ctx.inputs["train"] / name, test)}
    # scored batch by batch: memory is one batch and the probabilities, whatever the test split
    else:
        y_true = np.concatenate([label_ids(b, labels) for b in test.batches(["label"])])
        probs = predict_batches(spec.load(ctx.inputs["train"] / name), test)
        metrics, per_class, matrix = score(y_true, probs.argmax(1), labels)
        per_class.to_csv(folder / "per_class.csv", index=False)
        pd.DataFrame(matrix, index=labels, columns=labels).to_csv(folder / "confusion_matrix.csv")
        plot_confusion(
            matrix, labels, f"{name}: test confusion matrix", folder / "confusion_matrix.png"
        )
        ap = plot_pr_curves(
            y_true, probs, labels, f"{name}: test precision-recall", folder / "pr_curves.png"
        )
        # named by label, not by index
        metrics |= {f"test_ap_{metric_name(label)}": v for label, v in ap.items()}
        worst = worst_mistakes(test, y_true, probs, labels)
        worst.to_csv(folder / "worst_mistakes.csv", index=False)
        plot_training_curves(
            summary.get("history", []), f"{name}: training", folder / "training_curves.png"
        )
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    tables = {} if spec.is_language_model else {"worst_mistakes.json": worst.astype(str)}
    return BuildOutput(
        rows=len(test),
        metrics=metrics,
        facts=Facts(results=metrics),
        artifacts=["evaluation"],
        tables=tables,
    )


def build(ctx: BuildContext) -> BuildOutput:
    """Compare the scored models (one input per `evaluate.<model>` unit): `comparison.csv` and the
    model chosen on validation (`evaluate.metric`, `evaluate.select`), with why in `chosen.json`;
    its test metrics are reported as `best_test_*`."""
    units = by_model(ctx.facts)
    results = {name: facts.results for name, facts in units.items()}
    labels = next(iter(units.values())).labels
    # the best model is chosen on validation; test metrics are reported, never used to choose
    rows = [
        {
            "model": name,
            "val_accuracy": units[name].summary["val_accuracy"],
            "val_macro_f1": units[name].summary["val_macro_f1"],
            "test_accuracy": r["test_accuracy"],
            "test_macro_f1": r["test_macro_f1"],
            "train_seconds": round(units[name].summary["seconds"], 1),
            # why the training budget cut it short
            "budget": units[name].summary.get("cut_short", ""),
        }
        for name, r in results.items()
        if "test_accuracy" in r
    ]
    scored = pd.DataFrame(rows).sort_values(
        f"val_{ctx.params.metric}", ascending=False, kind="stable"
    )
    # the models the training budget left no time for: named, last, with no scores (never chosen)
    cut = ctx.stages.train.not_trained() if ctx.stages is not None else {}
    table = (
        pd.concat(
            [scored, pd.DataFrame([{"model": m, "budget": why} for m, why in cut.items()])],
            ignore_index=True,
        )
        if cut
        else scored
    )
    if not table["budget"].any():
        table = table.drop(columns="budget")
    table.to_csv(ctx.out / "comparison.csv", index=False)
    best, why = choose(
        scored,
        ctx.params.metric,
        {m: right_rows(units[m].summary) for m in scored["model"]},
        ctx.params.select,
    )
    # chosen on a curve the budget cut: said wherever the choice is
    if units[best].summary.get("cut_short"):
        why += f"; cut short by the training budget ({units[best].summary['cut_short']})"
    (ctx.out / "comparison.md").write_text(
        comparison_markdown(table) + f"\n\nChosen: **{best}**, {why}.\n", encoding="utf-8"
    )
    chosen = {"model": best, "why": why, "cut_short": units[best].summary.get("cut_short", "")}
    (ctx.out / "chosen.json").write_text(json.dumps(chosen, ensure_ascii=False), encoding="utf-8")
    (ctx.out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    lms = {m: r["test_perplexity"] for m, r in results.items() if "test_perplexity" in r}
    if lms:
        pd.DataFrame({"model": list(lms), "test_perplexity": list(lms.values())}).to_csv(
            ctx.out / "language_models.csv", index=False
        )
    return BuildOutput(
        rows=None,
        metrics={f"{m}_{k}": v for m, r in results.items() for k, v in r.items()}
        | {
            "best_test_accuracy": results[best]["test_accuracy"],
            "best_test_macro_f1": results[best]["test_macro_f1"],
            f"best_val_{ctx.params.metric}": units[best].summary[f"val_{ctx.params.metric}"],
        },
        facts=Facts(labels=labels, results=results, best_model=best),
        artifacts=["comparison.csv", "comparison.md", "chosen.json"]
        + (["language_models.csv"] if lms else []),
        tags={"zhpipe.chosen_because": why},
    )
