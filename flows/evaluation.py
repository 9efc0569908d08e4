"""After the evaluate stage: one MLflow run per model (params, curves, test metrics, the saved model and its
plots, PyTorch models as MLflow models), and the best classifier registered under the champion rule."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

import tasks
from flows.registry import register_best
from flows.runner import RunContext, StageResult
from flows.tracking import Tracker
from tasks.models import MODELS


def track_models(run: RunContext, train: StageResult, evaluation: StageResult, segment: StageResult) -> dict[str, str]:
    """One nested MLflow run per model: its params, per-epoch curves, test metrics, checkpoint and plots.
    Returns each model's run id."""
    test = pd.read_parquet(segment.path / "test.parquet")
    run_ids = {}
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
        spec = MODELS[name]
        if spec.servable is not None:  # PyTorch models: also as an MLflow model (ids in, probabilities out)
            module, example = spec.servable(train.path / name, test)
            tracker.tags({"zhpipe.model_uri": tracker.pytorch_model(module, "pytorch_model", example, code_dir=Path(tasks.__file__).parent)})
        if (evaluation.path / name).is_dir():
            tracker.artifact(evaluation.path / name, "evaluation")
            if (evaluation.path / name / "worst_mistakes.csv").is_file():  # a table in the run's Evaluation view
                tracker.table(pd.read_csv(evaluation.path / name / "worst_mistakes.csv").astype(str), "worst_mistakes.json")
        tracker.finish()
        run_ids[name] = tracker.run_id
    return run_ids


def register(run: RunContext, train: StageResult, evaluation: StageResult, segment: StageResult, run_ids: dict[str, str]) -> None:
    """Register the best classifier (a pyfunc that takes raw text) and apply the champion rule; the parent
    run's tags say what happened and why."""
    best, metric = evaluation.info["best_model"], run.config.stages.evaluate.metric
    decision = register_best(
        run_ids[best], run.config.name, best, train.path / best, evaluation.info["labels"],
        run.config.stages.clean.model_dump(mode="json"), run.config.stages.segment.model_dump(mode="json"),
        pd.read_parquet(segment.path / "test.parquet"), metric, evaluation.info["results"][best][f"test_{metric}"],
    )
    Tracker(run.parent_run_id).tags({"zhpipe.registered": f"{decision.name}/{decision.version}",
                                     "zhpipe.champion": "yes" if decision.champion else "no", "zhpipe.champion_reason": decision.reason})
