"""Stage `embed` (task ner): Word2Vec vectors (the `embed.word2vec` settings) for the characters,
the bigrams and the jieba words of the train split, which start the taggers' character and bigram
embeddings and the lexicon adapter's word vectors; and the probe words' neighbours."""

from __future__ import annotations

import pandas as pd
from pydantic import Field

from tasks.core import BuildContext, BuildOutput, Section
from tasks.ner.tagging import bigrams
from tasks.util.vectors import Word2VecParams, neighbours, train_word2vec

LIBRARIES = ("gensim", "numpy")
FILES: tuple[str, ...] = ()


class Params(Section):
    """The `embed` section of task ner: one Word2Vec setting for its three vector sets, and the
    probe words."""

    word2vec: Word2VecParams = Word2VecParams()
    probe_words: list[str] = ["酒店", "服务", "干净"]
    topn: int = 5
    workers: int = Field(2, ge=1)  # gensim threads; >1 trades bit-exact reproducibility for speed
    seed: int = 1


def _tokens(items) -> str:
    """Tokens joined by spaces; a token holding white space cannot be one, so it becomes a
    placeholder."""
    return " ".join(t if not any(c.isspace() for c in t) else "\u2581" for t in items)


def build(ctx: BuildContext) -> BuildOutput:
    """Write `chars.bin`, `bigrams.bin`, `words.bin` (word2vec's binary format, no pickle) and
    `neighbours.csv`."""
    p: Params = ctx.params
    train = pd.read_parquet(ctx.file("augment", "train.parquet"), columns=["text"])
    texts = train["text"].astype(str).tolist()
    corpora = {
        "chars": [_tokens(t) for t in texts],
        "bigrams": [_tokens(bigrams(t)[0]) for t in texts],
    }
    metrics, rows = {}, []
    for kind in ("chars", "bigrams", "words"):
        corpus = (
            ctx.file("augment", "train.words.txt")
            if kind == "words"
            else ctx.scratch / f"{kind}.txt"
        )
        if kind != "words":
            corpus.write_text("\n".join(corpora[kind]) + "\n", encoding="utf-8")
        kv = train_word2vec(corpus, p)
        kv.save_word2vec_format(str(ctx.out / f"{kind}.bin"), binary=True)
        metrics[f"{kind}_vectors"] = len(kv)
        if kind == "words":
            similar = lambda w, n, kv=kv: kv.most_similar(w, topn=n) if w in kv else []
            rows = neighbours("word2vec", p.probe_words, similar, p.topn)
    table = pd.DataFrame(rows, columns=["model", "word", "rank", "neighbour", "cosine"])
    table.to_csv(ctx.out / "neighbours.csv", index=False)
    return BuildOutput(
        rows=int(metrics["chars_vectors"]),
        metrics=metrics,
        artifacts=["neighbours.csv"],
        tables={"neighbours.json": table} if len(table) else {},
    )
