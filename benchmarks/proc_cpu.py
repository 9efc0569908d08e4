"""CPU per kind of process while a command runs (Linux): every process's `utime + stime` is read
from /proc/<pid>/stat every half second, and the last value seen of each is summed by a short name
of its command line.

    python benchmarks/proc_cpu.py -- .venv/bin/python -m pytest -n 2 --dist loadfile -q
"""

import collections
import os
import re
import subprocess
import sys
import threading
import time


def kind(cmd: str) -> str:
    if "exec(eval(sys.stdin" in cmd:
        return "xdist worker"
    if "prefect.server.api.server:create_app" in cmd:
        return "the test suite's Prefect server"
    if "prefect server start" in cmd:
        return "prefect server start"
    found = re.search(r"-m (flows\.\S+) (\S+)( \S+)?", cmd)
    if found:
        return f"{found.group(1)} {found.group(2)}{found.group(3) or ''}"
    if "spawn_main" in cmd or "forkserver" in cmd:
        return "multiprocessing child"
    return cmd[:70]


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    tick = os.sysconf("SC_CLK_TCK")
    seen: dict[tuple[int, int], list] = {}
    done = threading.Event()

    def poll():
        while not done.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                    # pid and start time: a reused pid is another process
                    key = (int(pid), int(fields[19]))
                    cpu = (int(fields[11]) + int(fields[12])) / tick
                    # read each time: a child is seen with its parent's command line until it calls
                    # exec
                    seen[key] = [
                        open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
                        or seen.get(key, [""])[0],
                        cpu,
                        int(fields[19]),
                    ]
                except (OSError, IndexError, ValueError):
                    continue
            time.sleep(0.5)

    start = float(open("/proc/uptime").read().split()[0]) * tick
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    code = subprocess.call(command)
    done.set()
    thread.join()
    totals = collections.defaultdict(lambda: [0.0, 0])
    for cmd, cpu, started in seen.values():
        if started >= start and cmd:  # only what started during the command
            total = totals[kind(cmd)]
            total[0] += cpu
            total[1] += 1
    print(f"{'CPU s':>8}  {'n':>3}  process")
    for name, (cpu, n) in sorted(totals.items(), key=lambda item: -item[1][0])[:30]:
        print(f"{cpu:8.1f}  {n:3d}  {name}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
