from pathlib import Path

import pandas as pd
import pytest

from tasks.classification.augment import Params as AugmentConfig
from tasks.classification.augment import augment_frame, check_no_leakage
from tasks.classification.augmenters import AUGMENTERS, AugmentContext, eda_words
from tasks.errors import ConfigError, DataError
from tasks.shared.segment import Params as SegmentConfig

TRAIN = pd.DataFrame(
    {
        "id": [3, 5, 9],
        "text": ["房间很干净服务也好", "早餐太差了", "位置不错"],
        "words": ["房间 很 干净 服务 也 好", "早餐 太 差 了", "位置 不错"],
        "chars": ["房 间 很 干 净 服 务 也 好", "早 餐 太 差 了", "位 置 不 错"],
        "label": ["1", "0", "1"],
    }
)


def run(heldout=(), **params):
    ctx = AugmentContext(
        AugmentConfig(**params), SegmentConfig(), Path("/nonexistent/cache.sqlite"), set(heldout)
    )
    return augment_frame(TRAIN, ctx)[0]


def test_eda_rows_keep_label_and_provenance():
    out = run(num_aug=2)
    original, new = out[out["aug_method"] == "original"], out[out["aug_method"] != "original"]
    assert original["id"].tolist() == [3, 5, 9]
    assert len(new) > 0 and set(new["aug_method"]) == {"eda"}
    assert out["id"].is_unique and new["id"].min() > 9
    source = TRAIN.set_index("id")
    for row in new.itertuples():
        assert row.label == source.loc[row.source_id, "label"]
        assert row.text == row.words.replace(" ", "")
        assert row.words != source.loc[row.source_id, "words"]


def test_eda_is_deterministic_per_seed():
    a = run(num_aug=2)
    assert a.equals(run(num_aug=2))
    assert not a.equals(run(num_aug=2, seed=99))


def test_eda_words_uses_only_sentence_words():
    import random

    words = "房间 很 干净 服务 也 好".split()
    out = eda_words(words, AugmentConfig(p_swap=0.5, p_delete=0.3, p_insert=0.3), random.Random(0))
    assert out and set(out) <= set(words)


def test_registry_and_unknown_method():
    assert {"eda", "none", "backtranslation"} <= set(AUGMENTERS)
    assert len(run(method="none")) == 3
    with pytest.raises(
        ConfigError, match="unknown augmenter 'backtranslate'.*backtranslation, eda"
    ):
        run(method="backtranslate")


def test_new_rows_equal_to_heldout_texts_are_dropped():
    out = run(num_aug=1)
    new_texts = set(out.loc[out["aug_method"] == "eda", "text"])
    victim = sorted(new_texts)[0]
    again = run(heldout={victim}, num_aug=1)
    assert victim not in set(again["text"]) and len(again) == len(out) - 1


def test_leakage_check_fails_loudly():
    bad = TRAIN.assign(source_id=TRAIN["id"])
    with pytest.raises(DataError, match="equal validation/test texts"):
        check_no_leakage(bad, set(TRAIN["id"]), {"早餐太差了"})
    with pytest.raises(DataError, match="outside the train split"):
        check_no_leakage(bad.assign(source_id=[3, 5, 77]), set(TRAIN["id"]), set())


@pytest.mark.parametrize("processes", [False, True])
def test_the_stage_streams_eda_batch_by_batch_into_what_the_whole_split_gives(
    tmp_path, monkeypatch, processes
):
    """The stage writes originals then new rows batch by batch (chunk functions on worker processes,
    or in this process); the rows equal augment_frame's over the whole split, and a held-out text
    never enters."""
    import tasks.classification.augment as augment
    import tasks.util.io as io
    from tasks.core import BuildContext, Facts
    from tasks.util.pool import ChunkPool

    words = [" ".join(f"词{(i * 7 + k) % 23}" for k in range(3 + i % 4)) for i in range(60)]
    train = pd.DataFrame(
        {
            "id": range(100, 160),
            "line": range(2, 62),
            "text": [w.replace(" ", "") for w in words],
            "label": [str(i % 2) for i in range(60)],
            "words": words,
            "chars": words,
        }
    )
    seg = tmp_path / "segment"
    seg.mkdir()
    train.to_parquet(seg / "train.parquet", index=False, row_group_size=7)
    params = AugmentConfig(num_aug=2)
    whole, _ = augment_frame(
        train, AugmentContext(params, SegmentConfig(), tmp_path / "c.sqlite", set())
    )
    # one EDA row that equals a held-out text
    victim = whole[whole["aug_method"] == "eda"]["text"].iloc[0]
    pd.DataFrame({"text": [victim]}).to_parquet(seg / "validation.parquet")
    pd.DataFrame({"text": ["别的"]}).to_parquet(seg / "test.parquet")
    expected, _ = augment_frame(
        train, AugmentContext(params, SegmentConfig(), tmp_path / "c.sqlite", {victim})
    )
    monkeypatch.setattr(io, "BATCH_ROWS", 10)
    monkeypatch.setattr(augment, "CHUNK_ROWS", 10)

    class Stages:
        segment = SegmentConfig()

    class Store:
        def cache_file(self, name):
            return tmp_path / name

        registered = None

    out = tmp_path / "out"
    out.mkdir()
    result = augment.build(
        BuildContext(
            {"segment": seg},
            {"segment": Facts(labels=["0", "1"])},
            out,
            params,
            stages=Stages(),
            store=Store(),
            pool=(lambda w: ChunkPool(2)) if processes else (lambda w: ChunkPool(1)),
        )
    )
    got = pd.read_parquet(out / "train.parquet")
    cols = ["id", "text", "words", "label", "source_id", "aug_method", "aug_index"]
    pd.testing.assert_frame_equal(got[cols], expected[cols], check_dtype=False)
    assert (
        victim not in set(got.loc[got["aug_method"] == "eda", "text"])
        and result.metrics["filtered_heldout"] >= 1
    )
    assert (out / "train.words.txt").read_text(encoding="utf-8").splitlines() == got[
        "words"
    ].tolist()
    assert result.metrics["rows_original"] == 60 and result.rows == len(got)
    # the split was read in batches (row groups of 7)
    assert len(list(augment.Rows(seg / "train.parquet").batches())) == 5
