"""The project folder: the folder that holds `pipelines.yaml`. Its stage store (`data/`), MLflow
store (`mlruns/`) and Prefect home (`.prefect/`) live under it, so one installed zhpipe serves any
number of projects and writes nowhere else. Found from the current directory upwards, or given
(`--project DIR`, `ZHPIPE_PROJECT`)."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from tasks.errors import ConfigError

CONFIG_NAME = "pipelines.yaml"


@dataclass(frozen=True)
class Project:
    """Where one project's files live."""

    root: Path

    @property
    def config_file(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def data(self) -> Path:
        """The default stage store."""
        return self.root / "data"

    @property
    def mlruns(self) -> Path:
        return self.root / "mlruns"

    @property
    def prefect_home(self) -> Path:
        return self.root / ".prefect"

    def tracking_uri(self) -> str:
        """MLFLOW_TRACKING_URI when set, else the project's SQLite store."""
        return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.mlruns / 'mlflow.db'}"

    def artifact_root(self) -> str | None:
        """Where new experiments keep artifacts: beside a SQLite store's file (mlruns/artifacts/ for
        the project's own; MLflow would otherwise pick ./mlruns of the working directory), else the
        server's choice."""
        uri = self.tracking_uri()
        if uri.startswith("sqlite:///"):
            return (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
        return None


def find(explicit: str | Path | None = None, start: Path | None = None) -> Project:
    """The project: `explicit`, else ZHPIPE_PROJECT, else the nearest folder with a pipelines.yaml
    from `start` (the current directory) upwards."""
    given = explicit or os.environ.get("ZHPIPE_PROJECT")
    if given:
        root = Path(given).expanduser().resolve()
        if not (root / CONFIG_NAME).is_file():
            raise ConfigError(
                f"{root}: no {CONFIG_NAME} there (a zhpipe project folder has one; `zhpipe init "
                f"{shlex.quote(str(given))}` writes a starter)"
            )
        return Project(root)
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / CONFIG_NAME).is_file():
            return Project(folder)
    raise ConfigError(
        f"no {CONFIG_NAME} in {here} or any folder above it: run zhpipe inside a project, "
        f"pass --project DIR, or create one with `zhpipe init`"
    )


_CURRENT: Project | None = None


def activate(project: Project) -> Project:
    """Make `project` the current one and set what Prefect and MLflow read from the environment,
    before Prefect is imported: a Prefect home inside the project (never the user's ~/.prefect by
    surprise) and an ephemeral-server start-up timeout above the 20 s default, which a first start
    on 2 cores can overrun; Prefect's and MLflow's usage reports off. Values already in the
    environment win."""
    global _CURRENT
    _CURRENT = project
    defaults = {
        "PREFECT_HOME": str(project.prefect_home),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        # no usage reports leave the machine unless the user opts in
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",  # Prefect's client-side usage events too
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        # a run on a server prints its one link itself, at the end
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
        "TOKENIZERS_PARALLELISM": "false",
        # `zhpipe deploy` passes the file's schedules; an empty list must clear a deployment's old
        # ones
        "PREFECT_DEPLOYMENTS_CLEAR_SCHEDULES_ON_EMPTY": "true",
        # zhpipe's log lines reach the Prefect UI and worker logs
        "PREFECT_LOGGING_EXTRA_LOGGERS": "zhpipe",
        # outside a flow run (predict, a stage alone) they just print
        "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    # INFO from zhpipe's logger reaches Prefect's handlers even where the root logger stays at
    # WARNING
    logging.getLogger("zhpipe").setLevel(logging.INFO)
    make_private(project)
    return project


def make_private(project: Project) -> int:
    """A project is its owner's alone whatever the umask: from here on this process creates files
    0600 and folders 0700 (`owner_only`), and a project left open (made under a loose umask, by an
    older zhpipe, a checkout) has its folder, pipelines.yaml, stage store, MLflow and Prefect stores
    closed to others, once, saying so. The walk runs only when one of those is open: what zhpipe
    creates afterwards is private from the start. How many entries were changed."""
    import sys

    from tasks.util.private import open_to_others, owner_only, tighten

    owner_only()
    root = project.root
    tops = [project.config_file, project.data, project.mlruns, project.prefect_home]
    if not any(open_to_others(p) for p in (root, *tops)):
        return 0
    changed = tighten(root, deep=False) + tighten(*tops)
    if changed:
        print(
            f"zhpipe: {changed} files and folders of the project {root} were open to other users; "
            "they are now "
            f"yours only (folders 700, files 600)",
            file=sys.stderr,
            flush=True,
        )
    return changed


def ensure_prefect_home() -> Path:
    """The Prefect home, created (mode 700: its database holds flow parameters and logs) by the
    commands that start Prefect: Prefect's temporary server keeps its SQLite database there and does
    not create missing parents. Other commands (`predict`, `status`) leave no folder behind."""
    home = Path(os.environ["PREFECT_HOME"]).expanduser()
    if not home.is_dir():
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


# where a project's `zhpipe ui` port is drawn from (MLflow's default 5000 stays free)
UI_PORTS = (5100, 5899)


def ui_port(chosen: int | None = None) -> int:
    """The project's MLflow UI port, the same for `zhpipe ui` and every link an alert or report
    prints: ZHPIPE_UI_PORT when set; else `chosen` (`zhpipe ui --port`), recorded; else the recorded
    one; else drawn from UI_PORTS by a hash of the project folder (the next free one if another
    server holds it) and recorded, so that it stays."""
    import hashlib

    from flows.plan.private import port_free
    from tasks.util.private import write_atomic

    if os.environ.get("ZHPIPE_UI_PORT", "").isdigit():
        return int(os.environ["ZHPIPE_UI_PORT"])
    record = current().prefect_home / "zhpipe-ui-port"
    if chosen is None:
        try:
            return int(record.read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            pass
        lo, hi = UI_PORTS
        first = int(hashlib.sha256(str(current().root.resolve()).encode()).hexdigest(), 16) % (
            hi - lo + 1
        )
        for step in range(hi - lo + 1):
            chosen = lo + (first + step) % (hi - lo + 1)
            if port_free(chosen):
                break
    # a read-only project still serves; its links then follow the hash
    with contextlib.suppress(OSError):
        ensure_prefect_home()
        write_atomic(record, f"{chosen}\n")
    return chosen


def current() -> Project:
    """The active project; found (and activated) from the current directory when none is."""
    return _CURRENT if _CURRENT is not None else activate(find())


# what a command that writes needs free where the project writes (ZHPIPE_MIN_FREE_MB changes it)
MIN_FREE_MB = 100


def writes_to() -> dict[Path, str]:
    """The local folders a run writes to, each with what it holds: the project, the stage store,
    MLflow's database, the Prefect home."""
    found = {current().root: "the project"}
    storage = os.environ.get("ZHPIPE_STORAGE") or os.environ.get("ZHPIPE_DATA") or ""
    # a local folder (an object store's space is not this machine's)
    if storage and "://" not in storage:
        found.setdefault(Path(storage).expanduser(), "the stage store")
    uri = current().tracking_uri()
    if uri.startswith("sqlite:///"):
        found.setdefault(Path(uri.removeprefix("sqlite:///")).parent, "MLflow's database")
    if os.environ.get("PREFECT_HOME"):
        found.setdefault(Path(os.environ["PREFECT_HOME"]).expanduser(), "Prefect's database")
    return found


def free_space() -> list[tuple[Path, str, float]]:
    """(the nearest existing folder, what is written there, MB free) for each folder of
    `writes_to`."""
    import shutil

    found = []
    for folder, what in writes_to().items():
        probe = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if probe is not None:
            found.append((probe, what, shutil.disk_usage(probe).free / 2**20))
    return found


def check_space(need_mb: float | None = None) -> list[tuple[Path, str, float]]:
    """One line, before anything is written, when a folder the command writes to has less than
    `need_mb` free: a full disk otherwise shows as pages of database errors, or a run that hangs
    retrying them. Returns what it measured."""
    need = (
        need_mb if need_mb is not None else float(os.environ.get("ZHPIPE_MIN_FREE_MB", MIN_FREE_MB))
    )
    measured = free_space()
    for probe, what, free in measured:
        if free < need:
            raise ConfigError(
                f"not enough disk space: {probe} ({what}) has {free:.1f} MB free, and a command "
                "that "
                f"writes needs at least {need:.0f} MB (ZHPIPE_MIN_FREE_MB); free some space there "
                "or "
                f"move the project"
            )
    return measured


# what each folder a command writes to must take, whatever ZHPIPE_MIN_FREE_MB says
PROBE_BYTES = 1 << 20


def check_writable() -> None:
    """One line when a folder the command writes to cannot take even a small file (a full disk):
    checked by writing one, also with the free-space guard off (ZHPIPE_MIN_FREE_MB=0), because the
    first writers would be Prefect's server and MLflow's database, which retry a full disk for
    minutes and print pages of tracebacks. Leaves nothing behind."""
    import errno

    from tasks.util.private import atomic_path

    for folder in writes_to():
        probe_in = next((p for p in (folder, *folder.parents) if p.is_dir()), None)
        if probe_in is None:
            continue
        try:
            with atomic_path(probe_in / ".zhpipe-space-probe") as tmp, open(tmp, "wb") as f:
                # file systems reserve the blocks as it is written: no fsync needed
                f.write(b"\0" * PROBE_BYTES)
            os.unlink(probe_in / ".zhpipe-space-probe")
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                # a folder that cannot be written for another reason: the command says so where it
                # writes
                continue
            raise ConfigError(
                f"the disk is full: {probe_in} cannot take a 1 MB file ({os.strerror(e.errno)}); "
                "free "
                f"some space there and run again"
            ) from None


def disk_full(error: BaseException) -> str | None:
    """One line for an error caused by a full disk anywhere in its chain (ENOSPC, SQLite's 'database
    or disk is full'), naming the file when it is known; None for any other error."""
    import errno

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            where = error.filename or "a file of the project"
            return (
                f"the disk is full: writing {where} failed ({os.strerror(error.errno)}); free "
                f"some space and run again"
            )
        if "database or disk is full" in str(error):
            return (
                "the disk is full: a database write failed (database or disk is full: the stage "
                "store, MLflow's or "
                f"Prefect's database under {current().root}); free some space and run again"
            )
        error = error.__cause__ or error.__context__
    return None


UNANSWERED = (
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ClientConnectorError",
    "NewConnectionError",
)


def unreachable(error: BaseException) -> str | None:
    """One line for an error caused by a service that did not answer after its retries (the object
    store, a tracking server), found anywhere in the error's chain; None for any other error."""
    import re

    from tasks.util.urls import redact

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ in UNANSWERED or isinstance(
            error, (ConnectionRefusedError, ConnectionResetError)
        ):
            what = re.sub(r"\?\S*", "", " ".join(str(error).split()))[:200] or type(error).__name__
            return (
                f"a service did not answer, after retries: {redact(what)}; the stages that "
                "finished are kept in "
                f"the store, and the next run reuses them (`zhpipe doctor` checks every service)"
            )
        error = error.__cause__ or error.__context__
    return None


def corrupt_prefect_database(home: Path) -> str | None:
    """One line naming `home`'s Prefect database and its fix when SQLite cannot read it (a disk that
    filled mid-write, a copy cut short); None when it reads, or there is none. A server started on
    it exits at once (code 3)."""
    import sqlite3

    db = home / "prefect.db"
    if not db.is_file() or db.stat().st_size == 0:
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as con:
            found = con.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.Error as e:
        found = str(e)
    if found == "ok":
        return None
    return (
        f"the Prefect database {db} is corrupt ({found}); move it aside (`mv {db} {db}.corrupt`) "
        "and run again: "
        f"the runs it recorded leave the Prefect UI, MLflow keeps every metric and model"
    )
