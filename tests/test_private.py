"""A project is private by construction (docs/background.md, "Threat model"): what another local
user can touch — a TCP port, a folder's default modes, a link in a shared folder, a tag in the
registry — is never trusted. One test per finding of the audit of 9e86781; each fails on that
commit's behaviour.

The attacks run as a second user (uid 65534, `nobody`), so they need root to start; elsewhere they
are skipped."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.cli import in_process
from tests.helpers.procs import zhpipe, zhpipe_argv

ROOT = Path(__file__).resolve().parents[1]
OTHER_UID = 65534
OTHER_PYTHON = next(
    (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None
)
as_root = pytest.mark.skipif(
    os.geteuid() != 0 or OTHER_PYTHON is None,
    reason="starting a process as another user needs root and a system Python",
)


def as_other_user():
    os.setgroups([])
    os.setgid(OTHER_UID)
    os.setuid(OTHER_UID)


def open_to_others(root: Path) -> list[str]:
    """Every file or folder under `root` (itself included, links not followed) that grants anything
    to others."""
    found = []
    for folder, dirs, files in os.walk(root):
        for path in (folder, *(os.path.join(folder, n) for n in (*dirs, *files))):
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                found.append(f"{oct(st.st_mode & 0o777)} {os.path.relpath(path, root)}")
    return sorted(set(found))


def project_env(**extra) -> dict:
    """A zhpipe process's environment for a project of its own: the session's Prefect server, no
    warm process."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_HOME"))
    }
    # an empty value unsets it (a project's own Prefect home, no session server's address)
    return {
        k: v
        for k, v in {**env, "ZHPIPE_WARM": "off", "PYTHONPATH": str(ROOT), **extra}.items()
        if v != ""
    }


# --- 2. a project is a private room, whatever the umask -------------------------------------------


@pytest.mark.e2e
def test_a_nightly_project_under_loose_umasks_is_readable_by_no_one_else(prefect_harness, tmp_path):
    """Nights under umask 000 and 022: pipelines.yaml, the copies of the corpus, data/, mlruns/ and
    .prefect/ are the owner's only (9e86781: data/ 755/644 under 022, pipelines.yaml 666 and every
    file world-writable under 000)."""
    rows = pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str)
    drops = tmp_path / "drops"
    drops.mkdir()
    rows.iloc[:150].to_csv(drops / "2026-12-01.csv", index=False)
    env = project_env()
    project = tmp_path / "night"
    init = zhpipe(
        env, "init", project, "--nightly", drops, "--text-column", "review", umask=0, cwd=tmp_path
    )
    assert init.returncode == 0, init.stderr
    sets = ["--set", "train.models=[tfidf_lr]"]
    first = zhpipe(env, "run", *sets, umask=0, cwd=project)
    assert first.returncode == 0, first.stderr[-3000:]
    rows.iloc[150:].to_csv(project / "data" / "raw" / "drops" / "2026-12-02.csv", index=False)
    (project / "data" / "raw" / "drops" / "2026-12-02.csv").chmod(0o644)  # as the exporter left it
    second = zhpipe(env, "run", *sets, umask=0o022, cwd=project)
    assert second.returncode == 0, second.stderr[-3000:]
    assert {"mlruns", ".prefect", "data", "pipelines.yaml"} <= set(os.listdir(project))
    loose = open_to_others(project)
    assert loose == [], f"{len(loose)} open to others: " + ", ".join(loose[:40])


def test_an_older_project_is_tightened_once_and_says_so(tmp_path, capsys):
    """A project made under a loose umask (or by an older zhpipe) is closed by its next command,
    which says so once; `init --csv` of a 0600 corpus no longer writes a 0644 copy."""
    corpus = tmp_path / "mine.csv"
    corpus.write_text("text,label\n房间很干净,1\n太差了,0\n", encoding="utf-8")
    corpus.chmod(0o600)
    done = in_process(capsys, "init", tmp_path / "p", "--csv", corpus)
    assert done.returncode == 0, done.stderr
    project = tmp_path / "p"
    assert open_to_others(project) == []
    for path in (
        project,
        project / "data",
        project / "pipelines.yaml",
        project / "data" / "raw" / "mine.csv",
    ):
        path.chmod(0o777 if path.is_dir() else 0o666)
    (project / "data" / "_cache").mkdir(mode=0o777)
    (project / "data" / "_cache" / "gc.lock").write_text("")  # a lock another user could have held
    (project / "data" / "_cache" / "gc.lock").chmod(0o666)
    env = project_env()
    first = zhpipe(env, "stages", umask=0, cwd=project)
    assert first.returncode == 0 and "were open to other users" in first.stderr, first.stderr
    assert open_to_others(project) == []
    again = zhpipe(env, "stages", umask=0, cwd=project)
    assert again.returncode == 0 and "open to other users" not in again.stderr


# --- 1. credentials go only to a listener proved ours ---------------------------------------------

SQUATTER = textwrap.dedent("""
    import http.server, os, socket, sys, time
    # the marker is not in its own command line
    marker, port, report = os.environ["MARKER"], int(sys.argv[1]), sys.argv[2]
    open(report, "a").write("watching\\n")
    deadline = time.monotonic() + 240
    # the server's command line, as a 60-line script watching /proc finds it
    while time.monotonic() < deadline:
        found = False
        for pid in os.listdir("/proc"):
            try:
                line = open(f"/proc/{pid}/cmdline", "rb").read() if pid.isdigit() else b""
                if marker in line.replace(b"\\0", b" ").decode():
                    found = True
                    break
            except OSError:
                pass
        if found:
            break
        time.sleep(0.005)
    class Grab(http.server.BaseHTTPRequestHandler):
        def _any(self):
            auth = self.headers.get('Authorization')
            open(report, "a").write(f"{self.command} {self.path} {auth}\\n")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")
        do_GET = do_POST = do_HEAD = _any
        def log_message(self, *a): pass
    srv = http.server.HTTPServer(("127.0.0.1", port), Grab)
    open(report, "a").write("bound\\n")
    srv.serve_forever()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def squat(shared: Path, marker: str, port: int) -> tuple[subprocess.Popen, Path]:
    report = shared / f"squatter-{port}.log"
    proc = subprocess.Popen(
        [OTHER_PYTHON, "-c", SQUATTER, str(port), str(report)],
        preexec_fn=as_other_user,
        cwd="/",
        env={"PATH": os.environ["PATH"], "MARKER": marker},
    )
    deadline = time.monotonic() + 30
    while (
        not (report.exists() and "watching" in report.read_text()) and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return proc, report


@pytest.mark.e2e
@as_root
# a first `run` starts the server itself
@pytest.mark.parametrize("command", ["server start", "run", "ui"])
def test_a_port_squatter_gets_no_credentials(tmp_path, shared_folder, seed_prefect_home, command):
    """Another user binds the port between zhpipe's check that it is free and its server's start
    (watching /proc for the server's command line). 9e86781 sent it `zhpipe:<password>` and reported
    the server as running; now zhpipe asks who holds the port's socket before it sends credentials,
    stops its server and says who holds it."""
    project = tmp_path / "p"
    assert init_project(project)
    home = seed_prefect_home(project / ".prefect")
    home.chmod(0o700)
    port = free_port()
    env = project_env(ZHPIPE_SERVER_PORT=str(port), ZHPIPE_SERVER="background", PREFECT_API_URL="")
    env.pop("PREFECT_API_AUTH_STRING", None)
    # what only the server's command line holds (MLflow's for `zhpipe ui`, Prefect's otherwise)
    marker = (
        "--app-name zhpipe" if command == "ui" else f"server start --host 127.0.0.1 --port {port}"
    )
    squatter, report = squat(shared_folder, marker, port)
    try:
        args = {
            "server start": ["server", "start"],
            "run": ["run", "--to", "download"],
            "ui": ["ui", "--port", port],
        }[command]
        done = zhpipe(env, *args, timeout=300, cwd=project)
        printed = done.stdout + done.stderr
        assert done.returncode != 0, printed[-3000:]
        assert f"port {port} on 127.0.0.1 is held by another user (uid {OTHER_UID})" in printed, (
            printed[-3000:]
        )
        # nothing reported as served
        assert "log in as" not in printed and "running at" not in printed
        got = report.read_text()
        assert "bound" in got, got  # the squatter did take the port
        auth = json.loads((home / "zhpipe-server-auth").read_text())["auth_string"]
        assert "Basic" not in got and auth.split(":")[1] not in got, got  # it got no credentials
        assert not (home / "zhpipe-server.json").exists()  # nothing recorded as running
    finally:
        squatter.kill()
        squatter.wait(10)
        subprocess.run(
            zhpipe_argv("server", "stop"),
            cwd=project,
            env={k: v for k, v in env.items() if v},
            capture_output=True,
            timeout=120,
        )


def init_project(project: Path) -> bool:
    """A starter project at `project` (`zhpipe init`, as a user would)."""
    done = subprocess.run(
        zhpipe_argv("init", str(project)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={k: v for k, v in project_env().items() if v},
    )
    return done.returncode == 0


# --- 3, 4. no link followed out of where it was pointed -------------------------------------------


def plant_link(link: Path, target: Path) -> None:
    subprocess.run(
        [OTHER_PYTHON, "-c", f"import os; os.symlink({str(target)!r}, {str(link)!r})"],
        preexec_fn=as_other_user,
        check=True,
        cwd="/",
    )


@as_root
def test_a_link_another_user_planted_in_a_drop_folder_is_not_read(tmp_path, shared_folder, capsys):
    """`2026-12-04.csv -> /root/secret.csv` in a shared drop folder: 9e86781 read the owner's secret
    into data/ (0644), and `init --nightly` copied it into the project. Both refuse the link in one
    line now, reading nothing."""
    from tasks.errors import DataError
    from tasks.source.schema import Source

    secret = tmp_path / "secret.csv"
    secret.write_text("review,label\nthe owner's secret,1\n", encoding="utf-8")
    secret.chmod(0o600)
    pd.DataFrame({"review": ["房间很干净", "太差了"], "label": ["1", "0"]}).to_csv(
        shared_folder / "2026-12-01.csv", index=False
    )
    plant_link(shared_folder / "2026-12-04.csv", secret)
    with pytest.raises(DataError, match="2026-12-04.csv is a link made by another user"):
        Source(path=f"{shared_folder}/*.csv").partitions(tmp_path)
    done = in_process(
        capsys, "init", tmp_path / "p", "--nightly", shared_folder, "--text-column", "review"
    )
    assert done.returncode == 2 and "a link made by another user" in done.stderr, done
    assert len(done.stderr.strip().splitlines()) == 1
    copied = [p for p in (tmp_path / "p").rglob("*") if p.is_file() and b"secret" in p.read_bytes()]
    assert copied == []


@as_root
def test_a_corpus_file_that_is_another_users_link_is_not_opened(tmp_path, shared_folder):
    """The reader itself opens no link made by another user (the file may be swapped after it was
    listed)."""
    from tasks.errors import DataError
    from tasks.source.readers import line_batches

    secret = tmp_path / "secret.txt"
    secret.write_text("secret\n", encoding="utf-8")
    plant_link(shared_folder / "corpus.csv", secret)
    with pytest.raises(DataError, match="not followed: a link made by another user"):
        list(line_batches(shared_folder / "corpus.csv", "utf-8"))


@as_root
def test_init_into_another_users_link_is_refused(tmp_path, shared_folder, capsys):
    """`zhpipe init DIR` where DIR is another user's link to their 0777 folder: 9e86781 built the
    project there, and they rewrote its source. Refused in one line now, nothing written."""
    theirs = shared_folder / "theirs"
    subprocess.run(
        [
            OTHER_PYTHON,
            "-c",
            f"import os; os.mkdir({str(theirs)!r}, 0o777); os.chmod({str(theirs)!r}, 0o777)",
        ],
        preexec_fn=as_other_user,
        check=True,
        cwd="/",
    )
    plant_link(shared_folder / "project", theirs)
    done = in_process(capsys, "init", shared_folder / "project")
    assert (
        done.returncode == 2
        and "a link made by another user" in done.stderr
        and "not followed" in done.stderr
    ), done
    assert os.listdir(theirs) == []


# --- 5. temporary files at names no one can guess -------------------------------------------------


def test_an_output_is_written_through_a_temporary_name_no_one_could_plant_a_link_at(tmp_path):
    """`predict --output OUT`: 9e86781 wrote `.OUT.<pid>.tmp`, and a link planted there made the
    owner overwrite a file of the planter's choice. The temporary file is now made with O_EXCL
    beside the output (mkstemp)."""
    from flows.track.predict import write_table

    victim = tmp_path / "victim.txt"
    victim.write_text("the owner's file\n")
    out = tmp_path / "out.csv"
    # the name 9e86781 would have used
    (tmp_path / f".{out.name}.{os.getpid()}.tmp").symlink_to(victim)
    write_table(pd.DataFrame({"text": ["好"], "pred_label": ["1"]}), out)
    assert victim.read_text() == "the owner's file\n"
    assert (
        pd.read_csv(out)["pred_label"].tolist() == [1]
        and stat.S_IMODE(out.stat().st_mode) & 0o077 == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".out.csv.%d.tmp" % os.getpid(), "out.csv", "victim.txt"]
    )


# --- 6. a champion trusted by what its owner wrote ------------------------------------------------


def test_a_vouched_model_whose_files_change_is_refused(tmp_path, capsys):
    """A model a zhpipe run logged and vouched for (its digest in the stage store) loads; once a
    file of it changes (a model folder copied over a zhpipe run's, say), it is refused in one line
    and its code never runs."""
    import mlflow

    from flows.track import trust
    from flows.track.tracker import client, tracking_uri
    from tests.flows.track.test_registry_trust import CODE

    mlflow.set_tracking_uri(tracking_uri())
    marker = tmp_path / "ran"
    code = tmp_path / "model.py"
    code.write_text(CODE.format(marker=str(marker)))
    experiment = client().create_experiment("zhpipe-vouched", artifact_location=_artifact_root())
    with mlflow.start_run(experiment_id=experiment, tags={"zhpipe.pipeline": "vouched"}) as run:
        info = mlflow.pyfunc.log_model(name="model", python_model=str(code))
    trust.vouch(info.model_uri, run.info.run_id)  # what a zhpipe run does when it logs a model
    version = mlflow.register_model(info.model_uri, "zhpipe-vouched").version
    marker.unlink(missing_ok=True)
    capsys.readouterr()  # what MLflow printed while registering
    pinned, files = trust.verified(f"models:/zhpipe-vouched/{version}", tmp_path / "genuine")
    # the genuine one passes
    assert pinned == f"models:/zhpipe-vouched/{version}" and (files / "MLmodel").is_file()
    logged = Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=info.model_uri, dst_path=str(tmp_path / "look")
        )
    )
    stored = Path(
        client().get_logged_model(info.model_id).artifact_location.removeprefix("file://")
    )
    [python_file] = [p.relative_to(logged) for p in logged.rglob("*.py")]
    (stored / python_file).write_text((stored / python_file).read_text() + "\nprint('planted')\n")
    refused = in_process(
        capsys, "predict", "--model", f"models:/zhpipe-vouched/{version}", "房间很干净"
    )
    assert (
        refused.returncode == 2 and "its files differ from those its run logged" in refused.stderr
    ), refused
    assert len(refused.stderr.strip().splitlines()) == 1 and not marker.exists()


def _artifact_root() -> str:
    from flows.plan import project

    return project.current().artifact_root()


# --- 7. a copied project is a project of its own --------------------------------------------------

COPY_RUN = textwrap.dedent("""
    import sys
    from pathlib import Path
    from flows.plan import project
    project.activate(project.find(sys.argv[1]))
    from flows.track.tracker import Tracker
    note = Path(sys.argv[1]) / "note.txt"
    note.write_text(sys.argv[2])
    run = Tracker.start("zhpipe-copied", sys.argv[2])
    run.artifact(note)
    run.finish()
    print(run.run_id)
""")


def test_a_copied_project_never_writes_into_its_original(tmp_path):
    """After `cp -a p1 p2`, a run in p2 wrote its artifacts into p1/mlruns/artifacts (absolute
    locations), and p2's champion check refused its own versions. p2 now re-roots its store, says
    so, and writes only under itself."""
    env = {k: v for k, v in project_env().items() if v}
    p1 = tmp_path / "p1"
    assert subprocess.run(zhpipe_argv("init", str(p1)), env=env, cwd=ROOT).returncode == 0
    made = subprocess.run(
        [sys.executable, "-c", COPY_RUN, str(p1), "first"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    subprocess.run(["cp", "-a", str(p1), str(tmp_path / "p2")], check=True)
    before = sorted(str(p.relative_to(p1)) for p in (p1 / "mlruns").rglob("*"))
    copy = subprocess.run(
        [sys.executable, "-c", COPY_RUN, str(tmp_path / "p2"), "second"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert copy.returncode == 0, copy.stderr[-2000:]
    assert f"copied or moved from {p1}" in copy.stderr
    # the original untouched
    assert sorted(str(p.relative_to(p1)) for p in (p1 / "mlruns").rglob("*")) == before
    run_id = copy.stdout.split()[-1]
    assert (
        tmp_path / "p2" / "mlruns" / "artifacts" / run_id / "artifacts" / "note.txt"
    ).read_text() == "second"
    again = subprocess.run(
        [sys.executable, "-c", COPY_RUN, str(tmp_path / "p2"), "third"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0 and "copied or moved" not in again.stderr  # said once


# --- 9. secrets never in output -------------------------------------------------------------------


def test_a_storage_url_with_credentials_is_refused_without_showing_them(capsys, monkeypatch):
    """`s3://KEY:SECRET@host/bucket` was printed in a 163-line traceback, kept in Prefect's database
    and printed by `doctor --storage`: refused now in one line, the secret masked, before anything
    is stored."""
    for args in (
        [
            "run",
            "smoke",
            "--to",
            "download",
            "--storage",
            "s3://AKIAEXAMPLE:TopSecret42@127.0.0.1:9/b",
        ],
        ["doctor", "--storage", "s3://AKIAEXAMPLE:TopSecret42@127.0.0.1:9/b"],
    ):
        done = in_process(capsys, *args)
        printed = done.stdout + done.stderr
        assert (
            done.returncode == 2
            and "must not hold credentials" in printed
            and "ZHPIPE_STORAGE_OPTIONS" in printed
        )
        assert (
            "TopSecret42" not in printed
            and "AKIAEXAMPLE" not in printed
            and len(printed.strip().splitlines()) == 1
        )
    monkeypatch.setenv("ZHPIPE_STORAGE", "ftp://u:TopSecret42@127.0.0.1:9/store")
    done = in_process(capsys, "status", "smoke")
    assert done.returncode == 2 and "TopSecret42" not in done.stdout + done.stderr


# --- 12. every fault one line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, why",
    [
        ("pipelines:\n  x: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deep"),
        (
            "pipelines:\n  x: {description: '" + "描" * 400_000 + "'}\n",
            "a config file is at most 1024 kB",
        ),
    ],
)
def test_a_hostile_config_is_one_line(tmp_path, capsys, body, why):
    (tmp_path / "pipelines.yaml").write_text(body, encoding="utf-8")
    started = time.monotonic()
    done = in_process(capsys, "--project", tmp_path, "pipelines")
    assert (
        done.returncode == 2 and why in done.stderr and len(done.stderr.strip().splitlines()) == 1
    ), done.stderr[:500]
    assert len(done.stderr) < 400 and time.monotonic() - started < 30


def test_a_config_not_in_utf8_names_itself(tmp_path, capsys):
    (tmp_path / "pipelines.yaml").write_bytes(
        "pipelines:\n  x: {description: '好'}\n".encode("gb18030")
    )
    done = in_process(capsys, "--project", tmp_path, "pipelines")
    assert (
        done.returncode == 2 and f"{tmp_path / 'pipelines.yaml'}: not UTF-8 text" in done.stderr
    ), done


def test_an_undetectable_encoding_names_its_file(tmp_path):
    from tasks.errors import DataError
    from tasks.source.readers import detect_encoding

    with pytest.raises(DataError, match=r"corpus\.csv: cannot detect the text encoding"):
        detect_encoding(
            bytes(range(128, 256)) * 50 + b"\x00\xff\xfe" * 100, tmp_path / "corpus.csv"
        )


def test_a_partition_name_with_a_line_break_is_refused(tmp_path):
    """A file name with a newline forged log lines (every line a partition's name is in): refused in
    one line."""
    from tasks.errors import DataError
    from tasks.source.schema import Source

    (tmp_path / "drop").mkdir()
    (tmp_path / "drop" / "2026-12-01.csv").write_text("text,label\n好,1\n")
    (tmp_path / "drop" / "2026-12-02\nINFO all checks passed\n.csv").write_text(
        "text,label\n好,1\n"
    )
    with pytest.raises(DataError, match="holds a line break or control character"):
        Source(path="drop/*.csv").partitions(tmp_path)


@as_root
def test_the_peer_of_a_loopback_connection_is_named_by_its_uid():
    """What the screenshot proxy (docs/screenshots.py) asks before it adds its owner's login to a
    request: the uid on the other end. Another user's connection is named as theirs, this process's
    as ours."""
    from flows.plan.private import peer_uid

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        connect = (
            f"import socket, time; c = socket.create_connection(('127.0.0.1', {port})); "
            "print(c.getsockname()[1], flush=True); time.sleep(30)"
        )
        other = subprocess.Popen(
            [OTHER_PYTHON, "-c", connect],
            stdout=subprocess.PIPE,
            text=True,
            user=OTHER_UID,
            cwd="/",
        )
        try:
            theirs = int(other.stdout.readline())
            with socket.create_connection(("127.0.0.1", port)) as mine:
                assert peer_uid(("127.0.0.1", theirs), ("127.0.0.1", port)) == OTHER_UID
                assert peer_uid(mine.getsockname(), ("127.0.0.1", port)) == os.getuid()
        finally:
            other.kill()
            other.wait(10)
