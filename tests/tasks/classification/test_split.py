import pandas as pd
import pytest

from tasks.classification.split import Params as SplitConfig
from tasks.errors import DataError
from tests.helpers.stages import split_rows


def split_frame(df, params):
    return split_rows(df, params)[0]


def frame(n=200):
    return pd.DataFrame(
        {
            "id": range(n),
            "text": [f"t{i}" for i in range(n)],
            "label": ["a" if i % 4 else "b" for i in range(n)],
        }
    )


def test_stratified_deterministic_and_disjoint():
    parts = split_frame(frame(), SplitConfig(method="permutation"))
    assert [len(parts[s]) for s in ("train", "validation", "test")] == [160, 20, 20]
    for part in parts.values():
        assert part["label"].eq("b").mean() == pytest.approx(0.25, abs=0.05)
    ids = [set(p["id"]) for p in parts.values()]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    again = split_frame(frame(), SplitConfig(method="permutation"))
    assert all(parts[s].equals(again[s]) for s in parts)
    other = split_frame(frame(), SplitConfig(method="permutation", seed=1))
    assert not parts["test"]["id"].equals(other["test"]["id"])


def test_every_class_of_three_rows_or_more_is_in_every_split():
    labels = ["big"] * 50 + ["three"] * 3 + ["four"] * 4 + ["five"] * 5
    df = pd.DataFrame(
        {"id": range(len(labels)), "text": [f"t{i}" for i in range(len(labels))], "label": labels}
    )
    parts = split_frame(df, SplitConfig())
    for name, part in parts.items():
        assert set(part["label"]) == {"big", "three", "four", "five"}, name
    assert sum(len(p) for p in parts.values()) == len(df)


def test_small_classes_are_quarantined_or_merged():
    labels = ["a"] * 20 + ["b"] * 20 + ["c"] * 2 + ["d"]
    df = pd.DataFrame(
        {"id": range(len(labels)), "text": [f"t{i}" for i in range(len(labels))], "label": labels}
    )
    parts, quarantine = split_rows(df, SplitConfig())
    assert sorted(quarantine["label"]) == ["c", "c", "d"] and set(quarantine["reason"]) == {
        "class_under_3_rows"
    }
    assert sum(len(p) for p in parts.values()) + len(quarantine) == len(df)
    parts, quarantine = split_rows(df, SplitConfig(small_classes="merge"))
    assert quarantine.empty and sum((p["label"] == "other").sum() for p in parts.values()) == 3


def test_a_class_under_three_rows_is_a_data_error_not_a_traceback():
    df = pd.DataFrame({"id": range(12), "text": ["t"] * 12, "label": ["a"] * 10 + ["b"] * 2})
    with pytest.raises(
        DataError,
        match=r"1 class \('a', 10 rows\) left with at least 3 rows \(2 rows of smaller classes "
        r"quarantined\)",
    ):
        split_frame(df, SplitConfig())


def reviews(n: int, start: int = 0) -> pd.DataFrame:
    ids = range(start, start + n)
    return pd.DataFrame(
        {
            "id": ids,
            "text": [f"评论 {i} 号" for i in ids],
            "label": ["好" if i % 3 else "差" for i in ids],
        }
    )


def where(parts: dict) -> dict:
    """text -> the split it is in."""
    return {t: name for name, part in parts.items() for t in part["text"]}


def test_hash_split_keeps_every_old_row_when_the_corpus_grows():
    night1 = split_frame(reviews(7000), SplitConfig())
    night2 = split_frame(pd.concat([reviews(7000), reviews(350, start=7000)]), SplitConfig())
    before, after = where(night1), where(night2)
    assert all(after[t] == split for t, split in before.items())  # every old row keeps its split
    new = pd.Series([after[t] for t in set(after) - set(before)]).value_counts(normalize=True)
    assert new["train"] == pytest.approx(0.8, abs=0.07) and new["test"] == pytest.approx(
        0.1, abs=0.05
    )
    for part in night2.values():  # stratified in expectation
        assert part["label"].eq("差").mean() == pytest.approx(1 / 3, abs=0.05)


def test_hash_split_ignores_order_ids_and_other_rows():
    df = reviews(500)
    base = where(split_frame(df, SplitConfig()))
    shuffled = df.sample(frac=1.0, random_state=3).assign(id=range(1000, 1500))
    assert where(split_frame(shuffled, SplitConfig())) == base
    half = where(split_frame(df.iloc[::2], SplitConfig()))
    assert all(base[t] == split for t, split in half.items())
    assert where(split_frame(df, SplitConfig(seed=1))) != base
    # the old split is still there
    assert where(split_frame(df, SplitConfig(method="permutation"))) != base


def test_hash_split_gives_a_small_class_a_row_in_every_split():
    labels = ["big"] * 60 + ["three"] * 3 + ["four"] * 4
    df = pd.DataFrame(
        {"id": range(len(labels)), "text": [f"t{i}" for i in range(len(labels))], "label": labels}
    )
    parts = split_frame(df, SplitConfig())
    for name, part in parts.items():
        assert set(part["label"]) == {"big", "three", "four"}, name
    assert sum(len(p) for p in parts.values()) == len(df)


@pytest.mark.parametrize("method", ["hash", "permutation"])
@pytest.mark.parametrize("small_classes", ["quarantine", "merge"])
def test_a_build_in_many_small_batches_writes_what_one_batch_writes(
    tmp_path, monkeypatch, small_classes, method
):
    import tasks.classification.split as split
    from tasks.core import BuildContext, Facts

    labels = ["b", "a", "c"] * 40 + ["d", "e", "e"]
    df = pd.DataFrame(
        {"id": range(len(labels)), "text": [f"t{i}" for i in range(len(labels))], "label": labels}
    )
    params = SplitConfig(small_classes=small_classes, method=method)
    whole, quarantine = split_rows(df, params)  # every row in one batch
    (tmp_path / "clean").mkdir()
    df.to_parquet(tmp_path / "clean" / "data.parquet", index=False, row_group_size=7)
    monkeypatch.setattr(split, "BATCH_ROWS", 10)  # many batches, each class's rows spread over them
    out = split.build(
        BuildContext(
            inputs={"clean": tmp_path / "clean"},
            facts={"clean": Facts()},
            out=tmp_path,
            params=params,
        )
    )
    assert sorted(quarantine["label"]) == ([] if small_classes == "merge" else ["d", "e", "e"])
    for name, part in whole.items():
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / f"{name}.parquet"), part)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "quarantine.parquet"), quarantine)
    kept = sum(len(p) for p in whole.values())
    assert kept + len(quarantine) == len(df)
    assert (
        out.rows == kept
        and sum(out.metrics[f"rows_{s}"] for s in ("train", "validation", "test")) == kept
    )
