import pandas as pd
import pytest

from tasks.errors import DataError
from tasks.split import Params as SplitConfig
from tasks.split import set_aside_small, split_frame


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


def test_every_class_of_three_rows_or_more_is_in_every_split():
    labels = ["big"] * 50 + ["three"] * 3 + ["four"] * 4 + ["five"] * 5
    df = pd.DataFrame({"id": range(len(labels)), "text": [f"t{i}" for i in range(len(labels))], "label": labels})
    parts = split_frame(df, SplitConfig())
    for name, part in parts.items():
        assert set(part["label"]) == {"big", "three", "four", "five"}, name
    assert sum(len(p) for p in parts.values()) == len(df)


def test_small_classes_are_quarantined_or_merged():
    labels = ["a"] * 20 + ["b"] * 20 + ["c"] * 2 + ["d"]
    df = pd.DataFrame({"id": range(len(labels)), "text": [f"t{i}" for i in range(len(labels))], "label": labels})
    kept, quarantine, small = set_aside_small(df, SplitConfig())
    assert small == {"c": 2, "d": 1} and len(quarantine) == 3 and set(quarantine["reason"]) == {"class_under_3_rows"}
    assert len(kept) + len(quarantine) == len(df)
    merged, quarantine, _ = set_aside_small(df, SplitConfig(small_classes="merge"))
    assert quarantine.empty and (merged["label"] == "other").sum() == 3


def test_a_class_under_three_rows_is_a_data_error_not_a_traceback():
    df = pd.DataFrame({"id": range(12), "text": ["t"] * 12, "label": ["a"] * 10 + ["b"] * 2})
    with pytest.raises(DataError, match="'b' has 2 rows"):
        split_frame(df, SplitConfig())


@pytest.mark.parametrize("small_classes", ["quarantine", "merge"])
def test_streamed_build_writes_what_the_in_memory_split_gives(tmp_path, monkeypatch, small_classes):
    import tasks.split as split
    from tasks.core import BuildContext

    labels = ["b", "a", "c"] * 40 + ["d", "e", "e"]
    df = pd.DataFrame({"id": range(len(labels)), "text": [f"t{i}" for i in range(len(labels))], "label": labels})
    (tmp_path / "clean").mkdir()
    df.to_parquet(tmp_path / "clean" / "data.parquet", index=False, row_group_size=7)
    monkeypatch.setattr(split, "BATCH_ROWS", 10)  # many batches, each class's rows spread over them
    params = SplitConfig(small_classes=small_classes)
    out = split.build(BuildContext(inputs={"clean": tmp_path / "clean"}, input_info={"clean": {}}, out=tmp_path, params=params))
    kept, quarantine, small = set_aside_small(df, params)
    assert small == {"d": 1, "e": 2}
    for name, part in split_frame(kept, params).items():
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / f"{name}.parquet"), part)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "quarantine.parquet"), quarantine, check_dtype=False)
    assert out.rows == len(kept) and sum(out.metrics[f"rows_{s}"] for s in ("train", "validation", "test")) == len(kept)
