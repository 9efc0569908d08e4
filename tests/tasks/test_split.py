import pandas as pd
import pytest

from tasks.errors import DataError
from tasks.split import Params as SplitConfig
from tasks.split import split_frame


def frame(n=200):
    return pd.DataFrame({"id": range(n), "text": [f"t{i}" for i in range(n)], "label": ["a" if i % 4 else "b" for i in range(n)]})


def test_stratified_deterministic_and_disjoint():
    parts = split_frame(frame(), SplitConfig())
    assert [len(parts[s]) for s in ("train", "validation", "test")] == [160, 20, 20]
    for part in parts.values():
        assert part["label"].eq("b").mean() == pytest.approx(0.25, abs=0.05)
    ids = [set(p["id"]) for p in parts.values()]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    again = split_frame(frame(), SplitConfig())
    assert all(parts[s].equals(again[s]) for s in parts)
    other = split_frame(frame(), SplitConfig(seed=1))
    assert not parts["test"]["id"].equals(other["test"]["id"])


def test_single_class_is_an_error():
    df = frame().assign(label="a")
    with pytest.raises(DataError, match="single class"):
        split_frame(df, SplitConfig())
