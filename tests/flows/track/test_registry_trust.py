"""A registered version is loaded only when this project logged it: the review put a model with one
added line into the registry (its files in another user's folder, the `champion` alias on it), and
`zhpipe predict` ran that line as the owner. `zhpipe predict` and the champion gate now refuse such
a version in one line, before loading a byte."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers.cli import in_process

CODE = textwrap.dedent("""
    import mlflow
    from pathlib import Path

    Path({marker!r}).write_text("ran as you")  # the attacker's line


    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return model_input


    mlflow.models.set_model(Echo())
""")


def _plant(tmp_path: Path, name: str, location: Path | None, tags: dict[str, str]) -> Path:
    """A model version of `name` with the `champion` alias, logged from code in an experiment whose
    artifacts live at `location` (None: the store's own root), by a run with `tags`; returns the
    file its code writes when loaded."""
    import mlflow

    from flows.track.tracker import client, tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    marker = tmp_path / f"{name}.ran"
    code = tmp_path / f"{name}.py"
    code.write_text(CODE.format(marker=str(marker)))
    c = client()
    experiment = c.create_experiment(
        f"{name}-exp", artifact_location=location.as_uri() if location else None
    )
    with mlflow.start_run(experiment_id=experiment, tags=tags) as run:
        info = mlflow.pyfunc.log_model(name="model", python_model=str(code))
    version = mlflow.register_model(info.model_uri, name).version
    c.set_registered_model_alias(name, "champion", version)
    assert run.info.run_id
    marker.unlink(missing_ok=True)  # logging may have run it once: only loading counts
    return marker


@pytest.mark.parametrize(
    "where, tags, why",
    [
        ("outside", {"zhpipe.pipeline": "x"}, "outside this store's artifact root"),
        ("inside", {}, "holds no record of its files"),
        # a zhpipe tag is no proof: only the record the logging run kept in the stage store is
        (
            "inside",
            {"zhpipe.pipeline": "x", "zhpipe.model": "tfidf_lr"},
            "holds no record of its files",
        ),
    ],
)
def test_a_planted_champion_is_refused_and_never_run(tmp_path, capsys, where, tags, why):
    name = f"zhpipe-planted-{where}-{len(tags)}"
    foreign = tmp_path / "someone-elses-folder"
    from urllib.parse import urlparse

    from flows.plan import project

    own = Path(urlparse(project.current().artifact_root()).path)  # the store's own artifact root
    marker = _plant(tmp_path, name, foreign if where == "outside" else own, tags)
    capsys.readouterr()  # what MLflow printed while planting
    done = in_process(capsys, "predict", "--model", f"models:/{name}@champion", "房间很干净")
    assert (
        done.returncode == 2 and why in done.stderr and len(done.stderr.strip().splitlines()) == 1
    ), done
    assert not marker.exists()  # nothing of it was loaded

    import pandas as pd

    from flows.track.serving import served_outcomes
    from tasks.errors import ZhpipeError

    # the champion gate's re-scoring loads the champion the same way
    with pytest.raises(ZhpipeError, match=why):
        served_outcomes(
            f"models:/{name}@champion", pd.DataFrame({"text": ["好"], "label": [1]}), "accuracy"
        )
    assert not marker.exists()


@pytest.mark.e2e
def test_a_run_after_its_stage_store_was_removed_registers_and_serves_its_own_model(
    tmp_path, capsys, monkeypatch, seed_mlflow
):
    """The stage store removed (data/ deleted), the registry kept: the next run trains a model of
    the same key as the champion, whose files no store vouches for now. It registers its own
    version, which becomes champion and which `zhpipe predict` loads; before, the run said "already
    registered" and predict refused the champion for good."""
    import shutil

    from flows.orchestrate.pipeline import pipeline_flow
    from flows.track.tracker import client
    from tests.helpers.runs import without_profile

    # a registry of its own
    monkeypatch.setenv("MLFLOW_TRACKING_URI", seed_mlflow(tmp_path / "mlflow.db"))
    sets, store = ["train.models=[tfidf_lr]"], tmp_path / "store"
    pipeline_flow("smoke", overrides=sets, storage=str(store), stages=without_profile())
    shutil.rmtree(store)
    again = pipeline_flow("smoke", overrides=sets, storage=str(store), stages=without_profile())
    tags = client().get_run(again["parent_run_id"]).data.tags
    assert tags["zhpipe.registered"] == "zhpipe-smoke/2" and tags["zhpipe.champion"] == "yes", tags
    assert (
        "champion version 1 is not one this project's stage store vouches for"
        in tags["zhpipe.champion_reason"]
    )
    capsys.readouterr()
    done = in_process(
        capsys, "predict", "--pipeline", "smoke", "--storage", str(store), "房间很干净，早餐也好"
    )
    assert done.returncode == 0 and "pred_label" in done.stdout, done
