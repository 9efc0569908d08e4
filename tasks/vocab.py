"""Stage `vocab`: word and character vocabularies as BERT-style `vocab.txt` files plus frequency tables."""
from __future__ import annotations

from collections import Counter

import pandas as pd
from pydantic import Field, field_validator

from tasks.core import BuildContext, BuildOutput, Section

# what its key sees besides params, inputs and code (flows/fingerprint.py): the libraries that shape
# its output, and the params that name files (counted by content)
LIBRARIES = ("pandas",)
FILES: tuple[str, ...] = ()
KINDS = ("words", "chars")


class Params(Section):
    """The `vocab` section."""

    min_freq: int = Field(2, ge=1)
    max_size: int | None = Field(50000, ge=1)
    specials: list[str] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

    @field_validator("specials")
    @classmethod
    def _pad_unk_first(cls, v: list[str]) -> list[str]:
        if v[:2] != ["[PAD]", "[UNK]"]:
            raise ValueError("specials must start with [PAD], [UNK] (ids 0 and 1)")
        return v



def count_tokens(lines: pd.Series) -> Counter:
    """Token frequencies over space-joined token lines."""
    counts: Counter = Counter()
    for line in lines:
        counts.update(line.split())
    return counts


def build_vocab(counts: Counter, params: Params) -> list[str]:
    """Specials first, then tokens with freq >= min_freq by descending frequency (ties by token)."""
    ranked = sorted((t for t, c in counts.items() if c >= params.min_freq and t not in params.specials), key=lambda t: (-counts[t], t))
    if params.max_size is not None:
        ranked = ranked[: max(0, params.max_size - len(params.specials))]
    return list(params.specials) + ranked


def oov_rate(lines: pd.Series, vocab: set[str]) -> float:
    """Share of token occurrences not in the vocabulary."""
    total = unknown = 0
    for line in lines:
        tokens = line.split()
        total += len(tokens)
        unknown += sum(t not in vocab for t in tokens)
    return unknown / total if total else 0.0


def build(ctx: BuildContext) -> BuildOutput:
    """Write `words/vocab.txt`, `words/freq.tsv`, `chars/vocab.txt`, `chars/freq.tsv` from the train split."""
    train = pd.read_parquet(ctx.inputs["augment"] / "train.parquet", columns=list(KINDS))
    validation = pd.read_parquet(ctx.inputs["segment"] / "validation.parquet", columns=list(KINDS))
    metrics = {}
    for kind in KINDS:
        counts = count_tokens(train[kind])
        vocab = build_vocab(counts, ctx.params)
        folder = ctx.out / kind
        folder.mkdir()
        (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
        freq = pd.DataFrame(counts.most_common(), columns=["token", "count"])
        freq.to_csv(folder / "freq.tsv", sep="\t", index=False)
        metrics[f"{kind}_vocab_size"] = len(vocab)
        metrics[f"{kind}_types_seen"] = len(counts)
        metrics[f"{kind}_validation_oov_rate"] = oov_rate(validation[kind], set(vocab))
    return BuildOutput(
        rows=int(metrics["words_vocab_size"]),
        metrics=metrics,
        info=dict(ctx.input_info["augment"]),
        artifacts=["words/vocab.txt", "chars/vocab.txt", "words/freq.tsv", "chars/freq.tsv"],
    )
