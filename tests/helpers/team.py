"""A team's services on loopback, each a real server, as docs/team.md sets them up: PostgreSQL (the
system's `initdb`/`pg_ctl`, run as a non-root user), an `mlflow server` on it with MLflow's
basic-auth app and its artifacts proxied into moto's S3 server, a `prefect server` on it with an
auth string. And "machines": a folder each with its own HOME and project folder, reaching the others
only through these servers."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.helpers.procs import free_port, stop

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "team"
STORE = f"s3://{BUCKET}/zhpipe"
USERS = {"alice": "alice-password-1", "bob": "bob-password-22"}


def pg_bin() -> Path | None:
    """The system's PostgreSQL programs (Debian keeps them under
    /usr/lib/postgresql/<major>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    return Path(which).parent if which else None


def _as_owner(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, its programs run as the `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _wait(
    url: str, what: str, proc: subprocess.Popen | None, log: Path, auth=None, timeout: float = 180
) -> None:
    """Until `url` answers 200. With `auth`, credentials are sent only once the port's listening
    socket is proved to be `proc`'s (as zhpipe's own servers are checked:
    flows.plan.private.ours_answering)."""
    from urllib.parse import urlsplit

    from flows.plan import private as procs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}: {log.read_text()[-3000:]}")
        # as zhpipe's own: the server answers, then its socket is proved
        if auth is not None and proc is not None:
            try:
                httpx.get(url, timeout=2)  # no credentials: anything that answers HTTP
            except httpx.HTTPError:
                time.sleep(0.3)
                continue
            if procs.serves(proc.pid, urlsplit(url).port) is False:
                raise RuntimeError(
                    f"{what}: port {urlsplit(url).port} is held by another process; no credentials "
                    "sent"
                )
        try:
            if httpx.get(url, timeout=2, auth=auth).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not answer {url} in {timeout:.0f} s: {log.read_text()[-3000:]}")


class Gate:
    """A TCP relay in front of a server on loopback: `cut()` refuses new connections and breaks the
    open ones (the server unreachable, as when a network or the service is down), `mend()` takes
    connections again."""

    def __init__(self, target_port: int):
        self.port, self.target, self.conns = free_port(), target_port, set()
        self.mend()

    def mend(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.sock,), daemon=True).start()

    def cut(self) -> None:
        self.sock.close()
        for conn in list(self.conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self.conns.clear()

    def _accept(self, listening: socket.socket) -> None:
        while True:
            try:
                client, _ = listening.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                if listening.fileno() == -1:
                    return
                # out of descriptors, say: wait for connections to close rather than spin
                time.sleep(0.05)
                continue
            self.conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for conn in (a, b):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            # each direction's thread closes the socket it read from: a relayed connection leaves no
            # descriptor behind (it used to keep both open for good, and a busy test ran this
            # process out of descriptors)
            a.close()
            self.conns.discard(a)


@dataclass
class Team:
    folder: Path
    pg_folder: Path
    pg_port: int
    pg_password: str
    s3: dict
    mlflow_port: int
    prefect_port: int
    auth_string: str
    procs: dict = field(default_factory=dict)
    moto: object = None
    gate: Gate | None = None  # in front of the S3 server: what everyone reaches it through

    @property
    def tracking(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def prefect_api(self) -> str:
        return f"http://127.0.0.1:{self.prefect_port}/api"

    def dsn(self, database: str, driver: str = "postgresql") -> str:
        return f"{driver}://zhpipe:{self.pg_password}@127.0.0.1:{self.pg_port}/{database}"

    def start_mlflow(self) -> None:
        """The tracking server: runs and registry in PostgreSQL, users in MLflow's basic-auth app
        (its own database), artifacts proxied into the bucket (clients hold no bucket
        credentials)."""
        ini = self.folder / "basic_auth.ini"
        # one PBKDF2 check a minute per user, not one per request
        ini.write_text(
            "[mlflow]\ndefault_permission = MANAGE\n"
            f"database_uri = {self.dsn('mlflow_auth')}\nadmin_username = admin\nadmin_password = "
            "admin-password-0\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            "auth_cache_ttl_seconds = 60\n"
        )
        env = {
            **os.environ,
            **self.s3,
            "MLFLOW_AUTH_CONFIG_PATH": str(ini),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": "team-secret-key",
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_S3_ENDPOINT_URL": self.s3["AWS_ENDPOINT_URL"],
        }
        log = self.folder / "mlflow.log"
        self.procs["mlflow"] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                self.dsn("mlflow"),
                "--artifacts-destination",
                f"s3://{BUCKET}/mlflow",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.mlflow_port),
                "--workers",
                "1",
                "--app-name",
                "basic-auth",
            ],
            env=env,
            stdout=open(log, "a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait(f"{self.tracking}/health", "mlflow server", self.procs["mlflow"], log)

    def stop_mlflow(self, kill: bool = False) -> None:
        proc = self.procs.pop("mlflow")
        if kill:
            os.killpg(proc.pid, 9)
            proc.wait(30)
        else:
            stop(proc, grace=10)

    def add_users(self) -> None:
        for user, password in USERS.items():
            answer = httpx.post(
                f"{self.tracking}/api/2.0/mlflow/users/create",
                json={"username": user, "password": password},
                auth=("admin", "admin-password-0"),
                timeout=30,
            )
            assert answer.status_code == 200 or "already exists" in answer.text, answer.text

    def start_prefect(self) -> None:
        log = self.folder / "prefect.log"
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.folder / "prefect-home"),
            "PREFECT_API_DATABASE_CONNECTION_URL": self.dsn("prefect", "postgresql+asyncpg"),
            "PREFECT_SERVER_API_AUTH_STRING": self.auth_string,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "WARNING",
        }
        for key in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING"):
            env.pop(key, None)
        self.procs["prefect"] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "prefect",
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.prefect_port),
            ],
            env=env,
            stdout=open(log, "a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        user, password = self.auth_string.split(":", 1)
        _wait(
            f"{self.prefect_api}/admin/version",
            "prefect server",
            self.procs["prefect"],
            log,
            auth=(user, password),
        )

    def restart_postgres(self) -> None:
        """A fast restart: every open database connection of both servers is dropped."""
        subprocess.run(
            _as_owner(
                [
                    str(pg_bin() / "pg_ctl"),
                    "-D",
                    str(self.pg_folder / "data"),
                    "-l",
                    str(self.pg_folder / "log"),
                    "-m",
                    "fast",
                    "-w",
                    "restart",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )

    def close(self) -> None:
        stop(*self.procs.values(), grace=10)
        if self.gate is not None:
            self.gate.cut()
        if self.moto is not None:
            self.moto.stop()
        subprocess.run(
            _as_owner(
                [
                    str(pg_bin() / "pg_ctl"),
                    "-D",
                    str(self.pg_folder / "data"),
                    "-m",
                    "immediate",
                    "stop",
                ]
            ),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.pg_folder, ignore_errors=True)


def _postgres(team_pg: Path, port: int, password: str) -> None:
    """A PostgreSQL cluster in `team_pg` (owned by the user it runs as), on 127.0.0.1:`port`,
    password logins only, with the databases of the team's servers."""
    binary = pg_bin()
    if os.geteuid() == 0:
        shutil.chown(team_pg, "postgres")
    (team_pg / "pw").write_text(password)
    if os.geteuid() == 0:
        shutil.chown(team_pg / "pw", "postgres")
    subprocess.run(
        _as_owner(
            [
                str(binary / "initdb"),
                "-D",
                str(team_pg / "data"),
                "-U",
                "zhpipe",
                "--auth=scram-sha-256",
                f"--pwfile={team_pg / 'pw'}",
                "-E",
                "UTF8",
                "--no-locale",
            ]
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        _as_owner(
            [
                str(binary / "pg_ctl"),
                "-D",
                str(team_pg / "data"),
                "-l",
                str(team_pg / "log"),
                "-w",
                "-o",
                f"-c listen_addresses=127.0.0.1 -p {port} -k {team_pg}",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    import psycopg

    with psycopg.connect(
        f"postgresql://zhpipe:{password}@127.0.0.1:{port}/postgres", autocommit=True
    ) as conn:
        for name in ("mlflow", "mlflow_auth", "prefect"):
            conn.execute(f"CREATE DATABASE {name}")


def start_team(folder: Path) -> Team:
    """Every service of docs/team.md on loopback; `Team.close()` stops them all."""
    from moto.server import ThreadedMotoServer

    if pg_bin() is None or (os.geteuid() == 0 and not _has_user("postgres")):
        raise RuntimeError(
            "no PostgreSQL server programs (initdb, pg_ctl) on this machine: apt-get install "
            "postgresql"
        )
    # outside pytest's root-only folders: postgres must reach it
    pg_folder = Path(tempfile.mkdtemp(prefix="zhpipe-pg-"))

    s3_port = free_port()
    gate = Gate(s3_port)
    s3 = {
        "AWS_ACCESS_KEY_ID": "zhpipe-test",
        "AWS_SECRET_ACCESS_KEY": "zhpipe-test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{gate.port}",
        "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{gate.port}",
    }
    team = Team(
        folder,
        pg_folder,
        free_port(),
        secrets.token_hex(8),
        s3,
        free_port(),
        free_port(),
        f"team:{secrets.token_hex(8)}",
        gate=gate,
    )
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
    team.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    team.moto.start()
    import boto3

    boto3.client(
        "s3",
        endpoint_url=s3["AWS_ENDPOINT_URL"],
        aws_access_key_id="zhpipe-test",
        aws_secret_access_key="zhpipe-test",
        region_name="us-east-1",
    ).create_bucket(Bucket=BUCKET)
    try:
        _postgres(pg_folder, team.pg_port, team.pg_password)
        team.start_prefect()
        team.start_mlflow()
        team.add_users()
    except BaseException:
        team.close()
        raise
    return team


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")


def machine(
    team: Team | None,
    folder: Path,
    user: str,
    corpora: tuple[str, ...] = ("tests/fixtures/smoke.csv",),
) -> tuple[dict, Path]:
    """An engineer's machine: its own HOME and project folder (the project's pipelines.yaml and
    `corpora`, as a clone of the team's repository has them), the team's servers in its environment
    and nothing of this test run's own. Returns its environment and its project folder. Without a
    team: a machine of its own (the project's SQLite store, its own Prefect server, the store in its
    project folder)."""
    home, project = folder / "home", folder / "project"
    home.mkdir(parents=True)
    project.mkdir()
    shutil.copy(ROOT / "pipelines.yaml", project / "pipelines.yaml")
    for corpus in corpora:
        (project / corpus).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / corpus, project / corpus)
    env = {key: os.environ[key] for key in KEPT_ENV if key in os.environ}
    env.update({"HOME": str(home), "ZHPIPE_WARM": "off", "PREFECT_LOGGING_LEVEL": "WARNING"})
    # matplotlib's font list is the computer's, not the engineer's: one cache for every machine (a
    # new HOME rebuilt it, 3-5 s in each machine's first profile stage) (a folder another user made
    # first is refused: flows.plan.private.private_dir)
    from flows.plan.private import private_dir

    env["MPLCONFIGDIR"] = str(
        private_dir(Path(tempfile.gettempdir()) / f"zhpipe-tests-matplotlib-{os.getuid()}")
    )
    # MLflow's schema is the installed MLflow's: the session's cached copy
    if os.environ.get("ZHPIPE_USER_CACHE"):
        env["ZHPIPE_USER_CACHE"] = os.environ["ZHPIPE_USER_CACHE"]
    if team is None:
        return env, project
    env.update(team.s3)
    env.update(
        {
            "MLFLOW_TRACKING_URI": team.tracking,
            "MLFLOW_TRACKING_USERNAME": user,
            "MLFLOW_TRACKING_PASSWORD": USERS[user],
            "PREFECT_API_URL": team.prefect_api,
            "PREFECT_API_AUTH_STRING": team.auth_string,
            "ZHPIPE_STORAGE": STORE,
        }
    )
    return env, project
