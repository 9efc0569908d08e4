from collections import Counter

import pandas as pd

from tasks.classification.vocab import Params as VocabConfig
from tasks.classification.vocab import build, count_tokens
from tasks.util.text import build_vocab


def test_specials_first_then_by_frequency():
    counts = count_tokens(pd.Series(["好 好 好 差", "好 差 一般", "罕见"]))
    vocab = build_vocab(counts, VocabConfig(min_freq=2))
    assert vocab == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "好", "差"]
    assert build_vocab(counts, VocabConfig(min_freq=1, max_size=6))[-1] == "好"


def test_ties_broken_by_token():
    vocab = build_vocab(Counter({"b": 2, "a": 2}), VocabConfig())
    assert vocab[5:] == ["a", "b"]


def test_the_stage_reports_the_validation_oov_rate_of_each_kind(tmp_path):
    from tasks.core import BuildContext, Facts

    for stage, split, words in (
        ("augment", "train", ["a b a b", "b a"]),
        ("segment", "validation", ["a b c d"]),
    ):
        (tmp_path / stage).mkdir()
        pd.DataFrame({"words": words, "chars": [w.replace(" ", "") for w in words]}).to_parquet(
            tmp_path / stage / f"{split}.parquet"
        )
    (tmp_path / "out").mkdir()
    out = build(
        BuildContext(
            inputs={"augment": tmp_path / "augment", "segment": tmp_path / "segment"},
            facts={"augment": Facts(labels=["0"]), "segment": Facts()},
            out=tmp_path / "out",
            params=VocabConfig(min_freq=1),
        )
    )
    assert out.metrics["words_validation_oov_rate"] == 0.5 and out.metrics["words_vocab_size"] == 7
    assert (tmp_path / "out" / "words" / "vocab.txt").read_text(encoding="utf-8").split("\n")[
        5:7
    ] == ["a", "b"]
    # it states no labels of its own: the run engine keeps augment's with its output
    assert out.facts.labels is None


def test_a_count_table_past_its_bound_drops_its_rarest_types_only():
    from tasks.util.text import prune_counts

    counts = Counter({f"w{i}": i for i in range(1, 2001)})
    assert not prune_counts(Counter(counts), 2000)
    assert prune_counts(counts, 1000)
    # the frequent keep exact counts
    assert len(counts) <= 500 and counts["w2000"] == 2000 and "w1" not in counts
    assert min(counts.values()) > max(c for c in range(1, 2001) if f"w{c}" not in counts)
