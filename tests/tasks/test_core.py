"""What every stage shares (tasks/core.py): unit names, facts, and upstream files opened by their
declared names."""

from pathlib import Path

import pytest

from tasks.core import BuildContext, Facts, Unit, by_model, gathered, model_unit
from tasks.stages import CLASSIFICATION_STAGES


def test_unit_names_parse_and_print_back():
    for name, parts in (
        ("train", ("train", "", "")),
        ("train.textcnn", ("train", "textcnn", "")),
        ("clean:2026-12-01.csv", ("clean", "", "2026-12-01.csv")),
    ):
        unit = Unit.parse(name)
        assert (
            (unit.stage, unit.model, unit.part) == parts
            and unit == name
            and str(unit) == name
            and hash(unit) == hash(name)
        )
        assert Unit.parse(unit) is unit and Unit(*parts) == unit  # typed once: never parsed again
    assert (
        model_unit("evaluate", "fasttext") == "evaluate.fasttext"
        and model_unit("evaluate", "fasttext").model == "fasttext"
    )
    import json
    import pickle

    assert (
        json.dumps({model_unit("train", "a"): 1}) == '{"train.a": 1}'
        and pickle.loads(pickle.dumps(Unit.parse("clean:x.csv"))).part == "x.csv"
    )
    assert by_model({"train.a": 1, "train.b": 2}) == {"a": 1, "b": 2}


def test_a_unit_stores_its_own_facts_over_those_it_read():
    from tasks.core import established

    read = {
        "augment": Facts(labels=["0", "1"], augment_method_used="eda"),
        "segment": Facts(labels=["x"], own={"font": "f.ttf", "tag_scheme": {"all": "bio"}}),
    }
    stored = established("vocab", read, Facts(own={"font": "own.ttf"}))
    # the first input's, then its own
    assert stored.labels == ["0", "1"] and stored.augment_method_used == "eda"
    # a kind's own facts alike
    assert stored["font"] == "own.ttf" and stored["tag_scheme"] == {"all": "bio"}
    units = {"train.a": Facts(summary={"a": 1}), "train.b": Facts(summary={"b": 2})}
    # its own units: gathered by itself
    assert established("train", units, Facts(models={"a": {}})) == Facts(models={"a": {}})


def test_facts_hand_on_and_gather_labels():
    facts = Facts(labels=["差", "好"], source_sha256="ab")
    assert facts.but(best_model="a").best_model == "a" and facts.but(best_model="a").labels == [
        "差",
        "好",
    ]
    tagged = facts.but(own={"tag_scheme": {"all": "bioes"}})
    # flat
    assert tagged.to_json() == {
        "tag_scheme": {"all": "bioes"},
        "labels": ["差", "好"],
        "source_sha256": "ab",
    }
    assert Facts.from_json(tagged.to_json()) == tagged and tagged["tag_scheme"] == {"all": "bioes"}
    assert tagged["labels"] == ["差", "好"] and tagged["font"] is None
    assert gathered([Facts(labels=["1"]), Facts(labels=["0"], source_sha256="c")]) == Facts(
        labels=["0", "1"], source_sha256="c"
    )


def test_a_stage_opens_what_its_inputs_declare_and_nothing_else(tmp_path):
    ctx = BuildContext(
        {"segment": tmp_path / "seg", "augment": tmp_path / "aug"},
        {},
        tmp_path,
        None,
        outputs={s: CLASSIFICATION_STAGES[s].outputs for s in ("segment", "augment")},
    )
    # `{split}.parquet`
    assert ctx.file("segment", "validation.parquet") == tmp_path / "seg" / "validation.parquet"
    assert ctx.file("augment", "train.words.txt") == tmp_path / "aug" / "train.words.txt"
    with pytest.raises(KeyError, match="stage 'augment' declares no output 'sample.csv'"):
        ctx.file("augment", "sample.csv")
    # nothing declared: not checked
    assert BuildContext({"x": Path("x")}, {}, tmp_path, None).file("x", "any.csv") == Path(
        "x/any.csv"
    )
