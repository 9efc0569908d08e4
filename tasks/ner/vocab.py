"""Stage `vocab` (task ner): the character and bigram vocabularies of the train split, and the
lexicon the lexicon adapter and the CRF's lexicon features match against: jieba's dictionary words
that occur in the train text plus the corpus' own jieba words seen at least `lexicon.min_freq`
times."""

from __future__ import annotations

from collections import Counter

import pandas as pd
from pydantic import Field

from tasks.core import BuildContext, BuildOutput, Section
from tasks.ner.tagging import Lexicon, bigrams, spans_of
from tasks.util.text import VocabParams, build_vocab

LIBRARIES = ("pandas", "jieba")
FILES: tuple[str, ...] = ()


class LexiconParams(Section):
    """The lexicon of words that the lexicon adapter and the CRF's lexicon features match."""

    dictionary: bool = True  # jieba's dictionary words that occur in the train text
    min_freq: int = Field(2, ge=1)  # and the corpus' own jieba words seen this often
    max_len: int = Field(6, ge=2)  # longest word, in characters


class Params(VocabParams):
    """The `vocab` section of a ner pipeline."""

    lexicon: LexiconParams = LexiconParams()


def dictionary_words(texts: list[str], max_len: int) -> set[str]:
    """jieba's dictionary words of 2..max_len characters that occur in the texts."""
    from tasks.util.segmenter import _jieba

    jieba = _jieba()  # its cache in a folder of our own
    jieba.dt.check_initialized()
    freq, found = jieba.dt.FREQ, set()
    # looked up one substring at a time: no set of every substring of a large corpus
    for t in texts:
        for n in range(2, max_len + 1):
            for i in range(len(t) - n + 1):
                w = t[i : i + n]
                if freq.get(w):
                    found.add(w)
    return found


def boundary_recall(texts: list[str], tags: list[list[str]], lexicon: Lexicon) -> float:
    """Share of multi-character entities that are a lexicon word themselves (how much the lexicon
    can tell)."""
    hit = total = 0
    for text, row in zip(texts, tags):
        for _, start, end in spans_of(list(row)):
            if end - start > 1:
                total += 1
                hit += text[start:end] in lexicon.index
    return hit / total if total else 0.0


def build(ctx: BuildContext) -> BuildOutput:
    """Write `chars/vocab.txt`, `bigrams/vocab.txt`, `lexicon/words.txt` and their frequency
    tables."""
    p: Params = ctx.params
    train = pd.read_parquet(ctx.file("augment", "train.parquet"), columns=["text", "words"])
    validation = pd.read_parquet(
        ctx.file("segment", "validation.parquet"), columns=["text", "tags"]
    )
    texts = train["text"].astype(str).tolist()
    counts = {
        "chars": Counter(c for t in texts for c in t),
        "bigrams": Counter(b for t in texts for b in bigrams(t)[0]),
    }
    # every character seen: rare ones are often names
    char_params = p.model_copy(update={"min_freq": 1, "max_size": None})
    metrics = {}
    for kind, counter in counts.items():
        vocab = build_vocab(counter, char_params if kind == "chars" else p)
        (ctx.out / kind).mkdir()
        (ctx.out / kind / "vocab.txt").write_text(
            "".join(f"{t}\n" for t in vocab), encoding="utf-8"
        )
        pd.DataFrame(counter.most_common(), columns=["token", "count"]).to_csv(
            ctx.out / kind / "freq.tsv", sep="\t", index=False
        )
        metrics[f"{kind}_vocab_size"] = len(vocab)
        seen = set(vocab)
        val = [c for t in validation["text"] for c in (t if kind == "chars" else bigrams(t)[0])]
        metrics[f"{kind}_validation_oov_rate"] = sum(c not in seen for c in val) / max(len(val), 1)
    words = Counter(w for line in train["words"] for w in line.split() if len(w) > 1)
    corpus = {
        w for w, c in words.items() if c >= p.lexicon.min_freq and len(w) <= p.lexicon.max_len
    }
    dictionary = dictionary_words(texts, p.lexicon.max_len) if p.lexicon.dictionary else set()
    lexicon = sorted(corpus | dictionary, key=lambda w: (-words.get(w, 0), w))
    (ctx.out / "lexicon").mkdir()
    (ctx.out / "lexicon" / "words.txt").write_text(
        "".join(f"{w}\n" for w in lexicon), encoding="utf-8"
    )
    metrics.update(
        lexicon_size=len(lexicon),
        lexicon_from_dictionary=len(dictionary),
        lexicon_from_corpus=len(corpus),
        lexicon_validation_entity_recall=boundary_recall(
            validation["text"].tolist(), validation["tags"].tolist(), Lexicon(lexicon)
        ),
    )
    return BuildOutput(
        rows=len(lexicon),
        metrics=metrics,
        artifacts=["chars/vocab.txt", "bigrams/vocab.txt", "lexicon/words.txt"],
    )
