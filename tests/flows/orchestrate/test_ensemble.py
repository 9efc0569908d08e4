"""The `ensemble` classifier on the smoke pipeline: built from the run's other models (reused from
the store), weights fit on validation, registered and served like any classifier; stacking too."""

import mlflow
import numpy as np
import pytest

from flows.orchestrate.pipeline import pipeline_flow
from flows.plan.config import load_pipeline
from flows.track.tracker import client
from tasks.classification.models.ensemble import fit_weights
from tasks.errors import ConfigError

pytestmark = pytest.mark.e2e


def test_weights_minimise_validation_log_loss():
    y = np.array([0, 1, 0, 1])
    good = np.array([[0.9, 0.1], [0.2, 0.8], [0.8, 0.2], [0.1, 0.9]])
    noise = np.full((4, 2), 0.5)
    assert fit_weights([good, noise], y, grid=10) == [1.0, 0.0]
    # a tie goes to the most even weights
    assert fit_weights([noise, noise], y, grid=4) == [0.5, 0.5]


@pytest.mark.parametrize("method", ["soft_vote", "stacking"])
def test_an_ensemble_of_the_runs_models_is_trained_logged_and_served(smoke, method):
    overrides = [
        "train.models=[fasttext,textcnn,ensemble]",
        "train.ensemble.members=[fasttext,textcnn]",
        f"train.ensemble.method={method}",
    ]
    out = pipeline_flow(
        "smoke", overrides=overrides, storage=str(smoke["store"]), stages=["train", "evaluate"]
    )
    units = {u["stage"]: u for u in out["units"]}
    # members reused
    assert units["train.fasttext"]["cache"] == "hit" and units["train.textcnn"]["cache"] == "hit"
    summary = units["train.ensemble"]["facts"]["summary"]
    assert summary["members"] == ["fasttext", "textcnn"]
    if method == "soft_vote":
        assert len(summary["weights"]) == 2 and abs(sum(summary["weights"]) - 1) < 1e-9
    else:
        assert 0 <= summary["stacking_cv_val_accuracy"] <= 1
    assert 0 <= units["evaluate.ensemble"]["metrics"]["test_accuracy"] <= 1
    served = mlflow.pyfunc.load_model(
        client().get_run(units["train.ensemble"]["run_id"]).data.tags["zhpipe.model_uri"]
    )
    probs = served.predict(["房间很干净，服务很好", "太差了"])
    assert np.allclose(
        probs[[c for c in probs.columns if c.startswith("p_")]].sum(1), 1.0, atol=1e-4
    )


def test_members_must_be_trained_in_the_same_run():
    with pytest.raises(ConfigError, match="train.ensemble.members: tfidf_lr not in train.models"):
        load_pipeline(
            "smoke",
            overrides=[
                "train.models=[fasttext,ensemble]",
                "train.ensemble.members=[fasttext,tfidf_lr]",
            ],
        )
