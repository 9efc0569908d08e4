"""No door left open (docs/background.md, "Threat model"): one test per finding of the audit of
035d4f2, each failing on that commit's behaviour, and a sweep of every listener a project's servers
open.

The attacks run as a second user (uid 65534, `nobody`) and need root to start one; elsewhere they
are skipped."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.cli import in_process
from tests.helpers.procs import zhpipe, zhpipe_argv
from tests.test_private import (
    OTHER_PYTHON,
    OTHER_UID,
    as_other_user,
    as_root,
    init_project,
    plant_link,
    project_env,
)

ROOT = Path(__file__).resolve().parents[1]

# what another user asks of every listener: each reads or writes a project's data (its runs, logs,
# settings, the registry's lock); Prefect's /health and the static pages of its UI hold none and are
# not asked
PROBES = (
    ("GET", "/api/admin/settings", None),
    ("POST", "/api/flow_runs/filter", {}),
    ("POST", "/api/logs/filter", {}),
    (
        "POST",
        "/api/v2/concurrency_limits/",
        {"name": "zhpipe-registry-p", "limit": 1, "active_slots": 1},
    ),
    ("GET", "/api/admin/version", None),
)

ASK = """import json, sys, urllib.request, urllib.error
out = []
for port in json.loads(sys.argv[1]):
    for method, path, body in json.loads(sys.argv[2]):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                out.append([port, path, r.status])
        except urllib.error.HTTPError as e:
            out.append([port, path, e.code])
        except OSError as e:
            out.append([port, path, str(e)])
print(json.dumps(out))
"""


def listening_ports(pid: int) -> list[int]:
    """The TCP ports that process `pid` and those below it listen on (their sockets, from /proc)."""
    from flows.plan.private import family, sockets_of

    inodes = sockets_of(family(pid))
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[9]) in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def asked_by_another_user(ports: list[int]) -> list[list]:
    """Each probe of `PROBES` sent to each port by another user, without credentials: [port, path,
    status]."""
    done = subprocess.run(
        [OTHER_PYTHON, "-c", ASK, json.dumps(ports), json.dumps(PROBES)],
        capture_output=True,
        text=True,
        preexec_fn=as_other_user,
        cwd="/",
        timeout=120,
        env={"PATH": os.environ["PATH"], "no_proxy": "*"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def squat_port(port: int) -> subprocess.Popen:
    """Another user's process listening on loopback `port` (answering nothing)."""
    proc = subprocess.Popen(
        [
            OTHER_PYTHON,
            "-c",
            "import socket, sys, time; s = socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('bound', flush=True); "
            "time.sleep(600)",
            str(port),
        ],
        preexec_fn=as_other_user,
        cwd="/",
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "bound"
    return proc


def server_env(project: Path, **extra) -> dict:
    """A zhpipe process's environment for `project`'s own background server (no session server, no
    warm process)."""
    env = project_env(ZHPIPE_SERVER="background", PREFECT_API_URL="", **extra)
    env.pop("PREFECT_API_AUTH_STRING", None)
    return env


TEMPORARY = """import os, sys, time
from flows.runtime import temporary
server = temporary.launch()
temporary.ready()
print(server.proc.pid, flush=True)
time.sleep(600)
"""


# --- H1, and the sweep: every server zhpipe starts asks for the project's login -------------------


@pytest.mark.e2e
@as_root
def test_every_server_a_project_starts_answers_another_user_with_401_only(
    tmp_path, seed_prefect_home
):
    """While a project uses each kind of server zhpipe starts (the background one, the temporary
    one, and the one it starts when another user squats the project's port), another user's calls
    without credentials to every port those processes listen on get 401 or 403. 035d4f2's temporary
    server answered them all (H1), and a squatted port sent runs to it."""
    from flows.runtime.server import project_port

    project = tmp_path / "p"
    assert init_project(project)
    home = seed_prefect_home(project / ".prefect")
    home.chmod(0o700)
    env = server_env(project)
    found: dict[str, list] = {}

    # the temporary server, as `ZHPIPE_SERVER=temporary` (or a failed background start) starts it
    # for a run
    temp = subprocess.Popen(
        [sys.executable, "-c", TEMPORARY],
        cwd=project,
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PREFECT_HOME": str(home)},
        start_new_session=True,
    )
    try:
        pid = int(temp.stdout.readline())
        found["temporary"] = asked_by_another_user(listening_ports(pid))
    finally:
        os.killpg(temp.pid, signal.SIGTERM)
        temp.wait(30)

    # the background server on a port another user took first: zhpipe draws another, and it logs in
    # too
    squatter = squat_port(project_port_of(home, project_port))
    try:
        started = zhpipe(env, "server", "start", cwd=project, timeout=300)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "is taken; using" in started.stdout, started.stdout
        state = json.loads((home / "zhpipe-server.json").read_text())
        found["fallback after a squat"] = asked_by_another_user(listening_ports(state["pid"]))
    finally:
        squatter.kill()
        squatter.wait(10)
        zhpipe(env, "server", "stop", cwd=project, timeout=120)

    # the background server on the project's own port
    started = zhpipe(env, "server", "start", cwd=project, timeout=300)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        state = json.loads((home / "zhpipe-server.json").read_text())
        found["background"] = asked_by_another_user(listening_ports(state["pid"]))
    finally:
        zhpipe(env, "server", "stop", cwd=project, timeout=120)

    for kind, answers in found.items():
        assert answers, f"{kind}: no listener found"
        assert all(status in (401, 403) for _, _, status in answers), (kind, answers)


def project_port_of(home: Path, project_port) -> int:
    """The port `project_port` draws for the Prefect home `home`."""
    before = os.environ.get("PREFECT_HOME")
    os.environ["PREFECT_HOME"] = str(home)
    try:
        return project_port()
    finally:
        os.environ["PREFECT_HOME"] = before


@pytest.mark.e2e
def test_a_first_run_killed_while_its_server_boots_leaves_one_that_status_sees_and_stop_stops(
    tmp_path, seed_prefect_home
):
    """M5: 035d4f2 recorded the background server only once it answered; a command killed before
    then left an orphan that `server status` called "not running", `server stop` could not find, and
    whose port sent every later run to a temporary server. Its record is now written as it
    starts."""
    from flows.plan.private import read_state

    project = tmp_path / "p"
    assert init_project(project)
    home = seed_prefect_home(project / ".prefect")
    home.chmod(0o700)
    env = server_env(project)
    starter = subprocess.Popen(
        zhpipe_argv("server", "start"),
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    record = home / "zhpipe-server.json"
    deadline = time.monotonic() + 120
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    state = read_state(record)
    assert state and state.get("starting"), state
    starter.kill()  # SIGKILL while the server boots: no exit hook runs
    starter.wait(10)
    try:
        status = zhpipe(env, "server", "status", cwd=project, timeout=120)
        assert status.returncode == 0 and (
            "starting at" in status.stdout or "running at" in status.stdout
        ), status
        stopped = zhpipe(env, "server", "stop", cwd=project, timeout=120)
        assert "stopped the Prefect server" in stopped.stdout, stopped
        deadline = time.monotonic() + 30
        while _alive(state["pid"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(state["pid"]) and not record.exists()
    finally:
        if _alive(state["pid"]):
            os.killpg(state["pid"], signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()


def test_a_registry_slot_someone_holds_is_waited_for_a_bounded_time_and_named(prefect_harness):
    """H1's hang: a concurrency limit `zhpipe-registry-<pipeline>` created with its slot held kept a
    run at "another run is deciding the champion; waiting" until it was killed. The wait is bounded,
    and its end names the limit."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from flows.pools.slots import global_slot
    from tasks.errors import ZhpipeError

    name = f"zhpipe-registry-held-{os.getpid()}"
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=name, limit=1, active_slots=1)
        )
    try:
        began = time.monotonic()
        with pytest.raises(ZhpipeError, match=f"concurrency limit {name} stayed held for 2 s"):
            with global_slot(name, "waiting", timeout=2):
                pytest.fail("the slot was held by another")
        assert time.monotonic() - began < 60
    finally:
        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name(name)


# --- H2: predict loads only through the trust check -----------------------------------------------

PLANTED = (
    "import pathlib; pathlib.Path({marker!r}).write_text('ran'); from importlib import "
    "import_module\n"
)


def test_a_models_uri_is_never_a_folder_of_the_working_directory(tmp_path, monkeypatch):
    """H2: with `./models:/zhpipe-p@champion/MLmodel` in the working directory, 035d4f2 loaded that
    folder without the trust check, and its child process ran a planted `json.py`. A `models:/` URI
    now always goes through the registry: here there is no such model, so one line, and nothing
    planted runs."""
    from flows.track.predict import load_model
    from tasks.errors import ZhpipeError

    marker = tmp_path / "planted-ran"
    planted = tmp_path / "cwd" / "models:" / "zhpipe-p@champion"
    planted.mkdir(parents=True)
    (planted / "MLmodel").write_text("flavors: {python_function: {loader_module: json}}\n")
    (planted / "json.py").write_text(PLANTED.format(marker=str(marker)))
    # "logged with other code": it would answer from a child
    (planted / "code" / "flows").mkdir(parents=True)
    (planted / "code" / "flows" / "api.py").write_text("# another version\n")
    (tmp_path / "cwd" / "json.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(ZhpipeError, match="cannot load model models:/zhpipe-p@champion"):
        load_model("models:/zhpipe-p@champion")
    assert not marker.exists()


def test_a_model_folder_others_can_write_is_not_loaded(tmp_path):
    """A folder given on purpose (`--model DIR`) is loaded only when no one else could have written
    it."""
    from flows.track.predict import load_model
    from tasks.errors import ZhpipeError

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "MLmodel").write_text("flavors: {}\n")
    folder.chmod(0o777)
    with pytest.raises(ZhpipeError, match="can be written by other users"):
        load_model(str(folder))


def test_a_logged_models_process_runs_isolated(tmp_path):
    """A model logged with other code answers from a child process: `python -I` in an empty folder
    of its own, so neither the model's folder, the working directory nor PYTHONPATH can put a module
    before the real ones."""
    from flows.track.predict import LoggedCodeModel
    from tasks.errors import ZhpipeError

    marker = tmp_path / "planted-ran"
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "MLmodel").write_text("flavors: {}\n")
    (folder / "json.py").write_text(PLANTED.format(marker=str(marker)))
    (tmp_path / "json.py").write_text(PLANTED.format(marker=str(marker)))
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tmp_path)
    try:
        with pytest.raises(ZhpipeError, match="could not be loaded|its logged code failed"):
            LoggedCodeModel(folder)
    finally:
        os.environ.pop("PYTHONPATH") if before is None else os.environ.__setitem__(
            "PYTHONPATH", before
        )
    assert not marker.exists()


# --- M1: the warm process serves its project and nothing else -------------------------------------


@pytest.mark.e2e
def test_the_warm_process_never_touches_the_folder_zhpipe_is_installed_in(
    tmp_path, seed_prefect_home
):
    """M1: 035d4f2's warm process was told the install folder as its project: it made it private (a
    clone became 700, a copied site-packages folder 755 -> 700) and opened its MLflow store. It is
    told its project now."""
    from flows.plan.private import read_state
    from flows.runtime import procs

    # a copy of zhpipe's packages, installed for every user (755)
    install = tmp_path / "site-packages"
    install.mkdir()
    for part in ("flows", "tasks"):
        subprocess.run(["cp", "-r", str(ROOT / part), str(install / part)], check=True)
    for folder in (install, *install.iterdir()):
        folder.chmod(0o755)
    project = tmp_path / "p"
    assert init_project(project)
    home = seed_prefect_home(project / ".prefect")
    env = {**project_env(PREFECT_HOME=str(home), PYTHONPATH=str(install)), "ZHPIPE_WARM": "on"}
    code = (
        "import os; from pathlib import Path; from flows.runtime import handover; "
        "handover.spawn(30, dict(os.environ), Path.cwd())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    deadline = time.monotonic() + 180
    states = []
    while time.monotonic() < deadline and not states:
        states = [
            s for s in map(read_state, home.glob("zhpipe-warm-*.json")) if s and s.get("socket")
        ]
        time.sleep(0.2)
    try:
        assert states, (
            (home / "zhpipe-warm.log").read_text()[-2000:]
            if (home / "zhpipe-warm.log").exists()
            else ""
        )
        assert Path(f"/proc/{states[0]['pid']}/cwd").resolve() == project.resolve()
        assert {f.name: oct(f.stat().st_mode & 0o777) for f in (install, *install.iterdir())} == {
            f.name: "0o755" for f in (install, *install.iterdir())
        }
        assert not (install / "mlruns").exists() and not (install / ".prefect").exists()
    finally:
        for state in states:
            procs.signal_ours(state, signal.SIGTERM)


# --- M2 and a low: every hop of a link, checked when it is read -----------------------------------


@as_root
def test_a_drop_file_swapped_for_another_users_link_behind_the_owners_link_is_not_read(
    tmp_path, shared_folder
):
    """M2: `init --nightly FOLDER --link` links data/raw/<folder>/x.csv to the drop folder's x.csv;
    another user then swaps that file for a link to the owner's private file. 035d4f2 checked only
    the owner's own link and read the secret; every hop is checked as the file is read now, and
    nothing of it is read."""
    from tasks.errors import DataError
    from tasks.source.readers import line_batches
    from tasks.source.schema import Source

    secret = tmp_path / "secret.csv"
    secret.write_text("review,label\nthe owner's secret,1\n", encoding="utf-8")
    secret.chmod(0o600)
    raw = tmp_path / "p" / "data" / "raw" / "drops"
    raw.mkdir(parents=True)
    # the owner's link, made by `init --link`
    (raw / "2026-12-04.csv").symlink_to(shared_folder / "2026-12-04.csv")
    plant_link(shared_folder / "2026-12-04.csv", secret)  # then swapped by another user
    parts = Source(path=f"{raw}/*.csv").partitions(tmp_path)
    with pytest.raises(DataError, match="a link made by another user"):
        list(line_batches(parts[0].path, "utf-8"))


@as_root
def test_init_csv_checks_who_made_a_link_before_following_it(tmp_path, shared_folder, capsys):
    """A low: `init --csv LINK` resolved the link before it asked who made it."""
    secret = tmp_path / "secret.csv"
    secret.write_text("text,label\nthe owner's secret,1\n", encoding="utf-8")
    plant_link(shared_folder / "corpus.csv", secret)
    done = in_process(capsys, "init", tmp_path / "p", "--csv", shared_folder / "corpus.csv")
    assert done.returncode == 2 and "a link made by another user" in done.stderr, done
    assert len(done.stderr.strip().splitlines()) == 1
    assert not any(b"secret" in p.read_bytes() for p in (tmp_path / "p").rglob("*") if p.is_file())


# --- M3: the screenshot proxy proves its peer by the full addresses -------------------------------


@as_root
def test_a_peer_is_proved_by_both_full_addresses_not_by_port():
    """M3: another user connects from 127.0.0.2 with the source port of the owner's own connection.
    035d4f2 matched /proc/net/tcp by ports only and took them for the owner."""
    from flows.plan.private import peer_uid

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as mine:
            port = mine.getsockname()[1]
            theirs = subprocess.Popen(
                [
                    OTHER_PYTHON,
                    "-c",
                    "import socket, sys, time; c = socket.socket(); "
                    "c.bind(('127.0.0.2', int(sys.argv[1]))); c.connect(('127.0.0.1', "
                    "int(sys.argv[2]))); "
                    "print('connected', flush=True); time.sleep(30)",
                    str(port),
                    str(server.getsockname()[1]),
                ],
                preexec_fn=as_other_user,
                cwd="/",
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert theirs.stdout.readline().strip() == "connected"
                first, first_addr = server.accept()
                second, second_addr = server.accept()
                addrs = {first_addr[0]: first_addr, second_addr[0]: second_addr}
                assert peer_uid(addrs["127.0.0.1"], server.getsockname()) == os.getuid()
                assert peer_uid(addrs["127.0.0.2"], server.getsockname()) == OTHER_UID
                # no such connection
                assert peer_uid(("127.0.0.3", port), server.getsockname()) is None
                first.close()
                second.close()
            finally:
                theirs.kill()
                theirs.wait(10)


# --- M4: a private temporary folder someone else holds is replaced, not demanded ------------------


@as_root
def test_another_users_jieba_folder_is_skipped_for_a_fresh_one(shared_folder, monkeypatch, caplog):
    """M4: another user who made `$TMPDIR/zhpipe-jieba-<uid>` first made every run of that uid end
    in a 317-line traceback telling them to remove it, which they cannot in a sticky /tmp. A fresh
    folder is used now, said once."""
    from tasks.util import segmenter

    shared = shared_folder
    shared.chmod(0o1777)  # as /tmp: sticky, so the owner cannot remove what the other user made
    taken = shared / f"zhpipe-jieba-{os.getuid()}"
    subprocess.run(
        [OTHER_PYTHON, "-c", f"import os; os.mkdir({str(taken)!r}, 0o777)"],
        preexec_fn=as_other_user,
        check=True,
        cwd="/",
    )
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    segmenter.jieba_cache_dir.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="zhpipe"):
            folder = Path(segmenter.jieba_cache_dir())
        assert folder != taken and folder.parent == shared and folder.stat().st_uid == os.getuid()
        assert folder.stat().st_mode & 0o077 == 0
        assert [r.getMessage() for r in caplog.records if "jieba's cache goes to" in r.getMessage()]
    finally:
        segmenter.jieba_cache_dir.cache_clear()


# --- the lows -------------------------------------------------------------------------------------


def test_a_corrupt_prefect_database_is_named_with_its_fix_and_doctor_fails_on_it(
    tmp_path, monkeypatch, capsys
):
    """035d4f2 said "exited with code 3" and `doctor` said all was fine."""
    from flows.runtime import server
    from tasks.errors import ZhpipeError

    home = tmp_path / ".prefect"
    home.mkdir()
    db = home / "prefect.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (x)")
        con.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 200)
    data = bytearray(db.read_bytes())
    # a page overwritten, as a disk that filled mid-write leaves it
    data[4096:8192] = b"\xff" * 4096
    db.write_bytes(bytes(data))
    monkeypatch.setenv("PREFECT_HOME", str(home))
    with pytest.raises(ZhpipeError, match=r"prefect.db is corrupt .*mv .*prefect.db.corrupt"):
        server.start()
    assert not (home / "zhpipe-server.json").exists()
    monkeypatch.delenv("PREFECT_API_URL")
    done = in_process(capsys, "doctor")
    assert done.returncode == 1
    assert [
        line
        for line in done.stdout.splitlines()
        if line.startswith("FAIL  prefect") and "is corrupt" in line
    ]


def test_control_characters_from_data_never_reach_the_terminal(tmp_path, capsys):
    """A corpus's labels or a pipeline's description holding ESC or CSI sequences: shown escaped,
    not obeyed."""
    from flows.cli.common import print_frame
    from tasks.errors import printable

    assert printable("好\x1b[2J\x9b31m\r!") == "好\\x1b[2J\\x9b31m\\x0d!"
    config = tmp_path / "pipelines.yaml"
    import re

    yaml = (ROOT / "pipelines.yaml").read_text(encoding="utf-8")
    config.write_text(
        re.sub(r"description: .*", r'description: "\\e[2J\\e]0;owned\\a"', yaml, count=1),
        encoding="utf-8",
    )
    done = in_process(capsys, "pipelines", "--config", config)
    assert done.returncode == 0 and "\x1b" not in done.stdout and "\\x1b[2J" in done.stdout, done
    import pandas as pd

    print_frame(pd.DataFrame({"text": ["a\x1b[31mred"], "pred_label": ["\x9b1m"]}), "predict")
    shown = capsys.readouterr().out
    assert "\x1b[31m" not in shown and "\x9b" not in shown and "\\x1b[31mred" in shown


def test_a_budget_overrun_never_plans_a_negative_number_of_epochs(caplog):
    """`--set train.budget=0.001s` logged "-14 more epochs fit"."""
    from tasks.models.racing import Race, judge_race

    race = Race(share=0.001, started=time.monotonic() - 5)
    plan = {"race": race, "epochs": 15, "steps": 10, "total": 150, "warmup": 0}
    cfg = type(
        "Loop", (), {"monitor": "val_accuracy", "mode": "max", "warmup_ratio": 0.0, "epochs": 15}
    )
    state = {"epoch": 1, "done": False, "history": [{"val_accuracy": 0.5}]}
    with caplog.at_level(logging.INFO, logger="zhpipe"):
        judge_race("textcnn", plan, state, cfg, 1.0, epoch_seconds=0.1)
    assert state["done"] and race.cut.startswith("stopped after epoch 1"), race.cut
    assert not [r for r in caplog.records if "more epoch" in r.getMessage()]


def test_a_full_disk_is_said_once_without_mlflows_tracebacks(capsys):
    """A disk that filled during a run: 035d4f2 printed 929 lines (33 tracebacks, each a write
    MLflow's store logged as it failed) before its one line. Those records are dropped; other errors
    of MLflow's keep their tracebacks."""
    import sqlite3 as sqlite

    from flows.cli import _FullDiskSaidOnce

    logger = logging.getLogger("mlflow.store.db.utils.test")
    logger.addFilter(_FullDiskSaidOnce())
    try:
        for error in (
            sqlite.OperationalError("database or disk is full"),
            OSError(28, "No space left on device"),
        ):
            try:
                raise error
            except (sqlite.OperationalError, OSError):
                logger.exception("SQLAlchemy database error. The following exception is caught.")
        try:
            raise sqlite.OperationalError("no such table: runs")
        except sqlite.OperationalError:
            logger.exception("another error")
    finally:
        logger.filters.clear()
    shown = capsys.readouterr().err
    assert (
        "disk is full" not in shown
        and "No space left" not in shown
        and "no such table: runs" in shown
    )


def test_gc_finds_and_removes_a_half_logged_model(tmp_path, monkeypatch, capsys):
    """A model whose logging a full disk cut short (status PENDING, its files half written):
    035d4f2's gc did not see its 8.4 MB. It is listed, then removed with its record; a finished
    model stays."""
    import mlflow
    from mlflow import MlflowClient

    from flows.track.runs import half_logged_models, remove_half_logged

    store = tmp_path / "mlruns" / "mlflow.db"
    store.parent.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    mlflow.set_tracking_uri(f"sqlite:///{store}")
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.create_experiment(
        "e", artifact_location=str(tmp_path / "mlruns" / "artifacts")
    )
    half = client.create_logged_model(experiment)
    done = client.create_logged_model(experiment)
    client.finalize_logged_model(done.model_id, "READY")
    folder = tmp_path / "mlruns" / "artifacts" / "models"
    for model in (half, done):
        (folder / model.model_id / "artifacts").mkdir(parents=True, exist_ok=True)
        (folder / model.model_id / "artifacts" / "model.bin").write_bytes(b"x" * 100_000)
    found = half_logged_models(time.time() + 1)
    assert [item["id"] for item in found] == [half.model_id], found
    assert found[0]["mb"] == pytest.approx(0.1) and "never finished" in found[0]["why"]
    remove_half_logged(found[0])
    assert not (folder / half.model_id).exists() and (folder / done.model_id).exists()
    assert half_logged_models(time.time() + 1) == []
