"""This machine's process pools (tasks/util/pool.py): work in a process of its own, at a lower
priority, under any TMPDIR."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import os
from multiprocessing import process
from tasks.util.pool import elsewhere

print(elsewhere(os.getpid) != os.getpid(), elsewhere(os.nice, 0) - os.nice(0))
print(process.current_process()._config["tempdir"])
"""


def test_work_elsewhere_runs_in_another_process_niced_even_under_a_long_tmpdir(tmp_path):
    """A socket's path is at most 107 bytes: under a TMPDIR this long, multiprocessing's
    forkserver failed with "AF_UNIX path too long" (every process pool, and every stage built
    beside the others). Its socket folder goes under /tmp."""
    long = tmp_path / ("t" * 100)
    long.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(long)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    other, niced, folder = done.stdout.split()
    assert other == "True" and int(niced) == 10
    assert not folder.startswith(str(long)) and Path(folder).parent == Path("/tmp")
    assert not Path(folder).exists()  # removed at exit, as multiprocessing removes its own
