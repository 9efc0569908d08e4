"""The labelled corpora the nightly and checks benchmarks use, made from the bundled data each time
(never committed)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def corpus(name: str) -> pd.DataFrame:
    """The benchmark's corpus as (label, review) rows, unique texts: the bundled hotel reviews, or
    Resume NER's sentences (train, dev and test files) labelled by their most frequent entity type
    (NAME, ORG, TITLE, EDU, ...), sentences without an entity left out. Made here each time; nothing
    of it is committed."""
    if name == "hotel":
        return (
            pd.read_csv(ROOT / "data/raw/ChnSentiCorp_htl_all.csv", dtype=str)
            .dropna()
            .drop_duplicates("review")
        )
    from collections import Counter

    rows = []
    for split in ("train", "dev", "test"):
        chars, types = [], Counter()
        for line in (ROOT / f"data/raw/ResumeNER/{split}.char.bmes").read_text(
            encoding="utf-8"
        ).splitlines() + [""]:
            if not line.strip():
                if chars and types:
                    rows.append({"label": types.most_common(1)[0][0], "review": "".join(chars)})
                chars, types = [], Counter()
                continue
            char, tag = line.split()
            chars.append(char)
            if tag.startswith(("B-", "S-")):
                types[tag.split("-", 1)[1]] += 1
    return pd.DataFrame(rows).drop_duplicates("review")


def reviews(rows: int = 12_000, seed: int = 7) -> pd.DataFrame:
    """A two-class review corpus of `rows` unique texts, as a newcomer's first CSV (text,label): the
    bundled hotel reviews, then the second half of each long review (cut at a sentence mark near its
    middle) as a review of its own with the same label, until `rows` are reached. Made here each
    time; nothing of it is committed."""
    import re

    hotel = corpus("hotel").rename(columns={"review": "text"})[["text", "label"]]
    halves = []
    for text, label in zip(hotel["text"], hotel["label"]):
        cuts = [
            m.end()
            for m in re.finditer(r"[。！？!?，,；;]", text)
            if 0.3 < m.end() / len(text) < 0.7
        ]
        if cuts and len(text) - cuts[0] >= 12:
            halves.append({"text": text[cuts[0] :].strip(), "label": label})
    extra = pd.DataFrame(halves).drop_duplicates("text")
    extra = extra[~extra["text"].isin(set(hotel["text"]))]
    whole = (
        pd.concat([hotel, extra.sample(frac=1, random_state=seed)])
        .drop_duplicates("text")
        .head(rows)
    )
    return whole.sample(frac=1, random_state=seed).reset_index(drop=True)


def pairs(rows: int, seed: int = 5) -> pd.DataFrame:
    """`rows` unique two-review texts of one label each (text,label): a bundled hotel review
    followed by another of the same label, pairs drawn with a fixed seed, repeated pairs dropped
    (benchmarks/bench_scale.py's corpus, by rows rather than size). Made here each time; nothing of
    it is committed."""
    import numpy as np

    hotel = corpus("hotel")
    rng = np.random.default_rng(seed)
    by_label = {label: part["review"].tolist() for label, part in hotel.groupby("label")}
    labels, seen, out = list(by_label), set(), []
    while len(out) < rows:
        label = labels[rng.integers(len(labels))]
        i, j = rng.integers(len(by_label[label]), size=2)
        if (label, i, j) not in seen:
            seen.add((label, i, j))
            out.append({"text": by_label[label][i] + " " + by_label[label][j], "label": label})
    return pd.DataFrame(out)
