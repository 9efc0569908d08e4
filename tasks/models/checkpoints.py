"""Training checkpoints: written atomically, with the random generator's state, so a killed training
resumes where it stopped and ends with the weights of an uninterrupted one."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

from tasks.util.private import atomic_path


def save(obj, path: Path) -> None:
    """torch.save via a temporary file and rename: a kill never leaves half a checkpoint."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def rng_state(rng: np.random.Generator) -> dict:
    """Every random-number state as tensors and a JSON string, so a checkpoint loads with
    weights_only=True (NumPy's legacy state holds an array, which a safe load refuses)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    plain = {
        "numpy_gen": rng.bit_generator.state,
        "numpy": [name, keys.tolist(), pos, has_gauss, cached],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "plain": json.dumps(plain),
    }


def set_rng_state(state: dict, rng: np.random.Generator) -> None:
    plain = json.loads(state["plain"])
    # a checkpoint loaded onto a GPU has its tensors there
    torch.set_rng_state(state["torch"].cpu())
    rng.bit_generator.state = plain["numpy_gen"]
    name, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = plain["python"]
    random.setstate((version, tuple(internal), gauss))
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
