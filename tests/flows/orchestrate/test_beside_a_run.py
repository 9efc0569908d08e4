"""A second actor beside a run: `zhpipe gc` while a run builds, `zhpipe accept` while runs judge, a
copied project's `server stop`, `zhpipe ui` on a taken port, a project on a full disk, and names
that reach HTML, Markdown and shell lines. Each reproduces a hole a review found; each fails against
the code before the fix."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.plan import held, leases, project
from flows.plan.maintenance import collect_garbage
from flows.plan.store import Manifest, StageStore
from tests.helpers.cli import in_process
from tests.helpers.procs import zhpipe_argv

ROOT = Path(__file__).resolve().parents[3]
KEY, OTHER = "0123456789abcdef", "fedcba9876543210"


def publish(root: Path, stage: str, key: str) -> Path:
    out = root / stage / key
    out.mkdir(parents=True)
    (out / "part.txt").write_text("x")
    Manifest(stage=stage, key=key, params={}, inputs={}, rows=1, seconds=0.0).write(out)
    return out


def test_gc_leaves_what_a_live_run_holds(tmp_path):
    """A live run's lease keeps its keys, its scratch and its locks; outputs published after gc
    began are kept; once the run ends, the same gc removes them all."""
    store = StageStore(tmp_path / "data")
    mine = publish(store.root, "embed", KEY)
    fresh = publish(store.root, "clean", OTHER)
    scratch = store.scratch("train.textcnn", KEY)
    lock = store.root / "embed" / f".lock-{OTHER}"
    lock.touch()
    with leases.held(store, {"embed": KEY, "train.textcnn": KEY}):
        with leases.gc_lock(store):
            live = leases.live(store)
            kept: list[dict] = []
            removed = collect_garbage(store, set(), live=live, since=time.time() - 0.5, kept=kept)
        assert removed == [] and len(live) == 1
        assert {Path(k["path"]).name for k in kept} == {
            KEY,
            OTHER,
            f".scratch-{KEY}",
            f".lock-{OTHER}",
        }
        assert "live run" in " ".join(k["why"] for k in kept)
    assert mine.is_dir() and fresh.is_dir() and scratch.is_dir() and lock.exists()
    with leases.gc_lock(store):
        assert leases.live(store) == []  # released: nothing holds it now
        gone = collect_garbage(store, set(), live=[], since=time.time() + 60)
    assert {Path(g["path"]).name for g in gone} == {KEY, OTHER, f".scratch-{KEY}", f".lock-{OTHER}"}


def test_a_lock_a_run_holds_is_never_removed(tmp_path):
    """Even without a lease (a builder from an older zhpipe): a key's lock held by a process keeps
    its lock file and scratch folder."""
    store = StageStore(tmp_path / "data")
    scratch = store.scratch("embed", KEY)
    with store.lock("embed", KEY):
        kept: list[dict] = []
        assert collect_garbage(store, set(), kept=kept) == []
        assert {Path(k["path"]).name for k in kept} == {f".lock-{KEY}", f".scratch-{KEY}"}
    assert scratch.is_dir()


def test_a_killed_runs_lease_is_stale(tmp_path):
    store = StageStore(tmp_path / "data")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; sys.path.insert(0, %r)\n"
                "from flows.plan import leases; from flows.plan.store import StageStore\n"
                "lease = leases.Lease(StageStore(%r), {'embed': %r}); print('held', flush=True); "
                "time.sleep(120)\n"
            )
            % (str(ROOT), str(store.root), KEY),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "held"
    with leases.gc_lock(store):
        assert [doc["keys"] for doc in leases.live(store)] == [[["embed", KEY]]]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with leases.gc_lock(store):
        assert leases.live(store) == []
    assert list((store.root / "_cache" / "leases").glob("*.json")) == []


@pytest.mark.e2e
def test_gc_every_second_during_a_run_breaks_nothing(tmp_path, capsys):
    """The review's reproduction: `zhpipe gc` over and over while a run with overrides (keys no
    pipeline of pipelines.yaml plans) builds. The run succeeds (train reads the embeddings gc used
    to delete under it); gc says what it kept; once the run has let its lease go, gc keeps nothing
    for it."""
    store = tmp_path / "store"
    env = {**os.environ, "ZHPIPE_WARM": "off", "ZHPIPE_DATA": str(store)}
    run = subprocess.Popen(
        zhpipe_argv(
            "run",
            "smoke",
            "--set",
            "embed.word2vec.epochs=3",
            "--set",
            "train.models=[tfidf_lr]",
            "--to",
            "train",
        ),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said = []
    try:
        while run.poll() is None:
            done = in_process(capsys, "gc", "--storage", str(store))
            assert done.returncode == 0, done.stderr
            said.append(done.stdout)
            time.sleep(0.5)
        out = run.stdout.read()
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out[-3000:]
    kept = [line for s in said for line in s.splitlines() if line.startswith("kept ")]
    # gc saw the run and left its work
    assert len(said) >= 2 and any("live run" in line for line in kept), said[-3:]
    with leases.gc_lock(StageStore(store)):
        # the run let its lease go: what it built is ordinary garbage now
        assert leases.live(StageStore(store)) == []
    after = in_process(capsys, "gc", "--storage", str(store))
    assert after.returncode == 0 and not any(
        line.startswith("kept ") for line in after.stdout.splitlines()
    ), after.stdout


def _judge_many(identity: str, tag: str, count: int, root: str) -> None:
    """What a judging run does to the checks record, `count` times (as flows.orchestrate.gate does):
    record a judgement, and hold p1 again unless it was accepted as it is."""
    project.activate(project.Project(Path(root)))
    for i in range(count):
        with held.changing(identity) as record:
            record["judged"][f"{tag}-{i}"] = {"unit": "clean", "verdicts": []}
            if not held.accepted(record, "p1", "d1"):
                record["held"]["p1"] = {"check": "labels", "digest": "d1", "line": "labels failed"}


def test_accept_beside_judging_runs_is_kept(tmp_path):
    """`zhpipe accept` while four processes judge nights on the same record: the acceptance and
    every judgement survive (the record was loaded, judged and saved with no lock, and the last
    writer won)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pipelines.yaml").write_text("pipelines: {}\n")
    identity = "p"
    before = project.current()
    project.activate(project.Project(root))
    try:
        with held.changing(identity) as record:
            record["held"]["p1"] = {"check": "labels", "digest": "d1", "line": "labels failed"}
        ctx = multiprocessing.get_context("fork")
        judges = [
            ctx.Process(target=_judge_many, args=(identity, f"run{n}", 60, str(root)))
            for n in range(4)
        ]
        for p in judges:
            p.start()
        time.sleep(0.05)
        assert held.accept(identity, ["p1"]) == ["p1"]
        for p in judges:
            p.join(60)
            assert p.exitcode == 0
        record = held.load(identity)
        assert record["accepted"] == {"p1": "d1"} and "p1" not in record["held"]
        assert len(record["judged"]) == 240
    finally:
        project.activate(before)


def test_a_copied_projects_server_stop_never_signals_the_original(tmp_path):
    """`cp -a` of a project copies its state files: `zhpipe server stop` in the copy names the
    original's process, which stays alive (records name their project's real path, and the process's
    own Prefect home is checked)."""
    from flows.plan import private
    from flows.runtime import procs

    original = tmp_path / "orig"
    home = original / ".prefect"
    home.mkdir(parents=True, mode=0o700)
    (original / "pipelines.yaml").write_text("pipelines: {}\n")
    marker = "prefect server start"
    env = {**os.environ, "PREFECT_HOME": str(home)}
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", marker],
        env=env,
        start_new_session=True,
    )
    try:
        saved = os.environ["PREFECT_HOME"]
        os.environ["PREFECT_HOME"] = str(home)
        try:
            private.write_state(
                home / "zhpipe-server.json",
                {**procs.identity(server.pid, marker), "url": "http://127.0.0.1:9/api"},
            )
            # the original's own record is its
            assert procs.is_ours(private.read_state(home / "zhpipe-server.json"))
        finally:
            os.environ["PREFECT_HOME"] = saved
        copy = tmp_path / "copy"
        shutil.copytree(original, copy, symlinks=True)
        clean = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PREFECT_HOME", "PREFECT_API_URL", "ZHPIPE_PROJECT")
        }
        done = subprocess.run(
            zhpipe_argv("server", "stop"),
            cwd=copy,
            env={**clean, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        time.sleep(0.5)
        assert server.poll() is None, done.stdout + done.stderr
    finally:
        server.kill()
        server.wait()


def test_ui_on_a_taken_port_fails_in_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = in_process(capsys, "ui", "--port", port)
    assert (
        done.returncode == 2
        and "already in use" in done.stderr
        and len(done.stderr.strip().splitlines()) == 1
    ), done


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )


def test_a_run_on_a_full_disk_stops_in_one_line(tmp_path):
    """The review's reproduction: a project on a 2 MB file system. One line naming the place and the
    space needed, a non-zero exit, and nothing written."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "2m"):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        (disk / "p").mkdir()
        shutil.copy(ROOT / "tests" / "fixtures" / "smoke.csv", disk / "p" / "smoke.csv")
        (disk / "p" / "pipelines.yaml").write_text(
            "pipelines:\n  p:\n    source: {path: smoke.csv, text_column: review, label_column: "
            "label}\n"
        )
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "PREFECT_HOME",
                "ZHPIPE_DATA",
                "ZHPIPE_PROJECT",
                "MLFLOW_TRACKING_URI",
                "PREFECT_API_URL",
            )
        }
        t0 = time.monotonic()
        done = subprocess.run(
            zhpipe_argv("run", "--to", "segment"),
            cwd=disk / "p",
            env={**env, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - t0
        assert done.returncode == 2, done.stderr[-2000:]
        lines = done.stderr.strip().splitlines()
        assert (
            len(lines) == 1
            and "MB free" in lines[0]
            and str(disk / "p") in lines[0]
            and "ZHPIPE_MIN_FREE_MB" in lines[0]
        ), lines
        assert sorted(p.name for p in (disk / "p").iterdir()) == ["pipelines.yaml", "smoke.csv"]
        assert took < 60
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_disk_full_errors_anywhere_in_a_chain_are_one_line():
    import errno
    import sqlite3

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as e:
            raise RuntimeError("Action failed") from e
    except RuntimeError as e:
        assert "the disk is full" in project.disk_full(e)
    assert "/x/y" in project.disk_full(OSError(errno.ENOSPC, "No space left on device", "/x/y"))
    assert project.disk_full(ValueError("nope")) is None


EVIL = "2026-12-02 <img src=x onerror=alert(4)>'\".csv"


def test_names_reach_html_and_markdown_escaped_and_shell_lines_quoted():
    import shlex

    import pandas as pd

    from flows.orchestrate import night
    from flows.orchestrate.gate import Judged
    from tasks.shared.reports import markdown_text

    frame = pd.DataFrame({"text": ["好的房间", "很差"], "label": ["1", "0"]})
    html = "".join(night.night_plots([Judged(EVIL, [], held=True, night=frame, reference=frame)]))
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(4)&gt;" in html
    md = markdown_text(EVIL + " [x](javascript:alert(1))")
    assert "<" not in md and ">" not in md and "](" not in md
    assert shlex.split(f"zhpipe accept p1 {shlex.quote(EVIL)}") == ["zhpipe", "accept", "p1", EVIL]


def test_a_webhooks_secret_path_is_masked():
    from tasks.util.urls import redact_webhook

    slack = "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX"
    assert redact_webhook(slack) == "https://hooks.slack.com/services/***"
    feishu = "https://open.feishu.cn/open-apis/bot/v2/hook/0123-abcd-secret"
    assert "secret" not in redact_webhook(feishu)
    assert "tok123" not in redact_webhook(
        "https://oapi.dingtalk.com/robot/send?access_token=tok123"
    )


def test_init_reads_only_the_head_of_a_wide_csv(tmp_path, capsys):
    """A CSV of a million columns: init answers at once from its first megabyte, in one line."""
    wide = tmp_path / "wide.csv"
    with open(wide, "w") as f:
        f.write(",".join(f"c{i}" for i in range(10**6)) + "\n")
        f.write(",".join("x" for _ in range(10**6)) + "\n")
    done = in_process(capsys, "init", tmp_path / "p", "--csv", wide)
    assert done.returncode == 2 and "header line is longer than 1 MB" in done.stderr, done
    ok = tmp_path / "ok.csv"
    ok.write_text("review,label\n" + "".join(f"房间{i},1\n" for i in range(10)), encoding="utf-8")
    done = in_process(
        capsys, "init", tmp_path / "q;touch PWN", "--csv", ok, "--text-column", "review"
    )
    assert (
        done.returncode == 0
        and f"next: cd {shlex_quote(str(tmp_path / 'q;touch PWN'))} && zhpipe run" in done.stdout
    ), done


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_a_lease_file_names_the_keys_as_json(tmp_path):
    store = StageStore(tmp_path / "data")
    with leases.held(store, {"train.textcnn": KEY}) as lease:
        lease.update({"embed": OTHER})
        doc = json.loads(lease.path.read_text())
    assert doc["keys"] == [["embed", OTHER], ["train.textcnn", KEY]] and doc["pid"] == os.getpid()


def test_a_lease_sent_to_another_process_holds_nothing_there(tmp_path):
    """A run's context (and its lease) is pickled to Dask workers and spawned trainers: the copy has
    no file descriptor and no heartbeat (a thread cannot be pickled), and letting it go leaves the
    run's lease live."""
    import pickle

    store = StageStore(tmp_path / "data")
    with leases.held(store, {"embed": KEY}) as lease:
        copy = pickle.loads(pickle.dumps(lease))
        assert copy._fd is None and copy.pairs == lease.pairs
        copy.update({"clean": OTHER})
        copy.release()
        with leases.gc_lock(store):
            assert [doc["keys"] for doc in leases.live(store)] == [[["embed", KEY]]]
