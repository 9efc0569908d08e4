import pandas as pd
import pytest

from flows.config import AugmentConfig
from flows.errors import ConfigError
from tasks.augment import AUGMENTERS, augment_frame, eda_words

TRAIN = pd.DataFrame({
    "id": [3, 5, 9],
    "text": ["房间很干净服务也好", "早餐太差了", "位置不错"],
    "words": ["房间 很 干净 服务 也 好", "早餐 太 差 了", "位置 不错"],
    "chars": ["房 间 很 干 净 服 务 也 好", "早 餐 太 差 了", "位 置 不 错"],
    "label": ["1", "0", "1"],
})


def test_eda_rows_keep_label_and_provenance():
    out = augment_frame(TRAIN, AugmentConfig(num_aug=2))
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
    a = augment_frame(TRAIN, AugmentConfig(num_aug=2))
    assert a.equals(augment_frame(TRAIN, AugmentConfig(num_aug=2)))
    assert not a.equals(augment_frame(TRAIN, AugmentConfig(num_aug=2, seed=99)))


def test_eda_words_uses_only_sentence_words():
    import random

    words = "房间 很 干净 服务 也 好".split()
    out = eda_words(words, AugmentConfig(p_swap=0.5, p_delete=0.3, p_insert=0.3), random.Random(0))
    assert out and set(out) <= set(words)


def test_registry_and_unknown_method():
    assert {"eda", "none"} <= set(AUGMENTERS)
    assert len(augment_frame(TRAIN, AugmentConfig(method="none"))) == 3
    with pytest.raises(ConfigError, match="unknown augmenter 'backtranslate'.*eda"):
        augment_frame(TRAIN, AugmentConfig(method="backtranslate"))
