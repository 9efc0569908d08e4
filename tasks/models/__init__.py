"""The model registry: one module per model family, one entry per model. Adding a model is a new module with
a `ModelSpec` and one line in `SHARED` (a shared family) or in its kind's `SPECS` (tasks/<kind>/models.py); its
`train.<name>` config section comes from the spec's `params`."""
from __future__ import annotations

import functools
import os

# oneDNN, PyTorch's CPU kernels, keeps a compiled primitive per input shape (1,024 by default), each with its
# scratch memory, and length-bucketed batches each have a shape of their own: a TextCNN epoch grew by about
# 30 KB a row (10,000 rows 1.3-1.4 GB peak, 40,000 rows 2.3 GB; with 8 kept, 1.1-1.2 GB for both, as fast). It is read
# when the first primitive is made, so setting it before a model trains is enough; a value set outside wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")

from tasks.models import bert, ensemble, fasttext, hf, networks, ngram, rnn_lm, tfidf  # noqa: E402
from tasks.models.base import ModelSpec, Predictor, TrainInputs  # noqa: E402

# the shared families: any kind whose `models_of` is classification trains them
SHARED: tuple[ModelSpec, ...] = (
    fasttext.SPEC,
    networks.TEXTCNN,
    networks.BILSTM,
    networks.TRANSFORMER,
    bert.SPEC,
    hf.SPEC,
    tfidf.SPEC,
    tfidf.WIDE,
    ngram.NGRAM_LM,
    rnn_lm.SPEC,
    rnn_lm.CLASSIFIER,
    ngram.LM_CLASSIFIER,
)


@functools.cache
def registry() -> dict[str, ModelSpec]:
    """The shared families, then each kind's own (the `SPECS` of the module its `TaskKind.models` names), then the
    ensemble over them: a kind's models live in its folder, and nothing here imports a kind."""
    import importlib

    from tasks.stages import KINDS

    specs = list(SHARED)
    for kind in KINDS.values():
        specs += importlib.import_module(kind.models).SPECS if kind.models else ()
    models = {spec.name: spec for spec in specs}
    models["ensemble"] = ensemble.spec(models)
    return models


def __getattr__(name: str):
    """`MODELS` (the registry) is built on first use: the kinds' model modules import this package's shared parts."""
    if name == "MODELS":
        return registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MODELS", "SHARED", "ModelSpec", "Predictor", "TrainInputs", "get", "registry"]


def get(name: str) -> ModelSpec:
    """The spec of a registered model; an unknown name is one clear error."""
    from tasks.errors import ConfigError

    models = registry()
    if name not in models:
        raise ConfigError(f"unknown model '{name}' (registered: {', '.join(models)})")
    return models[name]
