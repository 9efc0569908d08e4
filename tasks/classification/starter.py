"""What `zhpipe init` writes for a classification project (the default kind), its `STARTERS`: the
pipelines.yaml for a labelled CSV (or the example corpus), the one for a folder of nightly CSV
files, and the example corpus itself."""

from __future__ import annotations

import pandas as pd

from tasks.graph import Starter

CSV = """\
# zhpipe pipelines: `zhpipe run` runs the first one, `zhpipe run NAME` another.
# Every key is validated (an unknown key is an error); `zhpipe run --set train.epochs=2`
# overrides one.
pipelines:
  {name}:
    description: {description}
    source:
      # relative to this folder, or absolute; a file:// or http(s):// URL also works
      path: {path}
{sha256}      format: csv
      text_column: {text_column}
      label_column: {label_column}
    stages:
      augment:
        # none: EDA (--set augment.method=eda) doubles the train rows and did not help on the
        # bundled 7,766 reviews (test accuracy tfidf_lr 0.8931 either way, fasttext 0.8771
        # against 0.8796 without, textcnn 0.8636 against 0.8735; a first run of 121 s against
        # 79 s: docs/results/training.md)
        method: none
      embed:
        # Word2Vec only (what textcnn starts from; not built when no model of the run reads
        # it); fastText subword vectors add about 20 s on 12,000 reviews:
        # --set embed.fasttext.enabled=true
        fasttext: {{enabled: false}}
      train:
        # cheapest first; {times}
        # The budget bounds the whole stage: each model is estimated before it starts, and one
        # that cannot fit in what is left is not trained (the table says so); textcnn races
        # the leader in what is left. One --set away: no limit (--set train.budget=null); the
        # neural zoo (about 30 min: --set train.budget=null
        #   --set 'train.models=[tfidf_lr, fasttext, textcnn, bilstm, transformer]');
        # a soft-voting ensemble of the three
        #   (--set 'train.models=[tfidf_lr, fasttext, textcnn, ensemble]').
        # `zhpipe models` lists them all.
        models: {models}
        epochs: 4
        budget: 90s
"""

NIGHTLY = """\
# zhpipe pipelines: `zhpipe run` runs the first one, `zhpipe run NAME` another.
# A folder of nightly files: each file is a partition; a night builds only its new file
# (docs/nightly.md).
pipelines:
  {name}:
    description: {description}
    source:
      # drop tonight's file here, named so that it sorts last (2026-12-02.csv)
      path: {path}
      text_column: {text_column}
      label_column: {label_column}
    stages:
      train:
        models: [tfidf_lr, fasttext]   # `zhpipe models` lists them all
"""

_GOOD = [
    "房间很干净",
    "服务热情周到",
    "早餐丰富好吃",
    "位置方便交通便利",
    "床很舒服睡得好",
    "前台态度很好",
    "环境安静",
    "性价比很高",
]
_BAD = [
    "房间很脏",
    "服务态度差",
    "早餐难吃",
    "位置偏僻不方便",
    "床太硬睡不好",
    "前台很冷漠",
    "隔音太差很吵",
    "价格太贵不值",
]


def example_corpus() -> pd.DataFrame:
    """A small two-class hotel-review corpus made from phrase pairs (a starter, not a benchmark)."""
    rows = []
    for i, a in enumerate(_GOOD):
        for b in _GOOD[i + 1 : i + 4]:
            rows.append({"text": f"{a}，{b}，下次还会再来。", "label": "1"})
    for i, a in enumerate(_BAD):
        for b in _BAD[i + 1 : i + 4]:
            rows.append({"text": f"{a}，{b}，不会再来了。", "label": "0"})
    return pd.DataFrame(rows)


# rows from which the template leaves textcnn (and so the embed stage) out of the first run
LARGE = 30_000
# the times measured on 2 CPU cores (docs/results/training.md, docs/results/corpus-cost.md), as the
# comment says them
SMALL_TIMES = (
    "times on the bundled 7,766 reviews, 2 CPU cores: tfidf_lr 6 s, fasttext 5 s,\n"
    "        # textcnn 7 s an epoch (on 62,000 longer reviews: tfidf_lr 125 s, fasttext 123 s)."
)
LARGE_TIMES = (
    "times on 62,000 reviews, 2 CPU cores: tfidf_lr 125 s (three streamed passes),\n"
    "        # fasttext 123 s; a first run 312 s without the budget, 142 s with it. textcnn\n"
    "        # (--set 'train.models=[tfidf_lr, fasttext, textcnn]') also builds word vectors "
    "first\n"
    "        # (Word2Vec: 167 s on 99,350 rows); on the bundled 7,766 reviews: tfidf_lr 6 s, "
    "fasttext 5 s."
)


def sized(rows: int | None) -> dict[str, str]:
    """The template's model list and its times for a corpus of about `rows` rows (None: the example
    corpus)."""
    if rows is not None and rows >= LARGE:
        return {"models": "[tfidf_lr, fasttext]", "times": LARGE_TIMES}
    return {"models": "[tfidf_lr, fasttext, textcnn]", "times": SMALL_TIMES}


STARTERS = (
    Starter(
        "csv",
        "your corpus: a CSV file with a text and a label column (default: a 12-row example)",
        CSV,
        columns=("text", "label"),
        example=example_corpus,
        sized=sized,
    ),
    Starter(
        "nightly",
        "a folder of CSV files, one per night (a partitioned source)",
        NIGHTLY,
        columns=("text", "label"),
        folder=True,
    ),
)
