"""Stage `vocab`: word and character vocabularies as BERT-style `vocab.txt` files plus frequency tables."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.config import VocabConfig
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult

VERSION = "1"
KINDS = ("words", "chars")


def count_tokens(lines: pd.Series) -> Counter:
    """Token frequencies over space-joined token lines."""
    counts: Counter = Counter()
    for line in lines:
        counts.update(line.split())
    return counts


def build_vocab(counts: Counter, params: VocabConfig) -> list[str]:
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


def read_vocab(path: Path) -> list[str]:
    """Tokens of a `vocab.txt`, id = line number."""
    return path.read_text(encoding="utf-8").split("\n")[:-1]


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


@task(name="vocab", cache_policy=NO_CACHE)
def vocab(run: RunContext, augment: StageResult, segment: StageResult) -> StageResult:
    """Word and character vocabularies from the (augmented) train split."""
    return run.run("vocab", {"augment": augment, "segment": segment}, build)
