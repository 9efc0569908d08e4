"""Stage `train`: the models named in `train.models`, each through its registry entry (tasks.models)."""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Literal

import numpy as np
from pydantic import Field, create_model, field_validator, model_validator

from tasks.core import BuildContext, BuildOutput, Facts, Section, Unit, by_model
from tasks.errors import DataError
from tasks.io import Rows, batches_of, predict_batches
from tasks.models import MODELS, TrainInputs
from tasks.models.base import label_ids
from tasks.vectors import load_word_vectors

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that shape
# its output, and the params that name files (counted by content)
LIBRARIES = ("torch", "transformers", "scikit-learn", "fasttext", "gensim", "numpy")
FILES: tuple[str, ...] = ("bert.checkpoint", "hf.checkpoint")


class Common(Section):
    """The `train` section's settings that every model shares; each registered model adds its own section."""

    models: list[str] = ["fasttext", "textcnn"]  # names in tasks.models.MODELS, trained side by side
    epochs: int = Field(6, ge=1)  # every PyTorch model
    patience: int = Field(2, ge=1)  # early stopping on validation macro-F1 (perplexity for rnn_lm)
    device: str = "auto"  # auto = CUDA, then Apple MPS, then CPU; or cpu, cuda, cuda:1, mps
    # auto = bf16 autocast on CUDA that supports it, fp16 with a gradient scaler on CUDA that does not (T4,
    # V100), fp32 on CPU and MPS
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # the embed stage's vectors that initialise the word networks' embeddings (and bert's word adapter);
    # fastText builds a vector for every token from its subwords, Word2Vec only for words it has seen
    embeddings: Literal["word2vec", "fasttext"] = "word2vec"
    seed: int = 7
    # PyTorch networks: AdamW, linear warm-up then linear decay to 0 over all epochs
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)  # share of optimizer steps spent warming up
    grad_clip: float | None = Field(1.0, gt=0)  # max gradient norm; None = no clipping
    grad_accum: int = Field(1, ge=1)  # batches per optimizer step (a larger effective batch)
    # data-parallel processes on this worker (torch.distributed): one per GPU (NCCL) on CUDA, else CPU processes
    # (gloo); each takes a share of every batch and the gradients are averaged, so the model learns as one
    # process does with the same batch size (docs/deploy.md)
    processes: int = Field(1, ge=1)
    class_weights: bool = False  # weight the loss by inverse class frequency (imbalanced corpora)
    # run this stage as a deployment run on another Prefect work pool (GPU workers); not part of the key
    work_pool: str | None = Field(None, exclude=True)

    @field_validator("models")
    @classmethod
    def _registered(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n not in MODELS]
        if unknown:
            raise ValueError(f"unknown model {unknown[0]!r} (registered: {', '.join(MODELS)})")
        return names

    @model_validator(mode="after")
    def _has_a_classifier(self) -> "Common":
        if all(MODELS[n].is_language_model for n in self.models):
            raise ValueError("train.models needs at least one classifier (ngram_lm and rnn_lm are language models only)")
        return self


def params_model(task: str = "classification", base: type[Common] = Common) -> type[Common]:
    """The `train` section's class for one task kind: the shared settings (`base`, a kind may add its own) plus
    one section per registered model of that kind (another kind's models are unknown keys)."""
    return _params_model(tuple((name, spec) for name, spec in MODELS.items() if spec.task == task), base)


@lru_cache(maxsize=8)
def _params_model(entries: tuple, base: type[Common]) -> type[Common]:
    sections = {name: (spec.params, Field(default_factory=spec.params)) for name, spec in entries}
    return create_model("Params", __base__=base, __doc__="The `train` section.", **sections)


def __getattr__(name: str):
    if name == "Params":  # generated from the registry, so a model added to it gets its section
        return params_model("classification")
    raise AttributeError(name)


def build_model(ctx: BuildContext, name: str) -> BuildOutput:
    """Train one model (a unit of its own): `<name>/` with the saved model, and its summary with validation
    scores. Inputs: augment, segment, vocab (and embed for models that start from word vectors)."""
    p = ctx.params
    labels = ctx.facts["augment"].labels
    if not labels:
        raise DataError("train: the corpus has no labels (source.label_column is unset); classifiers need labelled data")
    spec = MODELS[name]
    train_rows, val_rows = Rows(ctx.file("augment", "train.parquet")), Rows(ctx.file("segment", "validation.parquet"))
    # a model that streams reads its splits batch by batch (memory bounded whatever the corpus); others, whole
    train, validation = (train_rows, val_rows) if spec.streams else (train_rows.frame(), val_rows.frame())
    vectors = load_word_vectors(ctx.inputs["embed"], p.embeddings) if spec.uses_vectors else None
    members = {model: folder / model for model, folder in by_model({u: f for u, f in ctx.inputs.items() if Unit.parse(u).model}).items()}
    summary = spec.train(TrainInputs(name, train, validation, labels, spec.view(p), ctx.inputs["vocab"], vectors, ctx.out, ctx.scratch, ctx.sink,
                                     members=members))
    if not spec.is_language_model:  # classifiers: validation scores from the saved model, as it will be served
        val = predict_batches(spec.predictor(ctx.out / name), validation).argmax(1)
        gold = np.concatenate([label_ids(b, labels) for b in batches_of(validation, ["label"])])
        from sklearn.metrics import accuracy_score, f1_score

        summary["val_accuracy"] = float(accuracy_score(gold, val))
        summary["val_macro_f1"] = float(f1_score(gold, val, average="macro"))
    # the per-epoch curves (val_macro_f1, samples_per_second, ...) are the history; these are the model's totals
    names = {"val_accuracy": "val_accuracy_best", "val_macro_f1": "val_macro_f1_best", "val_perplexity": "val_perplexity_best",
             "seconds": "train_seconds", "samples_per_second": "median_samples_per_second"}
    return BuildOutput(rows=len(train_rows), metrics={new: summary[old] for old, new in names.items() if old in summary},
                       facts=Facts(labels=labels, model=name, summary=summary))


def build(ctx: BuildContext) -> BuildOutput:
    """Gather the trained models (one input per `train.<model>` unit) into `models.json`."""
    units = by_model(ctx.facts)
    models = {name: facts.summary for name, facts in units.items()}
    (ctx.out / "models.json").write_text(json.dumps(models, indent=2), encoding="utf-8")
    keys = ("val_accuracy", "val_macro_f1", "val_perplexity", "seconds", "samples_per_second")
    metrics = {f"{m}_{k}": v[k] for m, v in models.items() for k in keys if k in v}
    return BuildOutput(rows=None, metrics=metrics, facts=Facts(labels=next(iter(units.values())).labels, models=models))
