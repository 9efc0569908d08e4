"""Where and how a model computes: the device (`auto`: CUDA, then Apple MPS, then CPU), the autocast precision, the
seeds."""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` picks CUDA, then Apple MPS, then CPU."""
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def amp_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """The forward passes' autocast type: bf16 or fp16 when asked for; `auto` takes bf16 on a CUDA device that
    supports it, fp16 (with a gradient scaler) on one that does not (T4, V100), and fp32 elsewhere."""
    if precision in ("bf16", "fp16"):
        return torch.bfloat16 if precision == "bf16" else torch.float16
    if precision == "auto" and device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None


def autocast(device: torch.device, dtype: torch.dtype | bool | None):
    """The forward passes' precision context (`True` stands for bf16)."""
    dtype = torch.bfloat16 if dtype is True else dtype or None
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
