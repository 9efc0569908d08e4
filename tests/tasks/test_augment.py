from pathlib import Path

import pandas as pd
import pytest

from tasks.augment import Params as AugmentConfig
from tasks.augment import augment_frame, check_no_leakage
from tasks.augmenters import AUGMENTERS, AugmentContext, eda_words
from tasks.errors import ConfigError, DataError
from tasks.segment import Params as SegmentConfig

TRAIN = pd.DataFrame({
    "id": [3, 5, 9],
    "text": ["房间很干净服务也好", "早餐太差了", "位置不错"],
    "words": ["房间 很 干净 服务 也 好", "早餐 太 差 了", "位置 不错"],
    "chars": ["房 间 很 干 净 服 务 也 好", "早 餐 太 差 了", "位 置 不 错"],
    "label": ["1", "0", "1"],
})


def run(heldout=(), **params):
    ctx = AugmentContext(AugmentConfig(**params), SegmentConfig(), Path("/nonexistent/cache.sqlite"), set(heldout))
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
    with pytest.raises(ConfigError, match="unknown augmenter 'backtranslate'.*backtranslation, eda"):
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
