"""The model registry, and the parts every kind's models share (base: ModelSpec and the settings view; settings: a
kind's `train` section; trainer and racing: the shared loop and its budget; devices, checkpoints, batching, modules,
crf). Each kind's models live in its folder (tasks/<kind>/models): adding a model is a module there with a
`ModelSpec` and one line in that kind's `SPECS`; its `train.<name>` config section comes from the spec's `params`."""
from __future__ import annotations

import functools
import os

# oneDNN, PyTorch's CPU kernels, keeps a compiled primitive per input shape (1,024 by default), each with its
# scratch memory, and length-bucketed batches each have a shape of their own: a TextCNN epoch grew by about
# 30 KB a row (10,000 rows 1.3-1.4 GB peak, 40,000 rows 2.3 GB; with 8 kept, 1.1-1.2 GB for both, as fast). It is read
# when the first primitive is made, so setting it before a model trains is enough; a value set outside wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")

from tasks.models.base import ModelSpec, Predictor, TrainInputs  # noqa: E402


@functools.cache
def registry() -> dict[str, ModelSpec]:
    """Each kind's models (the `SPECS` of the module its `TaskKind.models` names: tasks/<kind>/models), in the kinds'
    order: a kind's models live in its folder, and nothing here imports a kind."""
    import importlib

    from tasks.stages import KINDS

    specs = []
    for kind in KINDS.values():
        specs += importlib.import_module(kind.models).SPECS if kind.models else ()
    return {spec.name: spec for spec in specs}


def __getattr__(name: str):
    """`MODELS` (the registry) is built on first use: the kinds' model modules import this package's shared parts."""
    if name == "MODELS":
        return registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MODELS", "ModelSpec", "Predictor", "TrainInputs", "get", "registry"]


def get(name: str) -> ModelSpec:
    """The spec of a registered model; an unknown name is one clear error."""
    from tasks.errors import ConfigError

    models = registry()
    if name not in models:
        raise ConfigError(f"unknown model '{name}' (registered: {', '.join(models)})")
    return models[name]
