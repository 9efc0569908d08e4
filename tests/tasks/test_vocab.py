from collections import Counter

import pandas as pd

from tasks.vocab import Params as VocabConfig
from tasks.vocab import build_vocab, count_tokens, oov_rate


def test_specials_first_then_by_frequency():
    counts = count_tokens(pd.Series(["好 好 好 差", "好 差 一般", "罕见"]))
    vocab = build_vocab(counts, VocabConfig(min_freq=2))
    assert vocab == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "好", "差"]
    assert build_vocab(counts, VocabConfig(min_freq=1, max_size=6))[-1] == "好"


def test_ties_broken_by_token_and_oov_rate():
    vocab = build_vocab(Counter({"b": 2, "a": 2}), VocabConfig())
    assert vocab[5:] == ["a", "b"]
    assert oov_rate(pd.Series(["a b c d"]), set(vocab)) == 0.5
