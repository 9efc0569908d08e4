"""`zhpipe tune PIPELINE --model NAME --trials N`: an Optuna study over one model's settings. The
stages before train are built (or reused) once; each trial trains the model as an ordinary
`train.<model>` unit of the stage store (so applying the best settings later is a cache hit) and is
scored by the model's validation metric. TPE sampling, median pruning on the per-epoch validation
curve, a study that resumes from `<store>/_cache/tune/<pipeline>.db` (`data/_cache/tune/` by
default), and in MLflow one tune run with a nested run per trial (the UI's parallel coordinates
chart compares them)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from flows.orchestrate.execute import RunContext
from flows.plan.cache import StageCache
from flows.plan.config import PipelineConfig
from flows.plan.keys import plan
from flows.plan.request import RunRequest
from flows.plan.store import StageStore, storage_root
from flows.track.champion import revision
from flows.track.tracker import Tracker
from tasks.core import model_unit
from tasks.errors import ConfigError
from tasks.stages import MODELS

log = logging.getLogger("zhpipe")

# sensible ranges per model, used where pipelines.yaml's `tune.<model>` declares none
DEFAULT_SPACES: dict[str, dict[str, dict[str, Any]]] = {
    "tfidf_lr": {"C": {"low": 0.5, "high": 32.0, "log": True}, "min_df": {"choices": [1, 2, 3]}},
    "fasttext": {
        "lr": {"low": 0.05, "high": 1.0, "log": True},
        "epoch": {"low": 5, "high": 40, "step": 5},
        "word_ngrams": {"choices": [1, 2, 3]},
    },
    "textcnn": {
        "lr": {"low": 3e-4, "high": 3e-3, "log": True},
        "dropout": {"low": 0.2, "high": 0.6},
        "num_filters": {"choices": [64, 128, 256]},
    },
    "bilstm": {
        "lr": {"low": 5e-4, "high": 5e-3, "log": True},
        "dropout": {"low": 0.1, "high": 0.5},
        "hidden_size": {"choices": [64, 128, 256]},
    },
    "transformer": {
        "lr": {"low": 1e-4, "high": 1e-3, "log": True},
        "dropout": {"low": 0.0, "high": 0.3},
        "num_layers": {"choices": [1, 2, 3]},
    },
    "bert": {"lr": {"low": 2e-5, "high": 3e-4, "log": True}},
    "lm_classifier": {"order": {"choices": [2, 3, 4]}},
    "crf": {
        "c1": {"low": 0.005, "high": 0.5, "log": True},
        "c2": {"low": 0.005, "high": 0.5, "log": True},
        "window": {"choices": [1, 2, 3]},
    },
    "bilstm_crf": {
        "lr": {"low": 3e-4, "high": 3e-3, "log": True},
        "dropout": {"low": 0.2, "high": 0.6},
        "hidden_size": {"choices": [100, 200, 300]},
    },
    "lexicon_tagger": {
        "lr": {"low": 3e-4, "high": 3e-3, "log": True},
        "dropout": {"low": 0.2, "high": 0.6},
        "hidden_size": {"choices": [100, 200, 300]},
        "max_words": {"choices": [4, 6, 8]},
    },
}


def search_space(config: PipelineConfig, model: str) -> dict[str, dict[str, Any]]:
    """The model's search space: `tune.<model>` of the pipeline, else the default; every name must
    be a setting of `train.<model>` and every range well formed. The model need not be in
    train.models: the trials train it alone."""
    fits = [
        n
        for n, m in MODELS.items()
        if m.task == config.kind.model_task and not m.is_language_model and not m.members
    ]
    if model not in fits:
        raise ConfigError(
            f"tune: {model} is not a model that task {config.task} can tune (models: "
            f"{', '.join(fits)})"
        )
    space = config.tune.get(model) or DEFAULT_SPACES.get(model)
    if not space:
        raise ConfigError(
            f"tune: no search space for {model}; declare one in pipelines.yaml, e.g. "
            f"tune: {{{model}: {{lr: {{low: 0.0001, high: 0.01, log: true}}}}}}"
        )
    # every registered model has its section, in train.models or not
    section = getattr(config.stages.train, model)
    for name, dim in space.items():
        if name not in type(section).model_fields:
            raise ConfigError(
                f"tune.{model}.{name}: train.{model} has no setting '{name}' (settings: "
                f"{', '.join(type(section).model_fields)})"
            )
        if "choices" not in dim and not {"low", "high"} <= set(dim):
            raise ConfigError(
                f"tune.{model}.{name}: expected {{low, high}} (with log or step) or {{choices: "
                f"[...]}}, "
                f"got {dim}"
            )
    return space


def suggest(trial, name: str, dim: dict[str, Any]) -> Any:
    if "choices" in dim:
        return trial.suggest_categorical(name, list(dim["choices"]))
    if all(
        isinstance(dim[k], int) and not isinstance(dim[k], bool) for k in ("low", "high")
    ) and isinstance(dim.get("step", 1), int):
        return trial.suggest_int(
            name, dim["low"], dim["high"], step=dim.get("step", 1), log=bool(dim.get("log", False))
        )
    return trial.suggest_float(
        name,
        float(dim["low"]),
        float(dim["high"]),
        log=bool(dim.get("log", False)),
        step=dim.get("step"),
    )


def objective_metric(config: PipelineConfig) -> str:
    """What a trial is scored by, from the model's validation summary."""
    return f"val_{config.kind.metric(config)}"


class TrialTracker(Tracker):
    """The trial's MLflow run, which also reports the model's per-epoch validation score to Optuna
    and stops a trial the pruner gives up on."""

    def __init__(self, run_id: str, trial, curve: str):
        super().__init__(run_id)
        self.trial, self.curve = trial, curve

    def metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().metrics(metrics, step)
        if step and self.curve in metrics:
            import optuna

            self.trial.report(metrics[self.curve], step)
            if self.trial.should_prune():
                raise optuna.TrialPruned(f"epoch {step}: {self.curve} {metrics[self.curve]:.4f}")


def _assignments(training: str, model: str, params: dict[str, Any]) -> list[str]:
    return [f"{training}.{model}.{k}={v}" for k, v in params.items()]


def tune(
    request: RunRequest, model: str, trials: int, seed: int = 0, storage: str | None = None
) -> dict[str, Any]:
    """Run `trials` more trials of the study `<pipeline>/<model>`; returns the best trial's value
    and params, the `--set` lines and the YAML snippet (also written beside the study,
    `<pipeline>-<model>.yaml`)."""
    import optuna

    from flows.orchestrate.pipeline import pipeline_flow

    pipeline = request.pipeline
    base = request.config()
    space = search_space(base, model)
    metric = objective_metric(base)
    upstream = [s.name for s in base.kind.stages.values() if not s.per_model]
    log.info("tune %s/%s: the stages before train, built or reused", pipeline, model)
    pipeline_flow(**request.parameters(), stages=upstream, storage=storage, parsed=base)
    # beside the store it trains into
    folder = StageStore(storage_root(base, storage)).cache_file("tune").parent / "tune"
    folder.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=f"{model}",
        storage=f"sqlite:///{folder / f'{pipeline}.db'}",
        load_if_exists=True,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed + len(_done(folder, pipeline, model))),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1),
    )
    experiment = f"zhpipe-{pipeline}"
    parent = Tracker.start(
        experiment,
        f"tune {model}",
        tags={"zhpipe.pipeline": pipeline, "zhpipe.tune": model, "zhpipe.task": base.task},
    )
    parent.params(
        {"tune.model": model, "tune.trials": trials, "tune.metric": metric, "tune.space": space}
    )
    objective = partial(
        _trial,
        Study(
            request,
            model,
            storage,
            experiment,
            parent.run_id,
            space,
            metric,
            base.kind.training.name,
        ),
    )
    try:
        study.optimize(objective, n_trials=trials, catch=())
    except BaseException:
        parent.finish(ok=False)
        raise
    return _report(study, base, model, metric, folder, parent)


@dataclass
class Study:
    """What every trial of one study shares."""

    request: RunRequest  # the pipeline and overrides the study tunes on
    model: str
    storage: str | None
    experiment: str
    parent_run_id: str
    space: dict[str, Any]
    metric: str
    training: str  # the training stage's name


def _trial(study: Study, trial) -> float:
    """One trial: the model's training unit with the sampled settings, in a nested MLflow run that
    Optuna prunes."""
    import optuna

    from flows.orchestrate.model_stages import ModelStage

    params = {name: suggest(trial, name, dim) for name, dim in study.space.items()}
    training = study.training
    sampled = (f"{training}.models=[{study.model}]", *_assignments(training, study.model, params))
    config = replace(study.request, overrides=study.request.overrides + sampled).config()
    causes = plan(config, registry=revision)
    run = RunContext(
        config,
        StageCache(StageStore(storage_root(config, study.storage))),
        StageCache.keys(causes),
        study.experiment,
        study.parent_run_id,
        causes=causes,
    )
    spec = config.kind.training
    inputs = {name: run.reuse(name) for name in spec.needs}
    tracker = Tracker.start(
        study.experiment,
        f"trial {trial.number}",
        parent=study.parent_run_id,
        tags={
            "zhpipe.model": study.model,
            "zhpipe.trial": str(trial.number),
            "zhpipe.key": run.keys[model_unit(spec.name, study.model)],
        },
    )
    tracker.params({f"{spec.name}.{study.model}.{k}": v for k, v in params.items()})
    try:
        result = ModelStage(run, spec, budget=False).unit_run(
            study.model,
            inputs,
            tracker=TrialTracker(tracker.run_id, trial, f"{study.model}_{study.metric}"),
        )
    except optuna.TrialPruned:
        tracker.tags({"zhpipe.trial_state": "pruned"})
        tracker.finish(ok=True)
        raise
    except BaseException:
        tracker.finish(ok=False)
        raise
    value = result.facts.summary[study.metric]
    tracker.metrics({study.metric: value})
    tracker.tags({"zhpipe.trial_state": "complete", "zhpipe.cache": result.cache})
    tracker.finish()
    return value


def _report(
    study, base: PipelineConfig, model: str, metric: str, folder: Path, parent: Tracker
) -> dict[str, Any]:
    """The best trial as `--set` lines and a YAML snippet (written beside the study), in the tune
    run."""
    import optuna

    pipeline, training = base.name, base.kind.training.name
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        parent.finish(ok=False)
        raise ConfigError(
            f"tune {pipeline}/{model}: no trial completed ({len(study.trials)} pruned or failed)"
        )
    best = study.best_trial
    sets = _assignments(training, model, best.params)
    snippet = yaml.safe_dump(
        {"pipelines": {pipeline: {"stages": {training: {model: best.params}}}}},
        allow_unicode=True,
        sort_keys=False,
    )
    out = folder / f"{pipeline}-{model}.yaml"
    out.write_text(
        f"# best of {len(done)} trials: {metric} {best.value:.4f} (trial {best.number})\n"
        + snippet,
        encoding="utf-8",
    )
    parent.metrics(
        {
            f"best_{metric}": best.value,
            "trials_complete": len(done),
            "trials_pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials),
        }
    )
    parent.tags({"zhpipe.best_trial": str(best.number)})
    parent.artifact(out)
    parent.finish()
    return {
        "metric": metric,
        "value": best.value,
        "params": best.params,
        "trial": best.number,
        "trials": len(study.trials),
        "complete": len(done),
        "sets": sets,
        "yaml": snippet,
        "file": str(out),
        "run_id": parent.run_id,
    }


def _done(folder: Path, pipeline: str, model: str) -> list:
    """Trials of an earlier session of the study (so a resumed study does not replay the same
    samples)."""
    import optuna

    try:
        return optuna.load_study(
            study_name=model, storage=f"sqlite:///{folder / f'{pipeline}.db'}"
        ).trials
    except KeyError:
        return []
