"""Locks that span machines: Prefect global concurrency limits of 1, shared by every machine that reaches the Prefect
server (the GPU slot each training holds, the per-key lock of a stage store on an object store, the registry's
lock)."""
from __future__ import annotations

import contextlib
import logging

log = logging.getLogger("zhpipe")


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
