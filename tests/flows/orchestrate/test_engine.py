"""The run engine is one loop over units (flows/orchestrate/engine.py): a nightly pipeline with
partitions, a night the data checks hold out, a model and the profile built beside the training is
walked unit by unit through `Engine.take`, and nothing else reaches the stage cache."""

import traceback
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.orchestrate.engine import Engine
from flows.orchestrate.execute import RunContext
from flows.orchestrate.pipeline import pipeline_flow

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e
NIGHT, BROKEN = "2026-12-01.csv", "2026-12-02.csv"


@pytest.fixture
def nights(tmp_path, prefect_harness):
    """Night 1 (200 smoke reviews) and night 2, all labelled positive (held out by the labels
    check); one model."""
    rows = pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str)
    drops = tmp_path / "data" / "raw" / "nights"
    drops.mkdir(parents=True)
    rows.iloc[:200].to_csv(drops / NIGHT, index=False)
    rows.iloc[200:280].assign(label="1").to_csv(drops / BROKEN, index=False)
    source = {"path": "data/raw/nights/*.csv", "text_column": "review", "label_column": "label"}
    stages = {"augment": {"method": "none"}, "train": {"models": ["tfidf_lr"]}}
    doc = {"pipelines": {"nights": {"source": source, "stages": stages}}}
    (tmp_path / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    from flows.plan import project

    previous = project._CURRENT
    project.activate(project.Project(tmp_path))
    yield tmp_path
    project._CURRENT = previous


def test_every_unit_of_a_run_is_walked_through_one_loop(nights, monkeypatch):
    taken, built, outside = [], {}, []
    take, run_unit = Engine.take, RunContext.run

    def recording_take(self, unit):
        taken.append(unit)
        return take(self, unit)

    def recording_run(self, unit, inputs, build, *args, **kwargs):
        stack = "".join(traceback.format_stack())
        if "flows/orchestrate/engine.py" not in stack:
            outside.append(str(unit))
        result = run_unit(self, unit, inputs, build, *args, **kwargs)
        built[str(unit)] = (getattr(build, "__name__", ""), result.cache)
        return result

    monkeypatch.setattr(Engine, "take", recording_take)
    monkeypatch.setattr(RunContext, "run", recording_run)
    out = pipeline_flow(
        "nights", config_file=str(nights / "pipelines.yaml"), storage=str(nights / "store")
    )

    assert outside == []  # no other driver reaches the stage cache
    stages = [s["stage"] for s in out["stages"]]
    # every stage's own unit, in graph order; embed is left out (no model reads it)
    assert [u for u in taken if u == u.stage and u != "download"] == [
        s for s in stages if s != "download"
    ]
    for stage in stages:  # a stage's partitions or models before the unit that gathers them
        last = max(i for i, u in enumerate(taken) if u == stage)
        assert all(i < last for i, u in enumerate(taken) if u.stage == stage and u != stage)
    # the held night was judged on its clean unit and planned away: the units after it are built
    # without it, and download, which had gathered it, was walked again
    assert f"clean:{BROKEN}" in taken and f"split:{BROKEN}" not in taken
    assert [u for u in taken if u == "download"] == ["download", "download"]
    assert {u["stage"] for u in out["units"]} == {
        *(f"{s}:{NIGHT}" for s in ("download", "clean", "split", "segment", "augment", "vocab")),
        "train.tfidf_lr",
        "evaluate.tfidf_lr",
    }
    # a model's units through the same loop, before the stages that gather them
    assert taken.index("train.tfidf_lr") < taken.index("train") < taken.index("evaluate.tfidf_lr")
    # the profile is taken in its turn and built beside the training, in a process of its own
    assert built["profile"] == ("build_elsewhere", "miss") and "profile" in stages
    assert all(cache == "miss" for _, cache in built.values())
