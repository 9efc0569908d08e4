"""Where and how a model computes: the device (`auto`: CUDA, then Apple MPS, then CPU), the autocast
precision, the seeds."""

from __future__ import annotations

import contextlib
import functools
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
    """The forward passes' autocast type: bf16 or fp16 when asked for; `auto` takes bf16 on a CUDA
    device that supports it, fp16 (with a gradient scaler) on one that does not (T4, V100), and fp32
    elsewhere."""
    if precision in ("bf16", "fp16"):
        return torch.bfloat16 if precision == "bf16" else torch.float16
    if precision == "auto" and device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None


def autocast(device: torch.device, dtype: torch.dtype | bool | None):
    """The forward passes' precision context (`True` stands for bf16). On a CPU without native
    bf16 (no AVX-512 BF16 or AMX: AMD Zen 3, say) oneDNN has no bf16 LSTM and refuses the forward
    pass ("could not create a primitive descriptor"): oneDNN is left out of those passes there, and
    PyTorch's own kernels run them."""
    dtype = torch.bfloat16 if dtype is True else dtype or None
    if dtype is None:
        return contextlib.nullcontext()
    if device.type == "cpu" and dtype == torch.bfloat16 and not _native_bf16():
        return _without_onednn(torch.autocast(device_type="cpu", dtype=dtype))
    return torch.autocast(device_type=device.type, dtype=dtype)


@functools.cache
def _native_bf16() -> bool:
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


@contextlib.contextmanager
def _without_onednn(inner):
    before = torch.backends.mkldnn.enabled
    # not `mkldnn.flags()`, which also sets TF32 and warns each time
    torch.backends.mkldnn.enabled = False
    try:
        with inner:
            yield
    finally:
        torch.backends.mkldnn.enabled = before


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
