"""Test set-up: Prefect, MLflow and the stage store all live in one temporary folder per session."""
import os
import tempfile
from pathlib import Path

import pytest

_TMP = Path(tempfile.mkdtemp(prefix="zhpipe-tests-"))
# set before `flows` is imported, so nothing touches the project's .prefect/, mlruns/ or data/
os.environ["PREFECT_HOME"] = str(_TMP / "prefect")
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_TMP / 'mlflow.db'}"
os.environ["ZHPIPE_DATA"] = str(_TMP / "data")
os.environ["ZHPIPE_PROJECT"] = str(Path(__file__).resolve().parent.parent)  # the repository: its pipelines.yaml
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["ZHPIPE_SERVER"] = "temporary"  # no background server left behind by a test (test_server.py starts its own)


def pytest_configure(config):
    """pytest-xdist workers share the cores: each worker (and the zhpipe processes it starts) gets its share of them as
    OpenMP/MKL threads, set before any test module imports PyTorch. Left at one thread per core each, two workers'
    PyTorch thread pools spin against each other and a training step takes up to ten times as long as alone."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, str(max(1, (os.cpu_count() or 1) // workers)))


from flows.plan import project  # noqa: E402

project.activate(project.find())
project.ensure_prefect_home()

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def prefect_harness():
    """One real (temporary) Prefect server for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def smoke(prefect_harness):
    """The smoke pipeline, run once per test session into the session's default store (ZHPIPE_DATA): tests
    that only read a flow run's results share it. `out` is that first run's summary (every stage built)."""
    from flows.orchestrate.pipeline import pipeline_flow

    return {"store": Path(os.environ["ZHPIPE_DATA"]), "out": pipeline_flow("smoke")}


@pytest.fixture
def run_ctx(tmp_path):
    """A RunContext on the smoke pipeline with its own store and a real MLflow parent run."""
    from flows.orchestrate.pipeline import start_run
    from flows.plan.config import load_pipeline

    return start_run(load_pipeline("smoke"), set(), tmp_path / "store")
