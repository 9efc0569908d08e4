"""The `train` section of a task kind: the settings its models share, and one section per model the
kind registers (another kind's models are unknown keys)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    PrivateAttr,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from tasks.core import Section


class Common(Section):
    """The `train` section's settings that every model shares; each model of the kind adds its own
    section."""

    registered: ClassVar[dict[str, Any]] = {}  # the kind's models by name (`params_model`)
    models: list[str] = ["fasttext", "textcnn"]  # names of the kind's models, trained side by side
    epochs: int = Field(6, ge=1)  # every PyTorch model
    patience: int = Field(2, ge=1)  # early stopping on validation macro-F1 (perplexity for rnn_lm)
    device: str = "auto"  # auto = CUDA, then Apple MPS, then CPU; or cpu, cuda, cuda:1, mps
    # auto = bf16 autocast on CUDA that supports it, fp16 with a gradient scaler on CUDA that does
    # not (T4, V100), fp32 on CPU and MPS
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # the embed stage's vectors that initialise the word networks' embeddings (and bert's word
    # adapter); fastText builds a vector for every token from its subwords, Word2Vec only for words
    # it has seen
    embeddings: Literal["word2vec", "fasttext"] = "word2vec"
    seed: int = 7
    # PyTorch networks: AdamW, linear warm-up then linear decay to 0 over all epochs
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)  # share of optimizer steps spent warming up
    grad_clip: float | None = Field(1.0, gt=0)  # max gradient norm; None = no clipping
    grad_accum: int = Field(1, ge=1)  # batches per optimizer step (a larger effective batch)
    # data-parallel processes on this worker (torch.distributed): one per GPU (NCCL) on CUDA, else
    # CPU processes (gloo); each takes a share of every batch and the gradients are averaged, so the
    # model learns as one process does with the same batch size (docs/deploy.md)
    processes: int = Field(1, ge=1)
    class_weights: bool = False  # weight the loss by inverse class frequency (imbalanced corpora)
    # a time for all the models of the stage (seconds, or 90s, 3min, 1.5h; None: no limit): they run
    # cheapest first, and each network gets a share of what is left, races the leader and stops when
    # it cannot catch it in time (tasks/models/racing.py); `model_budget` caps each network's share
    budget: float | None = None
    model_budget: float | None = None
    # run this stage as a deployment run on another Prefect work pool (GPU workers); not part of the
    # key
    work_pool: str | None = Field(None, exclude=True)
    # a kind whose models may be a team's own (classification: scikit-learn estimators): the family
    # that takes a `train.<name>` section for a name the kind does not register (its `Params`, and
    # `register(name, section)`)
    own_family: ClassVar[Any] = None
    _own: dict[str, Any] = PrivateAttr(default_factory=dict)
    # set by the run (`without`), never by the config
    _cut: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _own_models(cls, data, handler):
        """A section of a name the kind does not register, holding `estimator:`, is a model of the
        team's own: it is validated by the kind's own family and registered under its name; any
        other unknown key stays an error."""
        own = {}
        if cls.own_family is not None and isinstance(data, dict):
            own = {
                k: v
                for k, v in data.items()
                if k not in cls.model_fields and isinstance(v, dict) and "estimator" in v
            }
            data = {k: v for k, v in data.items() if k not in own}
        self = handler(data)
        for name, section in own.items():
            try:
                self._own[name] = cls.own_family.Params.model_validate(section)
            except ValueError as e:
                first = e.errors()[0] if hasattr(e, "errors") else {"loc": (), "msg": str(e)}
                where = ".".join(str(p) for p in first["loc"])
                raise ValueError(
                    f"train.{name}{'.' + where if where else ''}: {first['msg']}"
                ) from None
            cls.own_family.register(name, self._own[name])
        return self

    @model_serializer(mode="wrap")
    def _with_own(self, handler, info):
        data = handler(self)
        for name, section in self._own.items():
            data[name] = section.model_dump(mode=info.mode)
        return data

    def __getattr__(self, name: str) -> Any:
        own = (self.__pydantic_private__ or {}).get("_own") or {}
        if name in own:
            return own[name]
        return super().__getattr__(name)

    def own_models(self) -> dict[str, Any]:
        """The team's own models this section declares, by name (their sections)."""
        return dict(self._own)

    def without(self, cut: dict[str, str]) -> Common:
        """This section less the models the training budget left no time for (`cut`: model -> why),
        which it names (`not_trained`): what a run's later stages are planned with."""
        copy = self.model_copy(update={"models": [m for m in self.models if m not in cut]})
        copy._cut = {**self._cut, **cut}
        return copy

    def not_trained(self) -> dict[str, str]:
        """The models of the declared list the training budget left out of this run, and why."""
        return dict(self._cut)

    @field_validator("budget", "model_budget", mode="before")
    @classmethod
    def _seconds(cls, value):
        from tasks.models.racing import seconds

        return seconds(value)

    @model_validator(mode="after")
    def _has_a_classifier(self) -> Common:
        """(A name of another kind's model is the pipeline config's to report: it knows every
        kind.)"""
        specs = [self.registered[n] for n in self.models if n in self.registered]
        if specs and len(specs) == len(self.models) and all(s.is_language_model for s in specs):
            raise ValueError(
                "train.models needs at least one classifier (ngram_lm and rnn_lm are "
                "language models only)"
            )
        return self


@lru_cache(maxsize=8)
def params_model(specs: tuple, base: type[Common] = Common) -> type[Common]:
    """The `train` section's class for one task kind: the shared settings (`base`, a kind may add
    its own) plus one section per model of the kind (`specs`, its `SPECS`; another kind's models are
    unknown keys)."""
    sections = {spec.name: (spec.params, Field(default_factory=spec.params)) for spec in specs}
    params = create_model("Params", __base__=base, __doc__="The `train` section.", **sections)
    params.registered = {spec.name: spec for spec in specs}
    return params
