"""`zhpipe tune`: a real Optuna study on the smoke pipeline, trials as nested MLflow runs under one
tune run, a study that resumes, the best settings as --set lines and YAML, and pruning on the
per-epoch curve."""

import pytest
import yaml

from flows.plan.request import RunRequest
from flows.track.tracker import Tracker, client
from tasks.errors import ConfigError

pytestmark = pytest.mark.e2e


def test_a_three_trial_study_nests_its_trials_and_resumes(smoke):
    from flows.orchestrate.tune import tune

    result = tune(RunRequest("smoke"), "tfidf_lr", 3, storage=str(smoke["store"]))
    assert (
        result["complete"] == 3 and result["metric"] == "val_accuracy" and 0 < result["value"] <= 1
    )
    assert set(result["params"]) == {"C", "min_df"} and result["sets"][0].startswith(
        "train.tfidf_lr."
    )
    c = client()
    parent = c.get_run(result["run_id"])
    assert (
        parent.data.tags["zhpipe.tune"] == "tfidf_lr"
        and parent.data.metrics["trials_complete"] == 3
    )
    trials = c.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{result['run_id']}'"
    )
    assert len(trials) == 3 and {r.data.tags["zhpipe.trial_state"] for r in trials} == {"complete"}
    for r in trials:  # each trial: its settings as params, its score, the model unit it trained
        assert {"train.tfidf_lr.C", "train.tfidf_lr.min_df"} <= set(
            r.data.params
        ) and "val_accuracy" in r.data.metrics
    snippet = yaml.safe_load(open(result["file"], encoding="utf-8"))
    assert snippet["pipelines"]["smoke"]["stages"]["train"]["tfidf_lr"] == result["params"]
    # the study resumes
    again = tune(RunRequest("smoke"), "tfidf_lr", 1, storage=str(smoke["store"]))
    assert again["trials"] == 4 and again["value"] >= result["value"]


def test_the_pruner_stops_a_trial_from_its_epoch_curve(prefect_harness):
    import optuna

    from flows.orchestrate.tune import TrialTracker

    study = optuna.create_study(
        direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.9)
    )
    trial = study.ask()
    run = Tracker.start("zhpipe-tune-test", "trial")
    tracker = TrialTracker(run.run_id, trial, "textcnn_val_accuracy")
    tracker.metrics({"textcnn_val_accuracy": 0.95}, step=1)  # above the threshold: goes on
    with pytest.raises(optuna.TrialPruned):
        tracker.metrics({"textcnn_val_accuracy": 0.5}, step=2)
    assert [m.value for m in client().get_metric_history(run.run_id, "textcnn_val_accuracy")] == [
        0.95,
        0.5,
    ]


def test_search_spaces_are_checked():
    from flows.orchestrate.tune import search_space
    from flows.plan.config import load_pipeline

    config = load_pipeline("smoke")
    assert search_space(config, "textcnn")["lr"]["log"] is True  # the default space
    with pytest.raises(
        ConfigError, match="tune: crf is not a model that task classification can tune"
    ):
        search_space(config, "crf")
    bad = config.model_copy(update={"tune": {"textcnn": {"no_such": {"low": 1, "high": 2}}}})
    with pytest.raises(
        ConfigError, match="tune.textcnn.no_such: train.textcnn has no setting 'no_such'"
    ):
        search_space(bad, "textcnn")
