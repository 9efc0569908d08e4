"""Token helpers the profile and embed stages share."""

from __future__ import annotations

import unicodedata
from collections import Counter
from typing import Any

from pydantic import Field, field_validator

from tasks.core import Section

# function words that would fill every word list and cloud (not negations or degree words: 不, 没有,
# 很, 太 carry sentiment); `segment.stopwords` removes more at the segment stage
FUNCTION_WORDS = frozenset(
    "的 了 是 我 你 他 她 它 我们 你们 他们 也 在 都 就 和 与 及 或 而 但 但是 而且 并 因为 所以 "
    "如果 还是 就是 "
    "这 那 这个 那个 这样 这里 那里 一个 个 有 说 到 去 会 要 被 把 给 让 对 从 向 上 下 里 着 过 "
    "吧 啊 呢 吗 呀 嘛 "
    "又 才 等 之 其 该 此 每 些 一 啦 哦 地 得 来 能 可以 可能".split()
)


def is_word(token: str) -> bool:
    """A token worth counting: not punctuation, symbols or digits alone."""
    return any(unicodedata.category(c)[0] in "LM" for c in token)


def prune_counts(counts, limit: int) -> bool:
    """Keep a token-count table within `limit` types: past it, the rarest types (a count at or under
    the smallest threshold that brings the table to half the limit) are dropped, as gensim's
    `max_vocab_size` does while it counts. Frequent types keep their exact counts; returns whether
    anything was dropped."""
    if len(counts) <= limit:
        return False
    values = sorted(counts.values(), reverse=True)
    threshold = values[limit // 2]
    for token in [t for t, c in counts.items() if c <= threshold]:
        del counts[token]
    return True


def build_vocab(counts: Counter, params: Any) -> list[str]:
    """Specials first, then tokens with freq >= min_freq by descending frequency (ties by token)."""
    ranked = sorted(
        (t for t, c in counts.items() if c >= params.min_freq and t not in params.specials),
        key=lambda t: (-counts[t], t),
    )
    if params.max_size is not None:
        ranked = ranked[: max(0, params.max_size - len(params.specials))]
    return list(params.specials) + ranked


class VocabParams(Section):
    """What a vocabulary is built with: every kind's `vocab` section starts from it."""

    min_freq: int = Field(2, ge=1)
    max_size: int | None = Field(50000, ge=1)
    specials: list[str] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # memory: counting holds at most this many token types per kind; past it the rarest are dropped
    # (their counts are below any useful min_freq on such a corpus); `<kind>_types_pruned` says when
    # it happened
    max_types: int = Field(5_000_000, ge=1000)

    @field_validator("specials")
    @classmethod
    def _pad_unk_first(cls, v: list[str]) -> list[str]:
        if v[:2] != ["[PAD]", "[UNK]"]:
            raise ValueError("specials must start with [PAD], [UNK] (ids 0 and 1)")
        return v
