"""The model registry: adding a model is one module (a ModelSpec) and one entry; the train section,
the train stage and the evaluate stage pick it up with nothing else changed."""

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from tasks.core import BuildContext, Facts, established

TOY = '''
"""A toy classifier: predicts the training set's class shares for every text."""
import json

import numpy as np

from tasks.core import Section
from tasks.models.base import ModelSpec


class Params(Section):
    smoothing: float = 1.0  # added to every class count


def train(inputs):
    counts = inputs.train["label"].value_counts().reindex(inputs.labels, fill_value=0)
    counts = counts + inputs.section.smoothing
    folder = inputs.out / inputs.name
    folder.mkdir()
    (folder / "shares.json").write_text(json.dumps((counts / counts.sum()).tolist()))
    return {"seconds": 0.0, "samples_per_second": 0.0, "history": []}


def predictor(folder):
    shares = np.array(json.loads((folder / "shares.json").read_text()), dtype=np.float32)
    return lambda frame: np.tile(shares, (len(frame), 1))


SPEC = ModelSpec("toy", Params, train, load=predictor)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy module written to a file and imported, and its one entry in its kind's models (every
    kind's registry, tasks.stages.MODELS, sees it)."""
    from tasks.classification.models import MODELS

    (tmp_path / "toy_model.py").write_text(TOY)
    spec = importlib.util.spec_from_file_location("toy_model", tmp_path / "toy_model.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "toy_model", module)
    spec.loader.exec_module(module)
    monkeypatch.setitem(MODELS, "toy", module.SPEC)  # the one entry
    return module


def _stage_inputs(root: Path) -> dict[str, Path]:
    rows = pd.DataFrame(
        {
            "id": range(8),
            "text": ["好", "差"] * 4,
            "words": ["好", "差"] * 4,
            "chars": ["好", "差"] * 4,
            "label": ["1", "1", "1", "0"] * 2,
            "aug_method": "original",
        }
    )
    for stage in ("augment", "segment", "vocab", "embed"):
        (root / stage).mkdir()
    rows.to_parquet(root / "augment" / "train.parquet")
    for split in ("validation", "test"):
        rows.to_parquet(root / "segment" / f"{split}.parquet")
    return {stage: root / stage for stage in ("augment", "segment", "vocab", "embed")}


def test_a_toy_model_needs_one_module_and_one_entry(toy, tmp_path):
    from flows.plan.config import load_pipeline
    from tasks.classification import evaluate, train

    config = load_pipeline("smoke", overrides=["train.models=[toy]", "train.toy.smoothing=0"])
    assert config.stages.train.toy.smoothing == 0.0  # its config section came from its Params
    inputs = _stage_inputs(tmp_path)
    out = tmp_path / "train-out"
    out.mkdir()
    trained = train.build_model(
        BuildContext(
            inputs=inputs,
            facts={"augment": Facts(labels=["0", "1"])},
            out=out,
            params=config.stages.train,
            scratch=tmp_path / "scratch",
        ),
        "toy",
    )
    assert trained.metrics["val_accuracy_best"] == 0.75  # always class "1", right on 6 of 8
    scored = tmp_path / "eval-out"
    scored.mkdir()
    # as the run engine stores them
    trained_facts = established("train", {"augment": Facts(labels=["0", "1"])}, trained.facts)
    unit = evaluate.build_model(
        BuildContext(
            inputs={"train": out, "segment": inputs["segment"]},
            facts={"train": trained_facts},
            out=scored,
            params=config.stages.evaluate,
        ),
        "toy",
    )
    compared = tmp_path / "compared"
    compared.mkdir()
    result = evaluate.build(
        BuildContext(
            inputs={"evaluate.toy": scored},
            facts={"evaluate.toy": established("evaluate", {"train": trained_facts}, unit.facts)},
            out=compared,
            params=config.stages.evaluate,
        )
    )
    assert result.facts.best_model == "toy" and result.metrics["toy_test_accuracy"] == 0.75


def test_an_unregistered_model_is_one_clear_error():
    from flows.plan.config import load_pipeline
    from tasks.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown model 'toy'.*registered: fasttext"):
        load_pipeline("smoke", overrides=["train.models=[toy]"])
