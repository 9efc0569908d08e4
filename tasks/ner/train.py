"""Stage `train` (task ner): the taggers named in `train.models`, each a unit of its own, scored on
the validation split by entity-level F1 as the saved model tags it."""

from __future__ import annotations

import json

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Facts, Unit, by_model
from tasks.models import TrainInputs, model_of
from tasks.models.settings import params_model
from tasks.ner.models import MODELS
from tasks.ner.tagged import entity_f1

# what its key sees besides params, inputs and code (a model's unit adds its spec's `libraries`:
# CRFsuite, torch, jieba for the word features, ...)
LIBRARIES = ("numpy",)
# a local pretrained encoder counts by content
FILES = ("bilstm_crf.checkpoint", "lexicon_tagger.checkpoint")


def params() -> type:
    """The `train` section: the shared settings and a section per tagger of the kind."""
    return params_model(tuple(MODELS.values()))


def build_model(ctx: BuildContext, name: str) -> BuildOutput:
    """Train one tagger: `<name>/` with the saved model, and its summary with validation scores."""
    spec = model_of(MODELS, name, "ner")
    labels = ctx.facts["augment"].labels
    train = pd.read_parquet(ctx.file("augment", "train.parquet"), columns=["text", "tags", "words"])
    validation = pd.read_parquet(
        ctx.file("segment", "validation.parquet"), columns=["text", "tags"]
    )
    members = {
        model: folder / model
        for model, folder in by_model(
            {u: f for u, f in ctx.inputs.items() if Unit.parse(u).model}
        ).items()
    }
    summary = spec.train(
        TrainInputs(
            name,
            train,
            validation,
            labels,
            spec.view(ctx.params),
            ctx.inputs["vocab"],
            None,
            ctx.out,
            ctx.scratch,
            ctx.sink,
            embed=ctx.inputs.get("embed"),
            members=members,
        )
    )
    tagged = spec.load(ctx.out / name)(validation["text"].astype(str).tolist())
    scores = entity_f1([list(t) for t in validation["tags"]], [t.tags for t in tagged])
    summary.update({f"val_{k}": v for k, v in scores.items()})
    best = ("val_f1", "val_precision", "val_recall")
    return BuildOutput.of_model(name, len(train), summary, labels, {k: f"{k}_best" for k in best})


def build(ctx: BuildContext) -> BuildOutput:
    """Gather the trained taggers (one input per `train.<model>` unit) into `models.json`."""
    units = by_model(ctx.facts)
    models = {name: facts.summary for name, facts in units.items()}
    (ctx.out / "models.json").write_text(json.dumps(models, indent=2), encoding="utf-8")
    metrics = {
        f"{m}_{k}": v[k]
        for m, v in models.items()
        for k in ("val_f1", "seconds", "samples_per_second")
        if k in v
    }
    return BuildOutput(
        rows=None,
        metrics=metrics,
        facts=Facts(labels=next(iter(units.values())).labels, models=models),
    )
