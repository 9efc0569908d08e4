"""What pipeline runs on several machines share through the Prefect server: the deployment that trains on
another work pool, and locks (global concurrency limits of 1) that span machines: the GPU slot each
training holds, and the per-key lock of a stage store on an object store."""
from __future__ import annotations

import contextlib
import logging
import os
import socket

log = logging.getLogger("zhpipe")


def train_deployment(pipeline: str) -> str:
    """The deployment that runs a pipeline's train stage on its `stages.train.work_pool`."""
    return f"zhpipe-train/{pipeline}"


GPU_SLOT_PREFIX = "zhpipe-gpu-"


def gpu_slot_name() -> str:
    """One global concurrency limit per worker machine (ZHPIPE_GPU_SLOT overrides, e.g. one per GPU)."""
    return os.environ.get("ZHPIPE_GPU_SLOT") or GPU_SLOT_PREFIX + socket.gethostname()


@contextlib.contextmanager
def global_slot(name: str, waiting: str):
    """Hold a Prefect global concurrency limit of 1 (created on first use): a lock every machine that reaches
    the Prefect server shares. Logs `waiting` when another holder has it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        else:
            if limit.active_slots:
                log.info("%s", waiting)
    with concurrency(name, occupy=1, strict=True):
        yield


@contextlib.contextmanager
def gpu_slot(name: str | None = None):
    """Hold this machine's GPU slot, so two trainings never share one GPU; a second waits for the first."""
    name = name or gpu_slot_name()
    with global_slot(name, f"train: waiting for the GPU slot {name}"):
        log.info("train: holding the GPU slot %s", name)
        yield
