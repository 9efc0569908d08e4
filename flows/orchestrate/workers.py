"""What pipeline runs on several machines share through the Prefect server: the deployment that
trains on another work pool, and the GPU slot each training holds (a global concurrency limit of 1,
flows/pools/slots.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket

from flows.pools.slots import global_slot

log = logging.getLogger("zhpipe")


def train_deployment(pipeline: str) -> str:
    """The deployment that runs a pipeline's train stage on its `stages.train.work_pool`."""
    return f"zhpipe-train/{pipeline}"


GPU_SLOT_PREFIX = "zhpipe-gpu-"


def gpu_slot_name() -> str:
    """One global concurrency limit per worker machine (ZHPIPE_GPU_SLOT overrides, e.g. one per
    GPU)."""
    return os.environ.get("ZHPIPE_GPU_SLOT") or GPU_SLOT_PREFIX + socket.gethostname()


@contextlib.contextmanager
def gpu_slot(name: str | None = None):
    """Hold this machine's GPU slot, so two trainings never share one GPU; a second waits for the
    first."""
    name = name or gpu_slot_name()
    with global_slot(name, f"train: waiting for the GPU slot {name}"):
        log.info("train: holding the GPU slot %s", name)
        yield
