"""The `train` section of a task kind: the settings its models share, and one section per registered model of
that kind (another kind's models are unknown keys)."""
from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, create_model, field_validator, model_validator

from tasks.core import Section
from tasks.models import MODELS


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
    # a time for all the models of the stage (seconds, or 90s, 3min, 1.5h; None: no limit): they run cheapest first,
    # and each network gets a share of what is left, races the leader and stops when it cannot catch it in time
    # (tasks/models/racing.py); `model_budget` caps each network's share
    budget: float | None = None
    model_budget: float | None = None
    # run this stage as a deployment run on another Prefect work pool (GPU workers); not part of the key
    work_pool: str | None = Field(None, exclude=True)

    @field_validator("budget", "model_budget", mode="before")
    @classmethod
    def _seconds(cls, value):
        from tasks.models.racing import seconds

        return seconds(value)

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
            raise ValueError("train.models needs at least one classifier (ngram_lm and rnn_lm are "
                             "language models only)")
        return self


def params_model(task: str = "classification", base: type[Common] = Common) -> type[Common]:
    """The `train` section's class for one task kind: the shared settings (`base`, a kind may add its own) plus
    one section per registered model of that kind (another kind's models are unknown keys)."""
    return _params_model(tuple((name, spec) for name, spec in MODELS.items() if spec.task == task), base)


@lru_cache(maxsize=8)
def _params_model(entries: tuple, base: type[Common]) -> type[Common]:
    sections = {name: (spec.params, Field(default_factory=spec.params)) for name, spec in entries}
    return create_model("Params", __base__=base, __doc__="The `train` section.", **sections)
