"""zhpipe from Python (notebooks, scripts): run a pipeline, load what a stage made, list runs.

    from flows import api

    result = api.run("smoke", overrides=["train.epochs=1"], project="path/to/project")
    clean = api.load("smoke", "clean")                      # the cleaned corpus as a DataFrame
    vectors = api.load("smoke", "embed")                    # gensim KeyedVectors (Word2Vec)
    predict = api.load_model("smoke", "textcnn")            # texts frame -> class probabilities
    api.runs("smoke")                                       # recent runs as a DataFrame

Every function takes `project` (a folder with a pipelines.yaml; default: found from the working
directory) and `overrides` (`--set` assignments); the same config gives the same stage keys, so
`load` finds what a run with that config built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from flows.plan import project as _project
from tasks.core import model_unit
from tasks.errors import ZhpipeError
from tasks.util.io import SPLITS


def _activate(project: str | Path | None) -> _project.Project:
    if project is not None or _project._CURRENT is None:
        return _project.activate(_project.find(project))
    return _project._CURRENT


def config(pipeline: str, overrides: list[str] | None = None, project: str | Path | None = None):
    """The validated config of one pipeline of the project, with `--set` overrides applied."""
    from flows.plan.request import RunRequest

    return RunRequest.of(
        pipeline, overrides, config_file=str(_activate(project).config_file)
    ).config()


def run(
    pipeline: str,
    overrides: list[str] | None = None,
    stages: list[str] | None = None,
    force: list[str] | None = None,
    project: str | Path | None = None,
    storage: str | None = None,
) -> dict[str, Any]:
    """Run a pipeline (cached stages are reused) and return its summary: the MLflow parent run id,
    the experiment, and per stage its key, cache hit or miss, seconds, rows and metrics."""
    from flows.plan.request import RunRequest

    request = RunRequest.of(pipeline, overrides, config_file=str(_activate(project).config_file))
    parsed = request.config()  # a bad pipeline or setting is one error line before Prefect starts
    _project.ensure_prefect_home()
    from flows.orchestrate.pipeline import pipeline_flow
    from tasks.util.urls import conceal

    return pipeline_flow(
        **request.parameters(), stages=stages, force=force, storage=conceal(storage), parsed=parsed
    )


def output(
    pipeline: str,
    stage: str,
    overrides: list[str] | None = None,
    project: str | Path | None = None,
    storage: str | None = None,
) -> Path:
    """The folder of a stage's output for this config; an error when it has not been built."""
    from flows.plan.keys import plan_keys
    from flows.plan.store import StageStore, storage_root
    from flows.track.champion import revision

    cfg = config(pipeline, overrides, project)
    keys = plan_keys(cfg, registry=revision)
    if stage not in keys:
        raise ZhpipeError(f"unknown stage '{stage}' (stages: {', '.join(keys)})")
    from flows.plan.cache import StageCache

    store = StageStore(storage_root(cfg, storage))
    if not StageCache(store).published(stage, keys[stage]):
        raise ZhpipeError(
            f"stage '{stage}' of pipeline '{pipeline}' is not built for this config (key "
            f"{keys[stage]}); "
            f"run it first: api.run('{pipeline}')"
        )
    return store.local(stage, keys[stage])


def load(
    pipeline: str,
    stage: str,
    split: str = SPLITS[0],
    overrides: list[str] | None = None,
    project: str | Path | None = None,
    storage: str | None = None,
    name: str | None = None,
) -> Any:
    """A stage's output as Python objects, read by the kind of the output its stage declares
    (tasks/stages.py): a DataFrame (download, clean, augment; split and segment give `split`'s
    rows), gensim KeyedVectors (embed), a dict of vocabularies (vocab), the model summaries (train),
    the comparison table (evaluate), the statistics (profile). `name` picks another declared output
    of the stage (e.g. "fasttext.bin")."""
    folder = output(pipeline, stage, overrides, project, storage)
    outputs = config(pipeline, overrides, project).kind.stages[stage].outputs
    if name is not None:
        outputs = tuple(o for o in outputs if o.path == name)
        if not outputs:
            declared = ", ".join(
                o.path for o in config(pipeline, overrides, project).kind.stages[stage].outputs
            )
            raise ZhpipeError(
                f"stage '{stage}' declares no output {name!r} (its outputs: {declared})"
            )
    first = outputs[0]
    if first.kind == "vocabulary":  # every vocabulary the stage writes, by its folder
        from tasks.util.io import read_vocab

        return {
            Path(o.path).parent.name: read_vocab(folder / o.path)
            for o in outputs
            if o.kind == "vocabulary"
        }
    return read_output(folder, first.path.format(split=split), first.kind)


def read_output(folder: Path, path: str, kind: str) -> Any:
    """One declared output file as Python objects, by its kind."""
    import json

    if kind in ("frame", "splits"):
        return pd.read_parquet(folder / path)
    if kind == "csv":
        return pd.read_csv(folder / path)
    if kind == "json":
        return json.loads((folder / path).read_text(encoding="utf-8"))
    if kind == "text":
        return (folder / path).read_text(encoding="utf-8").splitlines()
    if kind == "vectors":
        from gensim.models import KeyedVectors

        return KeyedVectors.load_word2vec_format(
            str(folder / path), binary=not path.endswith(".vec")
        )
    raise ZhpipeError(f"{folder / path}: no reader for outputs of kind {kind!r}")


def load_model(
    pipeline: str,
    model: str,
    overrides: list[str] | None = None,
    project: str | Path | None = None,
    storage: str | None = None,
):
    """A trained model's predict function. A classifier answers raw texts (a list, a Series, or a
    frame's `text` column) as `zhpipe predict` does, cleaned and segmented as the pipeline did:
    `label`, `probability`, one `p_<label>` per class and `status` per text; given a frame already
    segmented (`text`, `words`, `chars`), it answers its class probabilities as an array. A language
    model: a function from such a frame to its perplexity; a tagger (task ner): a function from
    cleaned texts to their `Tagged` results (BIOES tags, per-character scores and marginals)."""
    from tasks.stages import model as registered
    from tasks.stages import serving

    # first: it registers the team's own models it declares
    cfg = config(pipeline, overrides, project)
    spec = registered(model)
    training = cfg.kind.training.name
    if model not in cfg.models():
        raise ZhpipeError(
            f"model '{model}' is not in {training}.models of '{pipeline}'; add it with "
            f"overrides=['{training}.models=[..., {model}]']"
        )
    unit = model_unit(training, model)
    folder = output(pipeline, unit, overrides, project, storage) / model
    if spec.is_language_model:
        return lambda frame: spec.perplexity(folder, frame)
    predict = spec.load(folder)
    kind = serving(cfg.kind)
    # a kind whose served model answers raw texts in Python too
    answers = getattr(kind, "answering", None)
    if answers is None:
        return predict
    served = kind.Served(
        {
            **kind.settings(cfg, _labels(folder)),
            "model": model,
            "predict": cfg.predict.model_dump(),
        },
        folder,
    )
    return answers(served, predict)


def _labels(folder: Path) -> list[str]:
    """The class labels a trained classifier answers in: its unit's facts (the manifest beside its
    folder)."""
    import json

    manifest = json.loads((folder.parent / "manifest.json").read_text(encoding="utf-8"))
    labels = (manifest.get("facts") or {}).get("labels")
    if not labels:
        raise ZhpipeError(f"{folder.parent}: its manifest names no labels; run the pipeline again")
    return [str(label) for label in labels]


def runs(
    pipeline: str | None = None, limit: int = 20, project: str | Path | None = None
) -> pd.DataFrame:
    """Recent pipeline runs, newest first: id, start, status, commit, best model and its test
    metrics."""
    from flows.track.runs import pipeline_runs, runs_table

    _activate(project)
    return runs_table(pipeline_runs(pipeline, limit))
