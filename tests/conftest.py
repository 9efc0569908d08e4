"""Test set-up: Prefect, MLflow and the stage store all live in one temporary folder per session."""

import os
import subprocess
import tempfile
from datetime import UTC
from pathlib import Path

import pytest

_TMP = Path(tempfile.mkdtemp(prefix="zhpipe-tests-"))
# set before `flows` is imported, so nothing touches the project's .prefect/, mlruns/ or data/
os.environ["PREFECT_HOME"] = str(_TMP / "prefect")
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_TMP / 'mlflow.db'}"
os.environ["ZHPIPE_DATA"] = str(_TMP / "data")
# MLflow's schema, which zhpipe caches per user (flows/track/sqlite.py)
os.environ["ZHPIPE_USER_CACHE"] = str(_TMP / "user-cache")
# the repository: its pipelines.yaml
os.environ["ZHPIPE_PROJECT"] = str(Path(__file__).resolve().parent.parent)
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# no background server left behind by a test (test_server.py starts its own)
os.environ["ZHPIPE_SERVER"] = "temporary"


def _loopback_ca() -> Path:
    """A CA file of one certificate, for the suite's TLS settings. Every server the tests start
    speaks plain HTTP on loopback (the TLS test gives its own CA), yet each Prefect client and httpx
    client parses the whole system CA bundle when it is made: about 30 ms of CPU, a thousand times a
    session."""
    from datetime import datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "zhpipe tests (loopback only)")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=2))
        .sign(key, hashes.SHA256())
    )
    path = _TMP / "loopback-ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


os.environ["PREFECT_API_SSL_CERT_FILE"] = os.environ["SSL_CERT_FILE"] = str(_loopback_ca())


def pytest_configure(config):
    """pytest-xdist workers share the cores: each worker (and the zhpipe processes it starts) gets
    its share of them as OpenMP/MKL threads, set before any test module imports PyTorch. Left at one
    thread per core each, two workers' PyTorch thread pools spin against each other and a training
    step takes up to ten times as long as alone.

    One real Prefect server serves the session: started here by xdist's controller before it starts
    its workers (or by the one test process without xdist), so that it boots while they import and
    collect; its URL goes into the environment, which the workers, every in-process flow and every
    zhpipe process a test starts inherit. Without it each of those processes starts Prefect's
    temporary server of its own: about 8 s of CPU per command, most of the suite's time. One server
    for all workers rather than one each: a server's start costs 14 s of CPU."""
    workerinput = getattr(config, "workerinput", None)
    workers = int((workerinput or {}).get("workercount", 1))
    if workers > 1:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, str(max(1, (os.cpu_count() or 1) // workers)))
    if workerinput is not None and _SHARED in os.environ:
        _SERVER.attach(os.environ[_SHARED])
    elif not os.environ.get("PREFECT_API_URL"):
        _SERVER.start()


def pytest_sessionfinish(session, exitstatus):
    """The session's server stops; its folder (stores, databases: hundreds of MB) goes too unless a
    test failed."""
    import sys

    # what Prefect still has to send goes first, while the server answers
    if "prefect" in sys.modules:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        for worker in (APILogWorker, EventsWorker):
            worker.drain_all(timeout=30)
    _SERVER.stop()
    if exitstatus == 0:
        import shutil

        shutil.rmtree(_TMP, ignore_errors=True)


def pytest_unconfigure(config):
    _SERVER.stop()


_SHARED = "ZHPIPE_TESTS_PREFECT_SERVER"


class _SessionServer:
    """Prefect's own API server (the app its temporary server runs) in a subprocess on a free
    loopback port, with its database in the session's folder; `wait()` blocks until it answers.
    xdist's workers `attach` to the controller's."""

    def __init__(self):
        self.proc = None
        self.url = None
        self.home = None

    @property
    def seed(self) -> Path:
        return self.home.parent / "prefect-seed.db"

    def attach(self, shared: str):
        url, home = shared.split(" ", 1)
        self.url, self.home = url, Path(home)

    def start(self):
        import socket
        import subprocess

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/api"
        # its database: tests look into it for what a run recorded
        self.home = _TMP / "prefect-server"
        self.home.mkdir()
        # the app and command line of zhpipe's own temporary server
        from flows.runtime import temporary

        env = temporary.environment(
            {
                **os.environ,
                "PREFECT_HOME": str(self.home),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            }
        )
        # the harness's server asks for no login: tests of a team's server without one use it as
        # such, and zhpipe's own servers, which do, are tested with theirs (tests/test_doors.py)
        for login in ("PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING"):
            env.pop(login, None)
        self.log = open(self.home / "server.log", "w")
        # it ends with this process even when this one is killed (no finish hook runs)
        self.proc = subprocess.Popen(
            temporary.command(port),
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        os.environ["PREFECT_API_URL"] = self.url
        os.environ[_SHARED] = f"{self.url} {self.home}"

    def wait(self, timeout: float = 180):
        import time

        from flows.runtime.server import _healthy

        if self.url is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    "the session's Prefect server exited: "
                    f"{(self.home / 'server.log').read_text()[-3000:]}"
                )
            if _healthy(self.url, timeout=2):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the session's Prefect server did not answer within {timeout:.0f} s")

    def snapshot(self):
        """A copy of the server's database as it is before any test has used it: migrated, block
        types registered, nothing run (`seed_prefect_home`). Whichever test process comes first
        makes it, while the others wait at the lock, so that none has run a test yet."""
        from tests.helpers.sqlite import copy_sqlite

        if self.home is not None:
            _made_once(self.seed, lambda tmp: copy_sqlite(self.home / "prefect.db", tmp))

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self.log.close()


_SERVER = _SessionServer()


def _made_once(seed: Path, make) -> Path:
    """`seed`, a database the test processes share: `make(tmp)` writes it by whichever process asks
    first, while the others wait at its lock; it appears under its name only once whole."""
    import fcntl

    with open(seed.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not seed.exists():
            tmp = seed.with_suffix(".tmp")
            make(tmp)
            tmp.rename(seed)
    return seed


def _seed_home(home: Path) -> Path:
    """A new Prefect home holding a copy of the session server's fresh database, so that the server
    a test starts there skips Prefect's migrations (about 9 s of CPU for each new home). Tests of a
    server's lifecycle, its credentials and its failures use it; test_project's newcomer run keeps
    the real first start."""
    import shutil

    home.mkdir(parents=True, exist_ok=True)
    if _SERVER.home is not None and _SERVER.seed.exists():
        shutil.copyfile(_SERVER.seed, home / "prefect.db")
    return home


from flows.plan import project  # noqa: E402

project.activate(project.find())
project.ensure_prefect_home()

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session", autouse=True)
def prefect_harness():
    """The session's real Prefect server (started in pytest_configure), answering before the first
    test runs: its URL and its home, which holds its database. Flows run in the test process as
    `zhpipe run` runs them, without flow-run heartbeats (flows.cli.run._heartbeats): stopping
    Prefect's heartbeat thread holds each flow up to a second."""
    from flows.cli.run import _heartbeats

    _SERVER.wait()
    _SERVER.snapshot()
    session_db = Path(os.environ["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///"))
    if not session_db.exists():
        _seed_mlflow(session_db)
    with _heartbeats():
        yield {"url": _SERVER.url, "home": _SERVER.home}


@pytest.fixture(autouse=True)
def mlflow_follows_the_environment():
    """Before each test, MLflow's tracking URI is the one the environment names.
    `mlflow.set_tracking_uri` (which zhpipe calls with the store it resolved, before MLflow's fluent
    API) keeps its URI in a global; a test or module that pointed MLFLOW_TRACKING_URI at a store of
    its own restores the variable but not that global, and a later test's direct MLflow call
    (`mlflow.pyfunc.load_model`) would look in the other store."""
    import sys

    if "mlflow" in sys.modules and os.environ.get("MLFLOW_TRACKING_URI"):
        import mlflow

        if mlflow.get_tracking_uri() != os.environ["MLFLOW_TRACKING_URI"]:
            mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])


@pytest.fixture(scope="session")
def seed_prefect_home(prefect_harness):
    """`seed_prefect_home(folder)`: a Prefect home whose first server start skips the migrations
    (`_seed_home`)."""
    return _seed_home


def _seed_mlflow(path: Path) -> Path:
    """`path`: a new, empty MLflow database (MLflow's tables, its Default experiment, nothing
    run), filled as zhpipe fills a project's new store (flows.track.sqlite.seed), for tests whose
    store must exist before their command."""
    from flows.track.sqlite import seed

    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    assert seed(path), f"{path} was not seeded"
    return path


@pytest.fixture(scope="session")
def seed_mlflow(prefect_harness):
    """`seed_mlflow(path)`: an empty MLflow database at `path` (`_seed_mlflow`); returns its
    tracking URI."""
    return lambda path: f"sqlite:///{_seed_mlflow(path)}"


@pytest.fixture(scope="session")
def smoke(prefect_harness):
    """The smoke pipeline, run once per test session into the session's default store (ZHPIPE_DATA):
    tests that only read a flow run's results share it. `out` is that first run's summary (every
    stage built)."""
    from flows.orchestrate.pipeline import pipeline_flow

    return {"store": Path(os.environ["ZHPIPE_DATA"]), "out": pipeline_flow("smoke")}


@pytest.fixture
def run_ctx(tmp_path):
    """A RunContext on the smoke pipeline with its own store and a real MLflow parent run."""
    from flows.orchestrate.pipeline import start_run
    from flows.plan.request import RunRequest

    request = RunRequest("smoke")
    return start_run(request, request.config(), set(), tmp_path / "store")


def pytest_collection_modifyitems(config, items):
    """Under xdist, each worker's tests in the order the scheduler hands them out
    (tests/helpers/schedule.py)."""
    # (a worker's own `dist` option reads "no")
    if getattr(config, "workerinput", None) is not None:
        from tests.helpers.schedule import reorder

        reorder(items)


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the team modules handed out as one unit, first
    (tests/helpers/schedule.py)."""
    if config.getvalue("dist") == "loadfile":
        from tests.helpers.schedule import TeamFirst

        return TeamFirst(config, log)
    return None


@pytest.fixture
def shared_folder():
    """A folder both users can write to, without the sticky bit (a team's drop folder; the kernel's
    protection of links in sticky folders, fs.protected_symlinks, does not apply here)."""
    folder = Path(tempfile.mkdtemp(prefix="zhpipe-drop-", dir="/tmp"))
    folder.chmod(0o777)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)
