"""What zhpipe leaves running, under attack by another local user and after a crash: the warm
process's socket and the project's Prefect server reach no one else, a pid in a leftover state file
is never signalled, and a command handed to the warm process runs with the limits, umask, priority
and time zone of the shell that typed it.

The attacks run as a second user (uid 65534, `nobody`), so they need root to start; elsewhere they
are skipped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from flows.plan import private
from flows.runtime import handover, procs
from tests.helpers.procs import zhpipe, zhpipe_argv

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e  # real zhpipe processes and servers: `make test-quick` leaves them out
OTHER_UID = 65534
# the other user's interpreter: a system one (the project's may lie in a folder only its owner can
# enter)
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


@pytest.fixture
def shared_tmp():
    """A shared temporary folder as /tmp is (mode 1777), where both users can create entries."""
    folder = Path(tempfile.mkdtemp(prefix="zhpipe-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)


def project_env(home: Path, data: Path, tmp: Path) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", "ZHPIPE_WARM", "XDG_RUNTIME_DIR")
    }
    env.update(
        {
            "PREFECT_HOME": str(home),
            "ZHPIPE_DATA": str(data),
            "TMPDIR": str(tmp),
            "MLFLOW_TRACKING_URI": f"sqlite:///{data / 'mlflow.db'}",
            "MLFLOW_LOGGING_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
    )
    home.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    return env


def start_warm(env: dict) -> tuple[subprocess.Popen, Path]:
    """A warm process for `env`, as `zhpipe run` leaves one; (process, its state file) once it
    listens."""
    home = Path(env["PREFECT_HOME"])
    mine = handover.fingerprint(env)
    log = open(home / "zhpipe-warm.log", "a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli.warm", "--idle", "120", "--fingerprint", mine],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    state = home / f"zhpipe-warm-{mine[:16]}.json"
    deadline = time.monotonic() + 120

    def listening() -> bool:  # its state names a socket once it listens ("starting" before)
        return "socket" in (private.read_state(state) or {})

    while not listening() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert listening(), (home / "zhpipe-warm.log").read_text()
    return proc, state


ATTACKER = textwrap.dedent("""
    import json, os, socket, struct, sys, time
    path, report = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.dirname(path), mode=0o777, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o777)
    s = socket.socket(socket.AF_UNIX); s.bind(path); os.chmod(path, 0o777); s.listen(4)
    open(report, "a").write("listening\\n")
    s.settimeout(120)
    while True:
        try:
            c, _ = s.accept()
        except OSError:
            break
        got = c.recv(1 << 20)
        open(report, "a").write("GOT " + got.decode(errors="replace") + "\\n")
        for msg in ({"pid": os.getpid()}, {"rc": 0}):
            blob = json.dumps(msg).encode(); c.sendall(struct.pack("!I", len(blob)) + blob)
""")


@as_root
def test_another_user_on_a_leftover_socket_path_gets_nothing(tmp_path, shared_tmp):
    """Attack 1: the warm process dies (kill -9), a temp cleaner removes its socket, and another
    user listens where the leftover state file points. The owner's next command, with secrets in its
    environment, runs for real."""
    # too long for a socket beside it: the shared temporary folder is used
    long_home = tmp_path / ("p" * 90) / ".prefect"
    env = project_env(long_home, tmp_path / "store", shared_tmp)
    proc, state_path = start_warm(env)
    state = json.loads(state_path.read_text())
    sock = Path(state["socket"])
    assert sock.parent == shared_tmp / "zhpipe-0" and sock.parent.stat().st_mode & 0o777 == 0o700
    assert (
        state_path.stat().st_mode & 0o077 == 0
        and (long_home / "zhpipe-warm.log").stat().st_mode & 0o077 == 0
    )
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    # what a reboot or a temp cleaner does
    subprocess.run(["rm", "-rf", str(sock.parent)], check=True)
    report = shared_tmp / "attacker.log"
    attacker = subprocess.Popen(
        [OTHER_PYTHON, "-c", ATTACKER, str(sock), str(report)],
        preexec_fn=as_other_user,
        cwd="/",
        env={"PATH": os.environ["PATH"]},
    )
    try:
        deadline = time.monotonic() + 30
        while (
            not (report.exists() and "listening" in report.read_text())
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert "listening" in report.read_text()
        secrets = {"AWS_SECRET_ACCESS_KEY": "aws-s3cr3t-value", "HF_TOKEN": "hf_s3cr3t_token"}
        owner = zhpipe({**env, **secrets}, "status", "smoke")
        assert owner.returncode == 0, owner.stderr[-2000:]
        assert "zhpipe status smoke" in owner.stdout and "missing" in owner.stdout  # it ran, here
        assert report.read_text() == "listening\n"  # not one byte reached the other user
        assert not state_path.exists()  # the leftover is gone
        # and no warm process is started in a folder another user made
        old = dict(os.environ)
        os.environ.update(env)
        tempfile.tempdir = None  # read TMPDIR again
        try:
            with pytest.raises(private.NotPrivate, match="not a folder of this user's"):
                handover.socket_dir()
        finally:
            os.environ.clear()
            os.environ.update(old)
            tempfile.tempdir = None
    finally:
        attacker.kill()
        attacker.wait(10)


@as_root
def test_the_server_answers_only_its_owner_and_a_port_served_by_another_user_gets_nothing(
    tmp_path, shared_tmp, seed_prefect_home, seed_mlflow
):
    """Attack 5: a leftover zhpipe-server.json names a port that another user now serves (and even a
    live process of the owner's with the recorded start time and command line): the owner's run
    sends it nothing."""
    report = shared_tmp / "requests.log"
    attacker = subprocess.Popen(
        [
            OTHER_PYTHON,
            "-c",
            textwrap.dedent("""
        import http.server, sys
        report = sys.argv[1]
        class H(http.server.BaseHTTPRequestHandler):
            def _any(self):
                auth = self.headers.get('Authorization')
                open(report, "a").write(f"{self.command} {self.path} {auth}\\n")
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")
            do_GET = do_POST = do_PATCH = do_PUT = _any
            def log_message(self, *a): pass
        srv = http.server.HTTPServer(("127.0.0.1", 0), H)
        open(report + ".port", "w").write(str(srv.server_address[1]))
        srv.serve_forever()
    """),
            str(report),
        ],
        preexec_fn=as_other_user,
        cwd="/",
        env={"PATH": os.environ["PATH"]},
    )
    decoy = None
    try:
        deadline = time.monotonic() + 30
        while not Path(f"{report}.port").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        port = int(Path(f"{report}.port").read_text())
        env = project_env(seed_prefect_home(tmp_path / "prefect"), tmp_path / "store", shared_tmp)
        # the run's own server: this test is about the one the state file names
        env["ZHPIPE_SERVER"] = "temporary"
        env["MLFLOW_TRACKING_URI"] = seed_mlflow(tmp_path / "store" / "mlflow.db")
        marker = f"server start --host 127.0.0.1 --port {port}"
        decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
        time.sleep(0.2)
        private.write_state(
            tmp_path / "prefect" / "zhpipe-server.json",
            {
                **procs.identity(decoy.pid, marker),
                "url": f"http://127.0.0.1:{port}/api",
                "log": "x",
            },
        )
        status = zhpipe(env, "server", "status")
        assert "not running" in status.stdout, status.stdout + status.stderr
        run = zhpipe(env, "run", "smoke", "--to", "download")
        assert run.returncode == 0, run.stderr[-2000:]
        # no health check, no parameters, no logs
        assert not report.exists() or report.read_text() == ""
        assert decoy.poll() is None  # and nothing was killed
    finally:
        attacker.kill()
        if decoy is not None:
            decoy.kill()


def test_pids_in_leftover_state_files_are_never_signalled(tmp_path):
    """Item 2: state files naming an unrelated process (a SIGKILL left them; the pid was reused
    since) are leftovers: `zhpipe server stop` and a new warm process remove them and kill nothing;
    a new warm process starts."""
    # a temporary folder short enough for the warm process's socket whatever the length of tmp_path
    # (socket_dir)
    short = Path(tempfile.mkdtemp(prefix="zt-", dir="/tmp"))
    env = project_env(tmp_path / "prefect", tmp_path / "store", short)
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        home = tmp_path / "prefect"
        for name in (
            "zhpipe-server.json",
            f"zhpipe-warm-{handover.fingerprint(env)[:16]}.json",
            "zhpipe-warm-0123456789abcdef.json",
        ):
            (home / name).write_text(
                json.dumps(
                    {
                        "pid": bystander.pid,
                        "url": "http://127.0.0.1:9/api",
                        "socket": "/nonexistent",
                    }
                )
            )
        stopped = zhpipe(env, "server", "stop")
        assert (
            stopped.returncode == 0 and "no background Prefect server was running" in stopped.stdout
        )
        assert bystander.poll() is None and not list(home.glob("zhpipe-*.json"))
        # the same pid with its real start time, but not the recorded command: still not ours
        private.write_state(
            home / "zhpipe-server.json",
            {**procs.identity(bystander.pid, "prefect server start"), "url": "x"},
        )
        assert not procs.is_ours(json.loads((home / "zhpipe-server.json").read_text()))
        zhpipe(env, "server", "stop")
        assert bystander.poll() is None
        # a leftover warm state no longer keeps a new warm process from starting
        mine = handover.fingerprint(env)
        (home / f"zhpipe-warm-{mine[:16]}.json").write_text(
            json.dumps({"pid": bystander.pid, "fingerprint": mine})
        )
        old = dict(os.environ)
        os.environ.update(env)
        tempfile.tempdir = None  # read TMPDIR again, whatever an earlier test left cached
        try:
            handover.spawn(120, env)
            state = home / f"zhpipe-warm-{mine[:16]}.json"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (private.read_state(state) or {}).get("pid") in (
                None,
                bystander.pid,
            ):
                time.sleep(0.2)
            assert (private.read_state(state) or {}).get("pid") not in (None, bystander.pid), (
                home / "zhpipe-warm.log"
            ).read_text()
            served = zhpipe(env, "status", "smoke")
            assert (
                served.returncode == 0
                and "warm: running `zhpipe status smoke`" in (home / "zhpipe-warm.log").read_text()
            )
            assert handover.stop() == 1
        finally:
            os.environ.clear()
            os.environ.update(old)
            tempfile.tempdir = None
        assert bystander.poll() is None
    finally:
        bystander.kill()
        shutil.rmtree(short, ignore_errors=True)


CONTEXT_PROBE = textwrap.dedent("""
    import json, os, resource, sys
    sys.path.insert(0, sys.argv[1])
    from flows.runtime import handover
    from flows.runtime import warm
    ctx = json.loads(sys.stdin.read())
    refused = warm.apply_context(ctx)
    mask = os.umask(0)
    print(json.dumps({"refused": refused, "umask": mask, "nice": os.getpriority(os.PRIO_PROCESS, 0),
                      "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
                      "as": resource.getrlimit(resource.RLIMIT_AS)}))
""")


def _context_of(preexec) -> dict:
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from flows.runtime import handover; "
        "print(json.dumps(handover.context()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(ROOT)],
        preexec_fn=preexec,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_a_handed_over_command_takes_the_limits_umask_and_priority_of_its_shell():
    """Item 3: `ulimit -f 100; ulimit -v 4000000; umask 077; nice -n 19` in the client's shell hold
    in the fork (which starts with none of them), or the command is refused and runs in the
    client."""
    import resource

    def shell():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100 * 1024, 100 * 1024))
        resource.setrlimit(resource.RLIMIT_AS, (4_000_000 * 1024, 4_000_000 * 1024))
        os.umask(0o077)
        os.nice(19)

    ctx = _context_of(shell)
    applied = json.loads(
        subprocess.run(
            [sys.executable, "-c", CONTEXT_PROBE, str(ROOT)],
            input=json.dumps(ctx),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert applied["refused"] is None
    assert applied["umask"] == 0o077 and applied["nice"] == ctx["nice"] == min(
        19, os.getpriority(os.PRIO_PROCESS, 0) + 19
    )
    assert applied["fsize"] == [100 * 1024, 100 * 1024] and applied["as"] == [
        4_000_000 * 1024,
        4_000_000 * 1024,
    ]
    # a client allowed more than the warm process has (a higher hard limit, a lower niceness) is
    # refused, not run with less than it asked for
    refused = json.loads(
        subprocess.run(
            [sys.executable, "-c", CONTEXT_PROBE, str(ROOT)],
            input=json.dumps(_context_of(None)),
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=shell,
        ).stdout
    )
    assert refused["refused"] and "limits or priority" in refused["refused"]


@as_root
def test_another_user_reads_nothing_of_the_tracking_store(shared_tmp):
    """`mlruns/` was readable by every local user (mlflow.db 0644, artifacts 0755), unlike
    `.prefect/`: a store made by an earlier zhpipe is made private by the next command, a new one is
    private from the start."""
    project = shared_tmp / "p"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ZHPIPE_DATA", "ZHPIPE_PROJECT", "MLFLOW_TRACKING_URI", "PREFECT_HOME")
    }
    assert (
        subprocess.run(
            zhpipe_argv("init", str(project)), env=env, cwd=ROOT, capture_output=True
        ).returncode
        == 0
    )
    project.chmod(0o755)
    mlruns = project / "mlruns"
    (mlruns / "artifacts" / "1").mkdir(parents=True)
    (mlruns / "artifacts" / "1" / "model.pkl").write_bytes(b"weights")
    (mlruns / "mlflow.db").write_bytes(b"")
    for path, mode in (
        (mlruns, 0o755),
        (mlruns / "artifacts", 0o755),
        (mlruns / "mlflow.db", 0o644),
    ):
        path.chmod(mode)  # as an earlier zhpipe left them
    done = subprocess.run(
        zhpipe_argv("runs"),
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert {
        p.name: p.stat().st_mode & 0o777
        for p in (mlruns, mlruns / "artifacts", mlruns / "mlflow.db")
    } == {
        "mlruns": 0o700,
        "artifacts": 0o700,
        "mlflow.db": 0o600,
    }
    probe = subprocess.run(
        [
            OTHER_PYTHON,
            "-c",
            textwrap.dedent("""
        import os, sys
        for path in sys.argv[1:]:
            try:
                if os.path.isfile(path) or not os.path.exists(path):
                    open(path, "rb").read(1)
                else:
                    os.listdir(path)
                print("read", path)
            except OSError as e:
                print("refused", path, type(e).__name__)
    """),
            str(mlruns / "mlflow.db"),
            str(mlruns / "artifacts" / "1" / "model.pkl"),
            str(mlruns),
        ],
        preexec_fn=as_other_user,
        cwd="/",
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
    )
    assert probe.stdout.count("refused") == 3 and "read" not in probe.stdout.replace(
        "refused", ""
    ), probe.stdout + probe.stderr
