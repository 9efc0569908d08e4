"""Stage `train`: the models named in `train.models`, each through its registry entry
(tasks.models)."""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pandas as pd

from tasks.classification.models import MODELS, REGISTRY, estimator
from tasks.core import BuildContext, BuildOutput, Facts, Unit, by_model
from tasks.errors import DataError
from tasks.models import TrainInputs, model_of, racing
from tasks.models.base import label_ids
from tasks.models.racing import from_samples
from tasks.models.settings import Common, params_model
from tasks.util.io import Rows, batches_of, predict_batches
from tasks.util.vectors import load_word_vectors

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output (a model's unit adds its spec's `libraries`), and the params that name files
# (counted by content)
LIBRARIES = ("scikit-learn", "numpy")
FILES: tuple[str, ...] = ("bert.checkpoint", "hf.checkpoint")


class Settings(Common):
    """The classification `train` section's shared settings: a section of another name holding
    `estimator:` is a model of the team's own (tasks/classification/models/estimator.py)."""

    own_family = estimator


def params() -> type:
    """The `train` section: the shared settings and a section per model of the kind (a model added
    gets its section)."""
    return params_model(tuple(MODELS.values()), Settings)


def build_model(ctx: BuildContext, name: str) -> BuildOutput:
    """Train one model (a unit of its own): `<name>/` with the saved model, and its summary with
    validation scores. Inputs: augment, segment, vocab (and embed for models that start from word
    vectors)."""
    p = ctx.params
    labels = ctx.facts["augment"].labels
    if not labels:
        raise DataError(
            "train: the corpus has no labels (source.label_column is unset); "
            "classifiers need labelled data"
        )
    spec = model_of(REGISTRY, name, "classification")
    train_rows, val_rows = (
        Rows(ctx.file("augment", "train.parquet")),
        Rows(ctx.file("segment", "validation.parquet")),
    )
    # a model that streams reads its splits batch by batch (memory bounded whatever the corpus);
    # others, whole
    train, validation = (
        (train_rows, val_rows) if spec.streams else (train_rows.frame(), val_rows.frame())
    )
    vectors = load_word_vectors(ctx.inputs["embed"], p.embeddings) if spec.uses_vectors else None
    members = {
        model: folder / model
        for model, folder in by_model(
            {u: f for u, f in ctx.inputs.items() if Unit.parse(u).model}
        ).items()
    }
    inputs = TrainInputs(
        name,
        train,
        validation,
        labels,
        spec.view(p),
        ctx.inputs["vocab"],
        vectors,
        ctx.out,
        ctx.scratch,
        ctx.sink,
        members=members,
        root=ctx.root,
    )
    race = racing.current()
    if race is not None and not spec.races:  # a network is estimated from its first batches instead
        estimate, how = (
            (race.estimate, " (from its last build)")
            if race.estimate is not None
            else probe(spec, inputs)
        )
        if not race.first:
            race.admit(estimate, how)
        # the first always trains: on the rows that fit
        elif estimate is not None and estimate > race.share:
            inputs, race.cut = within_budget(inputs, estimate, race.share, how, p.seed)
    summary = spec.train(inputs)
    # classifiers: validation scores from the saved model, as it will be served
    if not spec.is_language_model:
        val = predict_batches(spec.load(ctx.out / name), validation).argmax(1)
        gold = np.concatenate([label_ids(b, labels) for b in batches_of(validation, ["label"])])
        from sklearn.metrics import accuracy_score, f1_score

        summary["val_accuracy"] = float(accuracy_score(gold, val))
        summary["val_macro_f1"] = float(f1_score(gold, val, average="macro"))
        summary["validation_rows"] = len(gold)  # what the validation scores' standard error is over
        # which validation rows it got right, packed (8 rows a byte): selection compares models row
        # by row
        summary["validation_right"] = base64.b64encode(np.packbits(val == gold).tobytes()).decode(
            "ascii"
        )
    best = ("val_accuracy", "val_macro_f1", "val_perplexity")
    return BuildOutput.of_model(
        name, len(train_rows), summary, labels, {k: f"{k}_best" for k in best}
    )


# rows of the two samples a model's cost is timed on, when a budget needs it and no history
PROBES = (1000, 3000)


def probe(spec, inputs: TrainInputs) -> tuple[float | None, str]:
    """A model's estimated training seconds on the whole train split, from timed fits on two samples
    of it (a fixed cost and a cost per row), and how it was estimated; None for a split too small to
    sample, a model that reads its splits in batches, or a sample it cannot fit (a class
    missing)."""
    import tempfile
    from dataclasses import replace
    from pathlib import Path

    rows = len(inputs.train)
    sizes = [min(n, rows // (4 * (i + 1))) for i, n in enumerate(reversed(PROBES))][::-1]
    if spec.members is not None or sizes[0] < 100:
        return None, ""
    points = []
    for size in sizes:
        sample = sampled(inputs.train, size, 0)
        with tempfile.TemporaryDirectory(prefix="zhpipe-probe-") as tmp:
            t0 = time.perf_counter()
            try:
                spec.train(
                    replace(
                        inputs,
                        train=sample,
                        validation=sampled(inputs.validation, 200, 0),
                        out=Path(tmp),
                        scratch=None,
                        sink=None,
                    )
                )
            # a sample it cannot fit leaves the model unestimated, not failed
            except Exception:  # noqa: BLE001
                return None, ""
            points.append((size, time.perf_counter() - t0))
    return from_samples(
        points, rows
    ), f" (timed on samples of {sizes[0]} and {sizes[1]} of {rows} rows)"


def sampled(train, rows: int, seed: int):
    """`rows` rows of the train split drawn at random (a frame; a `Rows` is read batch by batch)."""
    if isinstance(train, pd.DataFrame):
        return train.sample(min(rows, len(train)), random_state=seed)
    rng, share = np.random.default_rng(seed), min(1.0, rows / max(len(train), 1))
    return pd.concat([b[rng.random(len(b)) < share] for b in train.batches()], ignore_index=True)


def within_budget(
    inputs: TrainInputs, estimate: float, share: float, how: str, seed: int
) -> tuple[TrainInputs, str]:
    """The first model of a budget whose whole split would not fit in it: fitted on the share of
    rows that does (never fewer than 1,000), and why."""
    from dataclasses import replace

    total = len(inputs.train)
    rows = max(min(total, 1000), int(total * 0.85 * share / estimate))
    why = (
        f"trained on {rows:,} of {total:,} rows: all of them would take about {estimate:.0f} "
        f"s{how}, over the "
        f"budget ({share:.0f} s)"
    )
    return replace(inputs, train=sampled(inputs.train, rows, seed)), why


def build(ctx: BuildContext) -> BuildOutput:
    """Gather the trained models (one input per `train.<model>` unit) into `models.json`."""
    units = by_model(ctx.facts)
    models = {name: facts.summary for name, facts in units.items()}
    (ctx.out / "models.json").write_text(json.dumps(models, indent=2), encoding="utf-8")
    keys = ("val_accuracy", "val_macro_f1", "val_perplexity", "seconds", "samples_per_second")
    metrics = {f"{m}_{k}": v[k] for m, v in models.items() for k in keys if k in v}
    return BuildOutput(
        rows=None,
        metrics=metrics,
        facts=Facts(labels=next(iter(units.values())).labels, models=models),
    )
