"""`mlflow models serve` as a user runs it, for the tests that ask a registered model over REST."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path


@contextlib.contextmanager
def mlflow_serving(uri: str, cwd: Path, env: dict | None = None):
    """`mlflow models serve -m URI --env-manager local` on a free loopback port, in `cwd` with `env`
    (this process's when None) and the venv's bin first on PATH, as with the venv active; yields its
    base URL once /ping answers, stopped after."""
    import httpx

    from tests.helpers.procs import free_port, stop

    port = free_port()
    env = {
        **(os.environ if env is None else env),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "models",
            "serve",
            "-m",
            uri,
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            try:
                if httpx.get(f"{base}/ping", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "mlflow models serve did not start"
            time.sleep(0.25)
        yield base
    finally:
        stop(proc)
