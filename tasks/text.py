"""Token helpers the profile and embed stages share."""
from __future__ import annotations

import unicodedata

# function words that would fill every word list and cloud (not negations or degree words: 不, 没有, 很, 太
# carry sentiment); `segment.stopwords` removes more at the segment stage
FUNCTION_WORDS = frozenset(
    "的 了 是 我 你 他 她 它 我们 你们 他们 也 在 都 就 和 与 及 或 而 但 但是 而且 并 因为 所以 如果 还是 就是 "
    "这 那 这个 那个 这样 这里 那里 一个 个 有 说 到 去 会 要 被 把 给 让 对 从 向 上 下 里 着 过 吧 啊 呢 吗 呀 嘛 "
    "又 才 等 之 其 该 此 每 些 一 啦 哦 地 得 来 能 可以 可能".split()
)


def is_word(token: str) -> bool:
    """A token worth counting: not punctuation, symbols or digits alone."""
    return any(unicodedata.category(c)[0] in "LM" for c in token)


def prune_counts(counts, limit: int) -> bool:
    """Keep a token-count table within `limit` types: past it, the rarest types (a count at or under the
    smallest threshold that brings the table to half the limit) are dropped, as gensim's `max_vocab_size`
    does while it counts. Frequent types keep their exact counts; returns whether anything was dropped."""
    if len(counts) <= limit:
        return False
    values = sorted(counts.values(), reverse=True)
    threshold = values[limit // 2]
    for token in [t for t, c in counts.items() if c <= threshold]:
        del counts[token]
    return True
