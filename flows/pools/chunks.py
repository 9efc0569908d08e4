"""Chunked stages on a Dask cluster: a `ChunkPool` (tasks.util.io) whose chunks run as Prefect tasks
on Prefect's Dask task runner, on a local cluster or at a scheduler address. Outputs are
byte-identical to a local run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tasks.util.io import Chunk
from tasks.util.pool import ChunkPool, call, windowed

log = logging.getLogger("zhpipe")


def pool_for(
    executor: str | None, locate: Callable[[str], str] | None = None
) -> Callable[[int], ChunkPool]:
    """A factory of chunk pools for a stage: local processes (None), a local Dask cluster ("local")
    or a Dask scheduler address. `workers` 0 means one per core. `locate` turns a chunk's local file
    into what a remote cluster's workers read (the stage store's object-store URL)."""
    if executor is None:
        return ChunkPool
    return lambda workers=0: DaskPool(executor, workers, locate)


class DaskPool(ChunkPool):
    """Runs chunk functions as Prefect tasks on a Dask cluster, at most two chunks per worker in
    flight. On a cluster at an address (other machines), chunks name their files by the store's URL
    (s3://...), read through fsspec: the workers need zhpipe installed and access to the store, not
    this machine's disk."""

    def __init__(self, executor: str, workers: int = 0, locate: Callable[[str], str] | None = None):
        super().__init__(workers)
        self.executor = executor
        self.locate = locate

    def _results(self, fn, chunks, params):
        from dataclasses import replace

        from prefect_dask import DaskTaskRunner

        if self.executor != "local" and self.locate is not None:
            chunks = [replace(c, src=self.locate(c.src)) for c in chunks]
        address = local_cluster(self.workers) if self.executor == "local" else self.executor
        task_runner = DaskTaskRunner(address=address)
        run_chunk = _dask_task()
        with task_runner:
            log.info(
                "%s: %d chunks on Dask (%s), reading %s",
                fn.__name__,
                len(chunks),
                self.executor,
                chunks[0].src if chunks else "-",
            )

            def submit(chunk):
                return task_runner.submit(
                    run_chunk, parameters={"fn": fn, "chunk": chunk, "params": params}
                )

            yield from windowed(submit, lambda f: f.result(), chunks, 2 * self.workers)


def _dask_task():
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    @task(
        name="chunk",
        cache_policy=NO_CACHE,
        task_run_name="{fn.__name__}-{chunk.row_groups[0]}-{chunk.start}",
    )
    def run_chunk(fn: Callable, chunk: Chunk, params: Any):
        return call(fn, chunk, params)

    return run_chunk


_CLUSTER = None


def local_cluster(workers: int) -> str:
    """The address of this process's local Dask cluster (one worker process per core, one thread
    each), started on first use and shared by every chunked stage of the run; `shutdown` stops
    it."""
    global _CLUSTER
    if _CLUSTER is None:
        from distributed import LocalCluster

        # the workers report their task runs to this process's Prefect API; without its URL each
        # worker would start a temporary Prefect server of its own
        _CLUSTER = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            env={"PREFECT_API_URL": prefect_api_url()},
        )
        log.info("local Dask cluster: %d workers at %s", workers, _CLUSTER.scheduler_address)
    return _CLUSTER.scheduler_address


def prefect_api_url() -> str:
    """The Prefect API this process talks to (a server's, or the temporary one Prefect started
    here)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.api_url)


def shutdown() -> None:
    """Stop the local Dask cluster, if one was started."""
    global _CLUSTER
    if _CLUSTER is not None:
        _CLUSTER.close()
        _CLUSTER = None
