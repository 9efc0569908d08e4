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


# a process whose pools are busy when it is killed: a worker beside (`elsewhere`), two on chunks
KILLED = """
import signal, threading, time
from tasks.util.pool import ChunkPool, elsewhere

threading.Thread(target=elsewhere, args=(time.sleep, 600), daemon=True).start()
waits = [[signal.SIGUSR2], [signal.SIGUSR2]]  # each chunk: sigtimedwait([SIGUSR2], 600)
pool = ChunkPool(2)
busy = lambda: list(pool._pool(signal.sigtimedwait, waits, 600))
threading.Thread(target=busy, daemon=True).start()
time.sleep(600)
"""


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError):
            continue
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_pool_workers_and_their_forkserver_end_with_the_process_that_was_killed(tmp_path):
    """A command killed (SIGKILL, or ending without shutting its pools down) while its pool workers
    work: Python's workers would wait for more work for ever, and keep the forkserver they were
    forked from alive with them."""
    import signal
    import time

    log = tmp_path / "stderr"
    with open(log, "w") as err:  # a file: the workers hold what they inherit
        proc = subprocess.Popen([sys.executable, "-c", KILLED], cwd=ROOT, stderr=err)
    deadline, workers = time.monotonic() + 120, []
    while len(workers) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
        tree = _children()
        servers = [
            p
            for p in tree.get(proc.pid, [])
            if "forkserver" in Path(f"/proc/{p}/cmdline").read_text()
        ]
        workers = [w for s in servers for w in tree.get(s, [])]
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in [*servers, *workers]) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in [*servers, *workers] if _alive(p)]
    for pid in left:  # nothing of this test outlives it
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"still running 15 s after their process was killed: {left}"
