"""Stage `evaluate`: test-split metrics per model, confusion matrices and a comparison table."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from prefect import task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support  # noqa: E402

from flows.runner import BuildContext, BuildOutput, RunContext, StageResult  # noqa: E402
from flows.tracking import Tracker  # noqa: E402
from tasks.train import PERPLEXITY, PREDICTORS, label_ids, servable_model  # noqa: E402

VERSION = "4"


def score(y_true: np.ndarray, y_pred: np.ndarray, labels: list[str]) -> tuple[dict[str, float], pd.DataFrame, np.ndarray]:
    """Accuracy, macro-F1, a per-class precision/recall/F1 table and the confusion matrix."""
    ids = list(range(len(labels)))
    p, r, f, support = precision_recall_fscore_support(y_true, y_pred, labels=ids, zero_division=0)
    per_class = pd.DataFrame({"label": labels, "precision": p, "recall": r, "f1": f, "support": support})
    metrics = {
        "test_accuracy": float(accuracy_score(y_true, y_pred)),
        "test_macro_f1": float(f1_score(y_true, y_pred, labels=ids, average="macro", zero_division=0)),
    }
    return metrics, per_class, confusion_matrix(y_true, y_pred, labels=ids)


CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei",
             "SimHei", "Microsoft YaHei", "PingFang SC", "Heiti SC", "AR PL UMing CN")


@lru_cache(maxsize=1)
def cjk_font() -> str | None:
    """The first installed font that has Chinese glyphs, or None."""
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    return next((name for name in CJK_FONTS if name in installed), None)


def tick_labels(labels: list[str]) -> tuple[list[str], str]:
    """Labels as they can be drawn: Chinese needs a CJK font, else class indices (named in the CSV)."""
    if not any(ord(c) > 0x2E80 for label in labels for c in label) or cjk_font():
        return labels, ""
    return [str(i) for i in range(len(labels))], "\n(no CJK font: class indices; names in confusion_matrix.csv)"


def plot_confusion(matrix: np.ndarray, labels: list[str], title: str, path: Path) -> None:
    """Confusion matrix heat map with counts, true labels on rows."""
    shown, note = tick_labels(labels)
    size = 2.5 + 0.45 * len(labels)
    fig, ax = plt.subplots(figsize=(size, size))
    if cjk_font():
        plt.rcParams["font.sans-serif"] = [cjk_font(), *plt.rcParams["font.sans-serif"]]
    ax.imshow(matrix, cmap="Blues")
    ax.set(xticks=range(len(labels)), yticks=range(len(labels)), xticklabels=shown, yticklabels=shown,
           xlabel="predicted" + note, ylabel="true", title=title)
    if max(map(len, shown)) > 3:
        plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    for i in range(len(labels)):
        for j in range(len(labels)):
            ax.text(j, i, int(matrix[i, j]), ha="center", va="center", color="white" if matrix[i, j] > matrix.max() / 2 else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def comparison_markdown(table: pd.DataFrame) -> str:
    """The comparison table as Markdown (for Prefect's artifact view)."""
    header = "| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns) + "\n"
    body = "".join("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row) + " |\n" for row in table.itertuples(index=False))
    return header + body


def build(ctx: BuildContext) -> BuildOutput:
    """Score each trained model on the test split; write per-model folders and `comparison.csv`."""
    info = ctx.input_info["train"]
    labels, models = info["labels"], info["models"]
    test = pd.read_parquet(ctx.inputs["segment"] / "test.parquet")
    y_true = label_ids(test, labels)
    rows, results = [], {}
    for name, summary in models.items():
        if name in PERPLEXITY:
            results[name] = {"test_perplexity": PERPLEXITY[name](ctx.inputs["train"] / name, test)}
            continue
        probs = PREDICTORS[name](ctx.inputs["train"] / name)(test)
        metrics, per_class, matrix = score(y_true, probs.argmax(1), labels)
        folder = ctx.out / name
        folder.mkdir()
        per_class.to_csv(folder / "per_class.csv", index=False)
        pd.DataFrame(matrix, index=labels, columns=labels).to_csv(folder / "confusion_matrix.csv")
        plot_confusion(matrix, labels, f"{name}: test confusion matrix", folder / "confusion_matrix.png")
        results[name] = metrics
        rows.append({"model": name, **metrics, "val_macro_f1": models[name]["val_macro_f1"], "train_seconds": round(models[name]["seconds"], 1)})
    table = pd.DataFrame(rows).sort_values(f"test_{ctx.params.metric}", ascending=False)
    table.to_csv(ctx.out / "comparison.csv", index=False)
    (ctx.out / "comparison.md").write_text(comparison_markdown(table), encoding="utf-8")
    best = table.iloc[0]["model"]
    (ctx.out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    lms = {m: r["test_perplexity"] for m, r in results.items() if "test_perplexity" in r}
    if lms:
        pd.DataFrame({"model": list(lms), "test_perplexity": list(lms.values())}).to_csv(ctx.out / "language_models.csv", index=False)
    return BuildOutput(
        rows=len(test),
        metrics={f"{m}_{k}": v for m, r in results.items() for k, v in r.items()} | {"best_test_accuracy": results[best]["test_accuracy"]},
        info={"labels": labels, "results": results, "best_model": best},
        artifacts=["comparison.csv", "comparison.md"] + (["language_models.csv"] if lms else []),
    )


def track_models(run: RunContext, train: StageResult, evaluation: StageResult, segment: StageResult) -> None:
    """One nested MLflow run per model: its params, per-epoch curves, test metrics, checkpoint and plots."""
    test = pd.read_parquet(segment.path / "test.parquet")
    for name, summary in train.info["models"].items():
        tracker = Tracker.start(run.experiment, name, parent=run.parent_run_id, tags={"zhpipe.model": name, "zhpipe.train_key": train.key})
        section = getattr(run.config.stages.train, name)
        tracker.params({"model": name, "epochs": run.config.stages.train.epochs, "seed": run.config.stages.train.seed, **section.model_dump()})
        for row in summary.get("history", []):
            tracker.metrics({k: v for k, v in row.items() if k != "epoch"}, step=row["epoch"])
        for row in summary.get("pretrain_history", []):  # bert's masked-LM pretraining
            tracker.metrics({f"mlm_{k}": v for k, v in row.items() if k != "epoch"}, step=row["epoch"])
        facts = {k: summary[k] for k in ("parameters", "best_epoch", "resumed_from_epoch") if k in summary}
        facts["median_samples_per_second"] = summary["samples_per_second"]  # the per-epoch curve is samples_per_second
        best_val = {"val_macro_f1_best": summary["val_macro_f1"]} if "val_macro_f1" in summary else {}
        tracker.metrics({**evaluation.info["results"][name], **best_val, **facts, "train_seconds": summary["seconds"]})
        tracker.artifact(train.path / name, "model")
        servable = servable_model(name, train.path / name, test)
        if servable is not None:  # PyTorch models: also as an MLflow model (ids in, probabilities out)
            module, example = servable
            tracker.tags({"zhpipe.model_uri": tracker.pytorch_model(module, "pytorch_model", example, code_dir=Path(__file__).parent)})
        if (evaluation.path / name).is_dir():
            tracker.artifact(evaluation.path / name, "evaluation")
        tracker.finish()


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(run: RunContext, train: StageResult, segment: StageResult) -> StageResult:
    """Test metrics and the model comparison; tracked per model."""
    result = run.run("evaluate", {"train": train, "segment": segment}, build)
    track_models(run, train, result, segment)
    create_markdown_artifact(
        markdown=f"# {run.config.name}: model comparison (test split)\n\n" + (result.path / "comparison.md").read_text(encoding="utf-8"),
        key=f"{run.config.name}-comparison".replace("_", "-").lower(),
        description="zhpipe evaluate",
    )
    return result
