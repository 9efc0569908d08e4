"""The training budget as a promise, through the smoke pipeline's real flow: a model it leaves no
time for is not started, and the run table, comparison.csv, the registry and the parent run say
so."""

import json
from pathlib import Path

import pandas as pd
import pytest

from flows.orchestrate.pipeline import pipeline_flow
from flows.track.tracker import client

pytestmark = pytest.mark.e2e


def test_a_network_the_budget_cannot_afford_is_not_started_and_says_so(smoke):
    """fastText trains first (the cheapest always does, whatever it costs); half a second cannot
    afford textcnn: it is not started, it has no evaluation, comparison.csv names it with the
    reason, fastText is chosen."""
    # both unbuilt
    sets = ["train.budget=0.5", "train.fasttext.epoch=7", "train.textcnn.num_filters=9"]
    out = pipeline_flow("smoke", overrides=sets, storage=str(smoke["store"]))
    units = {u["stage"]: u for u in out["units"]}
    assert units["train.fasttext"]["cache"] == "miss"
    assert units["train.textcnn"]["cache"] == "not trained", units
    assert units["train.textcnn"]["why"].startswith("not trained: the budget left it no time ("), (
        units
    )
    assert "evaluate.textcnn" not in units and "evaluate.fasttext" in units
    evaluate = next(s for s in out["stages"] if s["stage"] == "evaluate")
    table = pd.read_csv(Path(evaluate["path"]) / "comparison.csv", dtype={"budget": str})
    assert list(table["model"]) == ["fasttext", "textcnn"], table
    cut = table.set_index("model").loc["textcnn"]
    assert pd.isna(cut["test_accuracy"]) and cut["budget"].startswith("not trained"), table
    assert json.loads((Path(evaluate["path"]) / "chosen.json").read_text())["model"] == "fasttext"
    tags = client().get_run(out["parent_run_id"]).data.tags
    assert tags["zhpipe.budget"].startswith("textcnn not trained: the budget left it no time"), tags
    # the decision is kept: all cached
    again = pipeline_flow("smoke", overrides=sets, storage=str(smoke["store"]))
    assert {s["stage"]: s["cache"] for s in again["stages"]} == {
        s["stage"]: "hit" for s in again["stages"]
    }
    assert {u["stage"]: u["cache"] for u in again["units"]}["train.textcnn"] == "not trained"


def test_the_report_is_not_calm_when_the_budget_cut():
    from flows.track.report import worries

    lines = worries(
        True, [], {"zhpipe.budget": "textcnn not trained: the budget left it no time (0 s left)"}
    )
    assert lines == [
        "the training budget: textcnn not trained: the budget left it no time (0 s left)"
    ]
    assert worries(True, [], {}) == []
