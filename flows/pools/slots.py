"""Locks that span machines: Prefect global concurrency limits of 1, shared by every machine that
reaches the Prefect server (the GPU slot each training holds, the per-key lock of a stage store on
an object store, the registry's lock)."""

from __future__ import annotations

import contextlib
import logging

log = logging.getLogger("zhpipe")


@contextlib.contextmanager
def global_slot(name: str, waiting: str, timeout: float | None = None):
    """Hold a Prefect global concurrency limit of 1 (created on first use): a lock every machine
    that reaches the Prefect server shares. Logs `waiting` when another holder has it. The slot is
    leased (Prefect renews the lease while it is held), so a holder that was killed frees it when
    its lease runs out; the wait is bounded by `timeout` seconds (ZHPIPE_SLOT_WAIT, else an hour),
    after which one line names the limit and how to free it."""
    import os

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from tasks.errors import ZhpipeError

    if timeout is None:
        timeout = float(os.environ.get("ZHPIPE_SLOT_WAIT") or DEFAULT_WAIT_S)
    with get_client(sync_client=True) as client:
        try:
            limit = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=1)
                )
        else:
            if limit.active_slots:
                log.info("%s (at most %.0f s)", waiting, timeout)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(
                concurrency(
                    name, occupy=1, strict=True, timeout_seconds=timeout, lease_duration=LEASE_S
                )
            )
        except TimeoutError:
            raise ZhpipeError(
                f"the Prefect concurrency limit {name} stayed held for {timeout:.0f} s; nothing "
                "was "
                f"changed (`prefect global-concurrency-limit inspect {name}` shows it; `prefect "
                f"global-concurrency-limit update {name} --active-slots 0` frees a slot no run "
                f"holds)"
            ) from None
        yield


# a training holds the GPU slot for as long as it trains; a registry decision, seconds
DEFAULT_WAIT_S = 3600.0
LEASE_S = 300.0  # a killed holder's slot is free again at most this long after its last renewal
