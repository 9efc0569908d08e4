"""Stage `vocab` (task translation): the Chinese (`zh/vocab.txt`, characters or jieba words) and
English (`en/vocab.txt`) vocabularies of the train split, with frequency tables and the validation
OOV rate of each; `vocab.json` says which Chinese tokens the translators read."""

from __future__ import annotations

import json
from collections import Counter
from typing import Literal

import pandas as pd

from tasks.core import BuildContext, BuildOutput
from tasks.translation.text import side_tokens
from tasks.util.text import VocabParams, build_vocab

LIBRARIES = ("pandas",)
FILES: tuple[str, ...] = ()


class Params(VocabParams):
    """The `vocab` section of a translation pipeline."""

    # the Chinese side as characters or as jieba words (segment stage)
    zh_tokens: Literal["chars", "words"] = "chars"
    min_freq: int = 2
    max_size: int | None = 30000


def build(ctx: BuildContext) -> BuildOutput:
    p: Params = ctx.params
    train = pd.read_parquet(
        ctx.file("augment", "train.parquet"), columns=["text", "en", "words", "chars"]
    )
    validation = pd.read_parquet(
        ctx.file("segment", "validation.parquet"), columns=["text", "en", "words", "chars"]
    )
    metrics = {}
    for lang in ("zh", "en"):
        counts = Counter(t for row in side_tokens(train, lang, p.zh_tokens) for t in row)
        itos = build_vocab(counts, p)
        (ctx.out / lang).mkdir()
        (ctx.out / lang / "vocab.txt").write_text("".join(f"{t}\n" for t in itos), encoding="utf-8")
        pd.DataFrame(counts.most_common(), columns=["token", "count"]).to_csv(
            ctx.out / lang / "freq.tsv", sep="\t", index=False
        )
        seen = set(itos)
        held = [t for row in side_tokens(validation, lang, p.zh_tokens) for t in row]
        metrics |= {
            f"{lang}_vocab_size": len(itos),
            f"{lang}_validation_oov_rate": sum(t not in seen for t in held) / max(len(held), 1),
        }
    (ctx.out / "vocab.json").write_text(json.dumps({"zh_tokens": p.zh_tokens}), encoding="utf-8")
    return BuildOutput(rows=None, metrics=metrics, artifacts=["zh/vocab.txt", "en/vocab.txt"])
