"""Faults while a run goes on: a full disk, a corrupt MLflow database, the Prefect server killed.
Each ends in one `zhpipe: error:` line naming what to do, without a traceback, and leaves no
half-written output behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.procs import zhpipe, zhpipe_argv
from tests.helpers.sqlite import copy_sqlite

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e


def cli(capsys, *args) -> tuple[int, str]:
    from flows.cli import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture
def small_disk(tmp_path):
    """A 400 KB file system: the smoke pipeline's store fills it at `segment`."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {done.stderr.decode().strip()[:100]}")
    yield mount
    # lazily: a pool worker may still hold a file there
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_one_line_and_leaves_no_temporary_folder(
    prefect_harness, small_disk, capsys
):
    code, printed = cli(capsys, "run", "smoke", "--to", "segment", "--storage", str(small_disk))
    assert code == 2
    [line] = [line_ for line_ in printed.splitlines() if line_.startswith("zhpipe: error:")] or [
        printed[-3000:]
    ]
    assert (
        "disk is full" in line
        and "MB free" in line
        and str(small_disk) in line
        and "Traceback" not in printed
    )
    assert not [p for p in small_disk.rglob(".tmp-*")]  # the failed build's folder is gone


def _fill(disk: Path) -> None:
    """Fill `disk` to its last byte."""
    try:
        with open(disk / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
    except OSError:
        pass


def test_a_full_disk_anywhere_is_one_line_and_leaves_no_temporary_file(small_disk, tmp_path):
    """`init --csv` of a corpus larger than the disk left a .tmp file that kept it full and named
    the source as the file being written; `doctor` printed ~40 lines of MLflow retries over 100 s
    and left a probe behind; a run with the free-space guard off (ZHPIPE_MIN_FREE_MB=0) printed
    2,057 lines. Each is one line now, and leaves nothing."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_"))
    }
    env.update(ZHPIPE_SERVER="temporary", ZHPIPE_WARM="off", PYTHONPATH=str(ROOT))
    big = tmp_path / "big.csv"
    big.write_text(
        "text,label\n" + "".join(f"房间很干净，第{i}条评论,1\n" for i in range(40_000)),
        encoding="utf-8",
    )

    def command(*args, cwd=ROOT, **extra):
        done = zhpipe({**env, **extra}, *args, cwd=cwd)
        return done, done.stdout + done.stderr

    copied, printed = command("init", small_disk / "p", "--csv", big)
    assert copied.returncode == 2 and printed.count("\n") == 1, printed[-2000:]
    assert (
        f"writing {small_disk / 'p' / 'data' / 'raw' / 'big.csv'} failed" in printed
        and "disk is full" in printed
    )
    # no temporary copy keeps the disk full
    assert not [p for p in small_disk.rglob("*") if p.is_file()]

    made, printed = command("init", small_disk / "q")
    assert made.returncode == 0, printed
    _fill(small_disk)
    started = time.monotonic()
    doctor, printed = command("doctor", cwd=small_disk / "q")
    assert (
        doctor.returncode == 1
        and time.monotonic() - started < 60
        and "mlflow" not in printed.lower()
    ), printed
    assert "FAIL  disk" in printed and "skip  tracking" in printed and "skip  store" in printed
    run, printed = command("run", cwd=small_disk / "q", ZHPIPE_MIN_FREE_MB="0")
    assert run.returncode == 2 and printed.count("\n") == 1 and "the disk is full" in printed, (
        printed[-2000:]
    )
    left = [
        p
        for p in small_disk.rglob("*")
        if p.is_file()
        and p.name != "filler"
        and p.stat().st_size == 0
        or ".tmp" in p.name
        or "_doctor-" in p.name
        or "probe" in p.name
    ]
    assert left == []


def test_an_object_store_that_never_answers_is_one_line(
    prefect_harness, tmp_path, capsys, monkeypatch
):
    """The store's S3 endpoint refuses every connection (one attempt per request here; a run waits
    out a minute or two by default): one line naming the endpoint, no traceback."""
    from tests.helpers.procs import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
        "ZHPIPE_CACHE": str(tmp_path / "mirror"),
    }.items():
        monkeypatch.setenv(key, value)
    code, printed = cli(
        capsys, "run", "smoke", "--to", "download", "--storage", "s3://nowhere/zhpipe"
    )
    assert code == 2 and "Traceback" not in printed, printed[-3000:]
    [line] = [line_ for line_ in printed.splitlines() if line_.startswith("zhpipe: error:")] or [
        printed[-3000:]
    ]
    assert "did not answer" in line and endpoint in line and "reuses them" in line, line


def test_a_corrupt_mlflow_database_is_one_line_naming_it(
    prefect_harness, tmp_path, capsys, monkeypatch
):
    good = copy_sqlite(
        Path(os.environ["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///")), tmp_path / "good.db"
    )
    for name, damage in (
        ("garbage.db", lambda p: p.write_bytes(os.urandom(200_000))),
        ("cut.db", lambda p: p.write_bytes(good.read_bytes()[:20_000])),
    ):
        db = tmp_path / name
        damage(db)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
        code, printed = cli(
            capsys, "run", "smoke", "--to", "download", "--storage", str(tmp_path / "store")
        )
        assert code == 2 and "Traceback" not in printed, printed[-3000:]
        [line] = [
            line_ for line_ in printed.splitlines() if line_.startswith("zhpipe: error:")
        ] or [printed[-3000:]]
        assert f"MLflow's database {db} is unreadable" in line and f"mv {db} {db}.corrupt" in line


def test_the_prefect_server_killed_mid_run_ends_the_run_within_seconds(
    tmp_path, seed_prefect_home, seed_mlflow
):
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "ZHPIPE_SERVER")}
    env.update(
        {
            "PREFECT_HOME": str(seed_prefect_home(tmp_path / "prefect")),
            "ZHPIPE_DATA": str(tmp_path / "store"),
            "ZHPIPE_WARM": "off",
            "MLFLOW_TRACKING_URI": seed_mlflow(tmp_path / "mlflow.db"),
        }
    )
    zhpipe = zhpipe_argv()
    started = subprocess.run(
        [*zhpipe, "server", "start"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert started.returncode == 0, started.stderr[-2000:]
    from flows.plan import private

    state = private.read_state(tmp_path / "prefect" / "zhpipe-server.json")
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    try:
        with open(out, "w") as f:
            run = subprocess.Popen(
                [*zhpipe, "run", "smoke"],
                cwd=ROOT,
                env={**env, "TMPDIR": str(scratch)},
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 240
        while (
            "zhpipe profile: building" not in out.read_text()
            and run.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert run.poll() is None, out.read_text()[-2000:]
        os.killpg(state["pid"], signal.SIGKILL)  # the server dies mid-run
        killed = time.monotonic()
        run.wait(120)
        took = time.monotonic() - killed
    finally:
        subprocess.run(
            [*zhpipe, "server", "stop"], cwd=ROOT, env=env, capture_output=True, timeout=120
        )
    printed = out.read_text()
    assert run.returncode == 3 and took < 30, (took, printed[-2000:])
    [line] = [line_ for line_ in printed.splitlines() if line_.startswith("zhpipe: error:")] or [
        printed[-3000:]
    ]
    assert (
        "stopped answering" in line
        and "Traceback" not in printed
        and printed.count("ConnectError") < 5
    )
    # no temporary folder left (MLflow writes the night's report through one)
    assert not list(scratch.glob("tmp*"))


def test_an_aborted_command_removes_its_open_temporary_folders(tmp_path):
    """`ending.abort` ends the process with os._exit, which skips the exit hooks: folders of a
    TemporaryDirectory still open (an artifact being logged when the Prefect server died) are
    removed first."""
    code = (
        "import sys, tempfile, threading\n"
        "from flows.cli import ending\n"
        "held = tempfile.TemporaryDirectory()\n"
        "open(held.name + '/report.html', 'w').write('x')\n"
        "print(held.name, flush=True)\n"
        "threading.Thread(target=ending.abort, args=(3,)).start()\n"
        "threading.Event().wait(30)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.parent == tmp_path and not folder.exists()
