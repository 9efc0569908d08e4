"""What every kind's models share (base: ModelSpec and the settings view; settings: a kind's `train`
section; trainer and racing: the shared loop and its budget; devices, checkpoints, batching,
modules, crf). Each kind's models live in its folder (tasks/<kind>/models): adding a model is a
module there with a `ModelSpec` and one line in that kind's `SPECS`; its `train.<name>` config
section comes from the spec's `params`. Every kind's models by name are tasks.stages.MODELS: nothing
here imports a kind."""

from __future__ import annotations

import os

# oneDNN, PyTorch's CPU kernels, keeps a compiled primitive per input shape (1,024 by default), each
# with its scratch memory, and length-bucketed batches each have a shape of their own: a TextCNN
# epoch grew by about 30 KB a row (10,000 rows 1.3-1.4 GB peak, 40,000 rows 2.3 GB; with 8 kept,
# 1.1-1.2 GB for both, as fast). It is read when the first primitive is made, so setting it before a
# model trains is enough; a value set outside wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")

from tasks.models.base import ModelSpec, Predictor, TrainInputs

__all__ = ["ModelSpec", "Predictor", "TrainInputs", "model_of"]


def model_of(models: dict[str, ModelSpec], name: str, task: str) -> ModelSpec:
    """The spec of `name` among a kind's models (`models`, by name); another name is one clear
    error."""
    from tasks.errors import ConfigError

    if name not in models:
        raise ConfigError(
            f"train.models: {name!r} is not a model of task {task} (it takes {', '.join(models)})"
        )
    return models[name]
