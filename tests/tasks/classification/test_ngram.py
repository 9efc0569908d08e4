import math

import numpy as np
import pytest

from tasks.classification.models.ngram import EOS, UNK, NgramLM
from tasks.classification.models.ngram import Params as NgramConfig

HOTEL = [
    s.split()
    for s in [
        "房间 很 干净",
        "服务 很 好",
        "房间 很 大 服务 也 好",
        "早餐 很 差",
        "房间 干净 服务 好",
    ]
]
FINANCE = [
    s.split() for s in ["股市 大 跌", "基金 收益 很 差", "股市 上涨 基金 也 涨", "银行 利率 下调"]
]


@pytest.mark.parametrize("method", ["backoff", "kneser_ney"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_probabilities_sum_to_one_over_the_vocabulary(method, n):
    lm = NgramLM(NgramConfig(n=n, method=method)).fit(HOTEL)
    for context in ([], ["房间"], ["房间", "很"], ["没", "见过"], ["<s>", "<s>"], ["服务", "很"]):
        total = sum(lm.prob(w, context) for w in lm.vocab)
        assert total == pytest.approx(1.0, abs=1e-9), (context, total)


@pytest.mark.parametrize("method", ["backoff", "kneser_ney"])
def test_own_corpus_is_less_perplexing_and_unseen_words_are_finite(method):
    hotel = NgramLM(NgramConfig(n=3, method=method)).fit(HOTEL)
    finance = NgramLM(NgramConfig(n=3, method=method)).fit(FINANCE)
    held_out = [s.split() for s in ["房间 很 好", "服务 很 干净"]]
    assert hotel.perplexity(held_out) < finance.perplexity(held_out)
    ppl = hotel.perplexity([["从来", "没有", "见过"]])
    assert math.isfinite(ppl) and hotel.prob("从来", []) == hotel.prob(UNK, [])


def test_backoff_uses_the_fixed_weight_before_normalising():
    lm = NgramLM(NgramConfig(n=2, method="backoff", backoff=0.4)).fit(HOTEL)
    # "很" is followed by 干净, 好, 大, 差 in training; "服务" after "很" is unseen: 0.4 * P(服务) /
    # Z(很)
    z = 1 + 0.4 * (1 - sum(lm.prob(w, []) for w in ["干净", "好", "大", "差"]))
    assert lm.prob("服务", ["很"]) == pytest.approx(0.4 * lm.prob("服务", []) / z)
    assert lm.prob("干净", ["很"]) == pytest.approx((1 / 4) / z)
    assert lm.prob(EOS, ["干净"]) > lm.prob("早餐", ["干净"])


def test_lm_classifier_and_lm_round_trip(tmp_path):
    import pandas as pd

    from tasks.classification.models.ngram import Params as NgramLMConfig
    from tasks.classification.models.ngram import (
        lm_classifier_predictor,
        lm_perplexity,
        train_lm_classifier,
        train_ngram_lm,
    )

    words = [" ".join(s) for s in HOTEL + FINANCE]
    train = pd.DataFrame(
        {
            "words": words,
            "label": ["酒店"] * len(HOTEL) + ["金融"] * len(FINANCE),
            "aug_method": "original",
        }
    )
    test = pd.DataFrame({"words": ["房间 很 干净", "股市 大 跌"], "label": ["酒店", "金融"]})
    train_lm_classifier(train, ["酒店", "金融"], NgramLMConfig(n=2), tmp_path)
    probs = lm_classifier_predictor(tmp_path / "lm_classifier")(test)
    assert probs.argmax(1).tolist() == [0, 1] and np.allclose(probs.sum(1), 1)
    summary = train_ngram_lm(train, test, NgramLMConfig(n=2), tmp_path)
    assert summary["kind"] == "lm" and summary["val_perplexity"] == pytest.approx(
        lm_perplexity(tmp_path / "ngram_lm", test)
    )


def test_train_models_need_a_classifier():
    from pydantic import ValidationError

    from tasks.classification.train import params as _train_params

    TrainConfig = _train_params()

    with pytest.raises(ValidationError, match="at least one classifier"):
        TrainConfig(models=["ngram_lm"])
