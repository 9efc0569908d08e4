"""MLflow access with explicit run ids (the fluent API's active run is thread-local) and retried
writes."""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from flows.plan import project
from flows.track.sqlite import check_sqlite, reroot, seed, sqlite_pragmas
from tasks.errors import ZhpipeError


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI when set, else the project's SQLite store (mlruns/mlflow.db)."""
    return project.current().tracking_uri()


# errors a write outlives when tried again: SQLite briefly locked by the UI or another run, a slow
# server
TRANSIENT = ("locked", "timeout")
# MLflow looks a dataset up and inserts it when it is missing: two runs logging the same dataset at
# once both miss it, and the later insert breaks the store's unique key (SQLite and PostgreSQL word
# it differently). Tried again, the write finds the row the other run inserted and links to it.
RACED = ("unique constraint", "duplicate key")


def _retry(fn: Callable, errors: tuple[str, ...] = TRANSIENT) -> Callable:
    """Retry a tracking write a few times when its error's text holds one of `errors`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for attempt in range(4):
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - MLflow raises several unrelated types
                if attempt == 3 or not any(word in str(e).lower() for word in errors):
                    raise
                time.sleep(0.5 * 2**attempt)

    return wrapper


def client():
    """An MlflowClient on the configured store (created lazily: importing mlflow costs seconds), one
    per store and process: a run touches MLflow a few dozen times, and each new client costs ~15
    ms."""
    return _client(tracking_uri())


@lru_cache(maxsize=4)
def _client(uri: str):
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        private_store(uri)
        if not db.stat().st_size:  # new: no migrations to run
            seed(db)
        check_sqlite(db)
        copied_from = reroot(db)
        if copied_from:
            import sys

            print(
                f"zhpipe: this MLflow store was copied or moved from {copied_from}: its artifact "
                "locations now point "
                f"to {db.parent / 'artifacts'} (a copy never writes into its original)",
                file=sys.stderr,
                flush=True,
            )
        sqlite_pragmas()
    return MlflowClient(tracking_uri=uri)


def private_store(uri: str | None = None) -> None:
    """A SQLite store that only its owner reads, as `.prefect/` is: the project's `mlruns/` and the
    store's `artifacts/` folder 0700, the database and its WAL files 0600 (made so when found open;
    another user's are left alone)."""
    uri = uri or tracking_uri()
    if not uri.startswith("sqlite:///"):
        return
    db = Path(uri.removeprefix("sqlite:///"))
    folder = db.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folders = [folder / "artifacts"] + ([folder] if folder == project.current().mlruns else [])
    (folder / "artifacts").mkdir(mode=0o700, exist_ok=True)
    for path, mode in [
        *((f, 0o700) for f in folders),
        *((db.with_name(db.name + s), 0o600) for s in ("", "-wal", "-shm")),
    ]:
        try:
            st = path.stat()
            if st.st_uid == os.getuid() and st.st_mode & 0o777 != mode:
                path.chmod(mode)
        except FileNotFoundError:
            pass
    if not db.exists():  # created private, before MLflow creates it with the umask's mode
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o600))


# the store the warm process opened: (URI, the file's device and inode)
_PREPARED: tuple[str, tuple[int, int]] | None = None


def prepare() -> None:
    """Open the project's SQLite store ahead of the commands (the warm process, before it forks):
    each fork then starts with MLflow's engine made and its schema checked, on connections of its
    own (`after_fork`)."""
    global _PREPARED
    uri = tracking_uri()
    path = Path(uri.removeprefix("sqlite:///"))
    if not uri.startswith("sqlite:///") or not path.is_file():
        return
    store = client()
    # the registry's store too (the champion is looked up every run)
    store._get_registry_client().store  # noqa: B018
    _PREPARED = (uri, _file_id(path))
    _dispose_connections(close=True)  # nothing open is carried into a fork


def after_fork() -> None:
    """In a fork of the warm process: connections of its own, and the prepared store only while it
    is the same sound file (moved aside, replaced or corrupt since: forgotten, so that the first use
    opens and checks it anew)."""
    if _PREPARED is None:
        return
    _dispose_connections()
    uri, file_id = _PREPARED
    path = Path(uri.removeprefix("sqlite:///"))
    try:
        same = _file_id(path) == file_id
        if same:
            check_sqlite(path)
    except (OSError, ZhpipeError):
        same = False
    if not same:
        _forget_stores()


def _file_id(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


def _engine_maps() -> list[dict]:
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    return [SqlAlchemyStore._engine_map, RegistryStore._engine_map]


def _dispose_connections(close: bool = False) -> None:
    """A new connection pool for each engine; in a fork, `close=False` (SQLAlchemy's way across
    fork) leaves the parent's connections alone."""
    for engines in _engine_maps():
        for engine in engines.values():
            engine.dispose(close=close)


def _forget_stores() -> None:
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    _client.cache_clear()
    tracking_utils._tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    registry_utils._get_store_registry()._get_store_with_resolved_uri.cache_clear()
    for engines in _engine_maps():
        engines.clear()


_EXPERIMENTS: dict[tuple[str, str], str] = {}


# MLflow 3's UI opens in its GenAI view unless the browser chose otherwise (localStorage
# mlflow.workflowType); this query parameter of its routes selects the machine-learning view (runs,
# metrics, models)
ML_VIEW = "workflowType=machine_learning"


def ui_url(experiment: str, run_id: str) -> str:
    """The MLflow UI address of a run, as `zhpipe ui` serves it, in the machine-learning view."""

    return f"{ui_base()}/#/experiments/{experiment_id(experiment)}/runs/{run_id}?{ML_VIEW}"


def tracking_server() -> str | None:
    """The tracking server's address when runs are tracked on one (a team's `mlflow server`), else
    None (a SQLite file)."""
    uri = tracking_uri()
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None


def ui_base() -> str:
    """Where people see this store's runs: ZHPIPE_MLFLOW_UI, else a tracking server's own address
    (the team's UI), else where `zhpipe ui` serves the project's store."""
    import os

    from tasks.util.urls import redact

    team = tracking_server()
    if os.environ.get("ZHPIPE_MLFLOW_UI") or team:
        return (os.environ.get("ZHPIPE_MLFLOW_UI") or redact(team)).rstrip("/")
    from flows.plan.project import ui_port

    return f"http://127.0.0.1:{ui_port()}"


def home_url(base: str, opener: bool = False) -> str:
    """Where `zhpipe ui` sends people: the newest zhpipe experiment's runs (else the experiment
    list), in the machine-learning view; with `opener`, through the page of `flows.track.ui` that
    makes that view the browser's."""
    from urllib.parse import quote

    try:
        found = client().search_experiments(
            filter_string="name LIKE 'zhpipe-%'", order_by=["last_update_time DESC"], max_results=1
        )
    except Exception:  # noqa: BLE001 - a store that cannot be read yet: the list page still opens
        found = []
    route = (
        f"#/experiments/{found[0].experiment_id}/runs?{ML_VIEW}"
        if found
        else f"#/experiments?{ML_VIEW}"
    )
    return f"{base}/zhpipe/open?to={quote(route, safe='')}" if opener else f"{base}/{route}"


def experiment_id(name: str) -> str:
    """Id of the experiment `name`, created with artifacts under mlruns/ when missing (asked once
    per process)."""
    key = (tracking_uri(), name)
    if key not in _EXPERIMENTS:
        _EXPERIMENTS[key] = _experiment_id(name)
    return _EXPERIMENTS[key]


def _experiment_id(name: str) -> str:
    c = client()
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        # made by an older zhpipe
        if exp.tags.get("mlflow.experimentKind") != "custom_model_development":
            c.set_experiment_tag(
                exp.experiment_id, "mlflow.experimentKind", "custom_model_development"
            )
        return exp.experiment_id
    from mlflow.exceptions import MlflowException

    # the kind makes the MLflow UI open the experiment on its training runs, not on the GenAI
    # overview
    try:
        return c.create_experiment(
            name,
            artifact_location=project.current().artifact_root(),
            tags={"mlflow.experimentKind": "custom_model_development"},
        )
    except MlflowException as e:
        # another run created it since the lookup
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return c.get_experiment_by_name(name).experiment_id


class Tracker:
    """Writes to one MLflow run, given by id."""

    def __init__(self, run_id: str, experiment: str | None = None):
        self.client = client()
        self.run_id = run_id
        self._experiment_id = experiment

    @property
    def experiment_id(self) -> str:
        """The id of the run's experiment."""
        if self._experiment_id is None:
            self._experiment_id = self.client.get_run(self.run_id).info.experiment_id
        return self._experiment_id

    @classmethod
    def start(
        cls,
        experiment: str,
        name: str,
        parent: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> Tracker:
        """Create a run (nested under `parent` when given)."""
        import socket

        # who runs it: a later run marks it KILLED when that process is gone (`close_orphans`)
        all_tags = {
            "mlflow.runName": name,
            "zhpipe.host": socket.gethostname(),
            "zhpipe.pid": str(os.getpid()),
            **(tags or {}),
        }
        if parent:
            all_tags["mlflow.parentRunId"] = parent
        exp = experiment_id(experiment)
        run = _retry(client().create_run)(exp, run_name=name, tags=all_tags)
        return cls(run.info.run_id, exp)

    @staticmethod
    def existing(run_ids: set[str]) -> set[str]:
        """Those of `run_ids` this tracking store holds (one query; a store moved aside or replaced
        holds none of the runs that built the stage store's outputs)."""
        # an empty id (an output no run logged) is never held
        ids = sorted(r for r in run_ids if r.isalnum())
        if not ids:
            return set()
        found = client().search_runs(
            experiment_ids=[e.experiment_id for e in client().search_experiments()],
            filter_string=f"attributes.run_id IN ({', '.join(repr(r) for r in ids)})",
            max_results=len(ids),
        )
        return {r.info.run_id for r in found}

    @staticmethod
    def close_orphans(experiment: str) -> list[str]:
        """Runs of `experiment` left RUNNING by a process of this machine that no longer exists
        (killed, or the machine restarted): marked KILLED so that the MLflow UI does not show them
        running forever."""
        import socket

        from tasks.util.procs import alive

        host = socket.gethostname()
        try:
            runs = client().search_runs(
                [experiment_id(experiment)],
                filter_string=f"attributes.status = 'RUNNING' and tags.`zhpipe.host` = '{host}'",
                max_results=1000,
            )
        except Exception:  # noqa: BLE001 - tidying never fails a run
            return []
        closed = []
        for r in runs:
            pid = r.data.tags.get("zhpipe.pid", "")
            if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
                client().set_terminated(r.info.run_id, "KILLED")
                closed.append(r.info.run_id)
        return closed

    @_retry
    def finish(self, ok: bool = True) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")

    @staticmethod
    def _params(params: dict[str, Any]) -> list:
        from mlflow.entities import Param

        return [Param(k, str(v)[:6000]) for k, v in params.items()]

    @staticmethod
    def _metrics(metrics: dict[str, float], step: int | None = None) -> list:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        return [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]

    @_retry
    def params(self, params: dict[str, Any]) -> None:
        items = self._params(params)
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    @_retry
    def metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        items = self._metrics(metrics, step)
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    @_retry
    def curves(self, rows: list[tuple[dict[str, float], int]]) -> None:
        """Metrics of many steps (an epoch's each) in as few writes as MLflow allows (1,000 values a
        batch)."""
        items = [m for metrics, step in rows for m in self._metrics(metrics, step)]
        for i in range(0, len(items), 900):
            self.client.log_batch(self.run_id, metrics=items[i : i + 900])

    @_retry
    def log(self, params: dict[str, Any], metrics: dict[str, float]) -> None:
        """Params and metrics in one write (what a reused output's run records)."""
        if len(params) > 100 or len(metrics) > 900:  # MLflow's limits for one batch
            self.params(params)
            self.metrics(metrics)
            return
        self.client.log_batch(
            self.run_id, params=self._params(params), metrics=self._metrics(metrics)
        )

    @_retry
    def tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    @_retry
    def artifact(self, path: Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    @_retry
    def table(self, df: pd.DataFrame, artifact_file: str) -> None:
        """A table shown in the MLflow UI's artifact view (and its Evaluation tab)."""
        with warnings.catch_warnings():  # a pandas deprecation inside MLflow's own code
            warnings.simplefilter("ignore")
            self.client.log_table(self.run_id, data=df, artifact_file=artifact_file)

    @_retry
    def text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    @functools.partial(_retry, errors=TRANSIENT + RACED)
    def dataset(
        self,
        df: pd.DataFrame | Callable[[], pd.DataFrame],
        source: str,
        name: str,
        context: str,
        rows: int | None = None,
    ) -> None:
        """Record a dataset as this run's input (shown under 'Datasets used' in the UI):
        flows/track/datasets.py (`df` may be a function that reads it, when it must be read)."""
        from mlflow.entities import DatasetInput, InputTag

        from flows.track.datasets import dataset_entity

        entity = dataset_entity(df, source, name, rows)
        self.client.log_inputs(
            self.run_id,
            datasets=[DatasetInput(entity, tags=[InputTag("mlflow.data.context", context)])],
        )
