"""Chunked work on this machine: a process pool that runs a chunk function over a file's chunks (in
order, a bounded window at a time) and reports each worker's peak memory; flows/pools/chunks.py runs
the same chunks on Dask."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from tasks.util.io import Chunk
from tasks.util.procs import alive


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM on Linux (getrusage's ru_maxrss would include the
    memory of the parent it was forked from), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1024 / (1024 if sys.platform == "darwin" else 1)


def _worker_info() -> dict[str, Any]:
    """Where a chunk ran, and the peak memory of that process so far."""
    import socket

    return {"host": socket.gethostname(), "pid": os.getpid(), "max_rss_mb": peak_rss_mb()}


def call(fn: Callable, chunk: Chunk, params: Any) -> tuple[pa.Table, dict[str, Any]]:
    """Run `fn(chunk, params)` and report where it ran. The frame travels back as an Arrow table,
    which crosses process boundaries as buffers (much cheaper than pickling Python strings) and is
    written as is."""
    return pa.Table.from_pandas(fn(chunk, params), preserve_index=False), _worker_info()


class ChunkPool:
    """Runs chunk functions in this process (`workers=1`) or on a local process pool; the
    orchestration layer's Dask pool overrides `_results` to run them on a cluster."""

    def __init__(self, workers: int = 0):
        self.workers = workers or os.cpu_count() or 1
        self.ran_on: list[dict[str, Any]] = []  # one entry per chunk: host, pid, peak memory

    def tables(
        self, fn: Callable, chunks: list[Chunk], params: Any, desc: str = "chunks"
    ) -> Iterator[pa.Table]:
        """`fn(chunk, params)` for every chunk as Arrow tables, in chunk order, at most `window` in
        flight."""
        from tasks.util.progress import progress

        bar = progress(
            total=sum(c.rows for c in chunks),
            desc=desc,
            unit="row",
            shown=len(chunks) >= 4,
            leave=False,
            mininterval=2,
        )
        try:
            for table, info in self._results(fn, chunks, params):
                self.ran_on.append(info)
                bar.update(table.num_rows)
                yield table
        finally:
            bar.close()

    def map(
        self, fn: Callable, chunks: list[Chunk], params: Any, desc: str = "chunks"
    ) -> Iterator[pd.DataFrame]:
        """`fn(chunk, params)` for every chunk as frames, in chunk order."""
        for table in self.tables(fn, chunks, params, desc):
            yield table.to_pandas()

    def _results(self, fn, chunks, params):
        if self.workers == 1 or len(chunks) <= 1:
            for chunk in chunks:
                yield call(fn, chunk, params)
        else:
            yield from self._pool(fn, chunks, params)

    def _pool(self, fn, chunks, params):
        with _executor(min(self.workers, len(chunks))) as pool:
            yield from windowed(
                lambda c: pool.submit(call, fn, c, params),
                lambda f: f.result(),
                chunks,
                2 * self.workers,
            )


def forkserver():
    """The multiprocessing context of this machine's process pools: workers fork from a clean
    server process (started once per process, with jieba loaded), not from the caller, which has
    threads by then."""
    import multiprocessing as mp

    _short_socket_folder()
    ctx = mp.get_context("forkserver")
    # no effect once the server runs
    ctx.set_forkserver_preload(["__main__", "tasks.shared._segment_preload"])
    return ctx


# the longest folder multiprocessing's sockets fit under: a socket's path is at most 107 bytes
# (AF_UNIX), and the names multiprocessing adds (pymp-XXXXXXXX/listener-XXXXXXXX) take about 40
SOCKET_FOLDER_MAX = 64


def _executor(workers: int):
    """A process pool forked from the forkserver whose workers end with this process."""
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(
        workers, mp_context=forkserver(), initializer=_bound_to, initargs=(os.getpid(),)
    )


def _bound_to(parent: int) -> None:
    """A pool worker's initializer: the worker ends once `parent`, the process whose pool it
    serves, is gone, however that ended (killed, or exiting without shutting its pools down).
    Python's pool workers wait for work until they are told to stop, and each one keeps the
    forkserver it was forked from running: both would outlive a killed command for good."""
    import threading

    threading.Thread(
        target=_end_after, args=(parent,), name="zhpipe-pool-parent", daemon=True
    ).start()


GRACE_S = 5.0  # for the interrupted work's `with` blocks to remove what they made


def _end_after(parent: int) -> None:
    """Once `parent` has ended: the work in hand interrupted (SIGINT to this worker's main
    thread: a KeyboardInterrupt there, so that its temporary folders are removed), then this
    worker exits."""
    import select
    import signal
    import threading
    import time

    try:
        fd = os.pidfd_open(parent)  # readable once the process has ended (Linux 5.3+)
    except ProcessLookupError:
        fd = None
    except (AttributeError, OSError):  # no pidfds here: ask every second
        fd = None
        while alive(parent):
            time.sleep(1)
    if fd is not None:
        select.select([fd], [], [])
    quiet = os.open(os.devnull, os.O_WRONLY)  # its command has ended: nothing more to say there
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    time.sleep(GRACE_S)
    os._exit(1)


def _short_socket_folder() -> None:
    """The forkserver listens on a socket in a folder multiprocessing makes under TMPDIR; under a
    long TMPDIR every process pool fails with "AF_UNIX path too long". As Python 3.13 does, that
    folder goes under /tmp then (made 0700 by mkdtemp, removed at exit as multiprocessing removes
    its own)."""
    import shutil
    import tempfile
    from multiprocessing import process, util

    config = process.current_process()._config
    if config.get("tempdir") is not None or len(tempfile.gettempdir()) <= SOCKET_FOLDER_MAX:
        return
    writable = (b for b in ("/tmp", "/var/tmp", "/dev/shm") if os.access(b, os.W_OK | os.X_OK))
    base = next(writable, None)
    if base is not None:
        config["tempdir"] = folder = tempfile.mkdtemp(prefix="pymp-", dir=base)
        util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)


def elsewhere(fn: Callable, *args: Any, nice: int = 10) -> Any:
    """`fn(*args)` in a process of its own (forked from the forkserver), the caller's thread
    waiting without the interpreter lock: for work that keeps one core busy in Python while this
    process does other work. At a lower priority (`nice`): it takes the cores this process leaves
    idle, and little of those it keeps busy."""
    with _executor(1) as pool:
        return pool.submit(_niced, nice, fn, *args).result()


def _niced(nice: int, fn: Callable, *args: Any) -> Any:
    os.nice(nice)
    return fn(*args)


def windowed(submit, result, chunks, window: int):
    """Submit ahead at most `window` chunks; yield results in order (so memory is bounded by the
    window)."""
    pending: deque = deque()
    todo = iter(chunks)
    for chunk in todo:
        pending.append(submit(chunk))
        if len(pending) >= window:
            break
    while pending:
        yield result(pending.popleft())
        nxt = next(todo, None)
        if nxt is not None:
            pending.append(submit(nxt))
