"""How a command ends: its exit status, without the interpreter's slow teardown, and told to the
warm process's client when it ran there (`flows.cli.warm` sets `REPORT`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

# set in the warm process's fork: tells its client the exit status
REPORT: Callable[[int], None] | None = None


def abort(code: int) -> NoReturn:
    """End the command now, from any thread, with `code` (no exit hooks: what they would wait for is
    gone). Temporary folders still open are removed first (`_remove_temporaries`)."""
    _remove_temporaries()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if REPORT is not None:
        REPORT(code)
    os._exit(code)


def _remove_temporaries(timeout: float = 2.0) -> None:
    """Run the finalizers a normal exit runs (`weakref.finalize(..., atexit=True)`), which
    `os._exit` skips: they remove each `tempfile.TemporaryDirectory` still open, such as the folder
    MLflow writes a report or table into before it copies it to the artifact store. Bounded in time:
    the command ends regardless."""
    import threading
    import weakref

    run = getattr(weakref.finalize, "_exitfunc", None)  # CPython's own exit hook for them
    if run is None:
        return
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)


def finish(code: int) -> NoReturn:
    """Exit with `code` as the interpreter would, less its teardown: Prefect's and MLflow's exit
    hooks run (their queues drain, logging flushes), then the process ends without freeing every
    object of every module it imported, which takes over a second once Prefect, MLflow and PyTorch
    are loaded. Every output is already written and closed by then (`tasks.util.io` writes
    atomically)."""
    import atexit
    import threading

    # joins non-daemon threads and runs their exit hooks
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if REPORT is not None:  # the warm process's fork tells its client (flows.cli.warm)
        REPORT(code)
    os._exit(code)
