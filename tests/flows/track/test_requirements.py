"""MLflow's check of a model's requirements around zhpipe's logging and loading
(`flows.track.requirements.by_name`): it still runs and still warns about a requirement this
environment does not meet, without first mapping every installed module to its distribution; after
the last block open, MLflow's map is as it was."""

import logging

import pytest
from mlflow.pyfunc import PythonModel


class Echo(PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


@pytest.fixture
def unmapped(monkeypatch):
    """MLflow's module map not built yet, and building it fails the check (MLflow then logs an
    'unexpected error')."""
    from mlflow.utils import requirements_utils as reqs

    def scan():
        raise AssertionError("every installed distribution was scanned")

    monkeypatch.setattr(reqs, "_MODULES_TO_PACKAGES", None)
    monkeypatch.setattr(reqs.importlib_metadata, "packages_distributions", scan)
    return reqs


@pytest.fixture
def warnings_of_the_check():
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("mlflow.utils.requirements_utils")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def test_the_check_runs_by_name_and_warns_without_scanning_every_distribution(
    unmapped, warnings_of_the_check, tmp_path
):
    import mlflow.pyfunc
    import pandas as pd

    from flows.track.requirements import by_name

    pinned = f"pandas=={pd.__version__}"
    with by_name():
        mlflow.pyfunc.save_model(
            tmp_path / "model", python_model=Echo(), pip_requirements=[pinned, "pyyaml==0.0.1"]
        )
        model = mlflow.pyfunc.load_model(str(tmp_path / "model"))
    assert model.predict(pd.DataFrame({"text": ["好"]}))["text"].tolist() == ["好"]
    said = "\n".join(warnings_of_the_check)
    assert "unexpected error" not in said, said
    # once when saved, once when loaded: the requirement this environment does not meet, and only
    # that one
    assert (
        said.count("pyyaml (current: ") == 2
        and "required: pyyaml==0.0.1" in said
        and "pandas (current" not in said
    )
    # MLflow's map as it was, for anything else in this process
    assert unmapped._MODULES_TO_PACKAGES is None


def test_blocks_in_threads_leave_the_map_to_the_last_one_open(unmapped):
    """Two threads' blocks overlapping: the first to end does not take the map from under the
    other."""
    import threading

    from flows.track.requirements import by_name

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with by_name():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with by_name():
            second_in.set()
            first_out.wait(10)
            # the first block has ended: still MLflow's own entries
            seen.append(unmapped._MODULES_TO_PACKAGES)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == [dict(unmapped.MLFLOW_MODULES_TO_PACKAGES)]
    assert unmapped._MODULES_TO_PACKAGES is None  # and after the last block, MLflow's map as it was


def test_a_logged_model_requires_its_familys_libraries_and_its_members():
    """A logged model's requirements come from its family's declaration (`ModelSpec.libraries`):
    fastText's do not name torch, an ensemble's name every member's."""
    from flows.plan.config import load_pipeline
    from flows.track.requirements import PACKAGES, model_libraries, pinned

    config = load_pipeline("best")
    assert "fasttext" in model_libraries(config, "fasttext")
    assert "torch" not in model_libraries(config, "fasttext")
    assert {"fasttext", "torch", "scikit-learn"} <= set(model_libraries(config, "ensemble"))
    names = [r.split("==")[0] for r in pinned(model_libraries(config, "fasttext"))]
    assert names[: len(PACKAGES)] == [p for p in PACKAGES if p in names]
    assert "fasttext" in names and len(names) == len(set(names))
