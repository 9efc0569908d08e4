"""Stage `train` (task translation): the translators named in `train.models`, each a unit of its
own, in the direction `train.direction`, scored on the validation split by corpus BLEU of its
beam-search translations."""

from __future__ import annotations

import json
from typing import Literal

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Facts, by_model
from tasks.models import TrainInputs, model_of
from tasks.models import settings as train
from tasks.translation.models import MODELS

# what its key sees besides params, inputs and code (a model's unit adds its spec's `libraries`)
LIBRARIES = ("sacrebleu", "numpy")
FILES: tuple[str, ...] = ()
COLUMNS = ["text", "en", "words", "chars"]


class Common(train.Common):
    """The `train` section's shared settings of a translation pipeline."""

    models: list[str] = ["seq2seq", "seq2seq_attention", "transformer_mt"]
    direction: Literal["zh-en", "en-zh"] = "zh-en"  # the same data stages serve both directions


def params() -> type:
    """The `train` section: the shared settings and a section per translator of the kind."""
    return train.params_model(tuple(MODELS.values()), Common)


def build_model(ctx: BuildContext, name: str) -> BuildOutput:
    """Train one translator: `<name>/model.pt`, and its summary with validation BLEU and chrF."""
    spec = model_of(MODELS, name, "translation")
    data = pd.read_parquet(ctx.file("augment", "train.parquet"), columns=COLUMNS)
    validation = pd.read_parquet(ctx.file("segment", "validation.parquet"), columns=COLUMNS)
    summary = spec.train(
        TrainInputs(
            name,
            data,
            validation,
            [],
            spec.view(ctx.params),
            ctx.inputs["vocab"],
            None,
            ctx.out,
            ctx.scratch,
            ctx.sink,
        )
    )
    totals = {"val_bleu": "val_bleu", "val_chrf": "val_chrf", "val_loss": "val_loss_best"}
    return BuildOutput.of_model(name, len(data), summary, [], totals)


def build(ctx: BuildContext) -> BuildOutput:
    """Gather the trained translators (one input per `train.<model>` unit) into `models.json`."""
    models = {name: facts.summary for name, facts in by_model(ctx.facts).items()}
    (ctx.out / "models.json").write_text(json.dumps(models, indent=2), encoding="utf-8")
    metrics = {
        f"{m}_{k}": v[k]
        for m, v in models.items()
        for k in ("val_bleu", "val_chrf", "seconds")
        if k in v
    }
    return BuildOutput(rows=None, metrics=metrics, facts=Facts(labels=[], models=models))
