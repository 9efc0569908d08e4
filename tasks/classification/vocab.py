"""Stage `vocab`: word and character vocabularies as BERT-style `vocab.txt` files plus frequency
tables."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Facts, gathered
from tasks.util.io import Rows
from tasks.util.text import VocabParams, build_vocab, prune_counts

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output, and the params that name files (counted by content)
LIBRARIES = ("pandas",)
FILES: tuple[str, ...] = ()
KINDS = ("words", "chars")


class Params(VocabParams):
    """The `vocab` section."""


def count_tokens(lines: pd.Series) -> Counter:
    """Token frequencies over space-joined token lines."""
    counts: Counter = Counter()
    for line in lines:
        counts.update(line.split())
    return counts


# each split counted, and the stage it is read from
SPLITS = (("train", "augment"), ("validation", "segment"))
# all it reads of them (`Stage.content`): a pipeline that differs from another only in its labels
# reuses its vocabularies
CONTENT = tuple((stage, f"{split}.parquet", KINDS) for split, stage in SPLITS)


def split_counts(ctx: BuildContext) -> tuple[dict[str, dict[str, Counter]], dict[str, bool], int]:
    """Each split's token counts per kind, read batch by batch (memory: the counts, each kind's
    table bounded by `max_types`); returns (counts, whether each kind's tables were pruned, train
    rows)."""
    counts = {split: {kind: Counter() for kind in KINDS} for split, _ in SPLITS}
    pruned, rows = dict.fromkeys(KINDS, False), 0
    for split, stage in SPLITS:
        for batch in Rows(ctx.file(stage, f"{split}.parquet")).batches(list(KINDS)):
            rows += len(batch) if split == "train" else 0
            for kind in KINDS:
                counts[split][kind].update(count_tokens(batch[kind]))
                pruned[kind] |= prune_counts(counts[split][kind], ctx.params.max_types)
    return counts, pruned, rows


def build(ctx: BuildContext) -> BuildOutput:
    """Write `words/vocab.txt`, `words/freq.tsv`, `chars/vocab.txt`, `chars/freq.tsv` from the train
    split."""
    counts, pruned, _ = split_counts(ctx)
    return write_vocab(ctx, counts["train"], counts["validation"], Facts(), pruned)


def count(ctx: BuildContext) -> BuildOutput:
    """A partition's unit: its train and validation token counts (`counts/<kind>.<split>.parquet`),
    which the stage merges (`gather`) instead of counting the whole corpus again each night."""
    (ctx.out / "counts").mkdir()
    counts, _, rows = split_counts(ctx)
    for split, kinds in counts.items():
        for kind, found in kinds.items():
            pd.DataFrame(
                {"token": list(found), "count": list(found.values())}, columns=["token", "count"]
            ).astype({"token": str, "count": "int64"}).to_parquet(
                ctx.out / "counts" / f"{kind}.{split}.parquet", index=False
            )
    return BuildOutput(rows=rows)


def gather(ctx: BuildContext) -> BuildOutput:
    """The vocabularies from the partitions' merged counts (memory: the distinct tokens, each kind's
    table bounded by `max_types` as the partitions are merged)."""
    merged: dict[str, dict[str, Counter]] = {
        split: {kind: Counter() for kind in KINDS} for split, _ in SPLITS
    }
    pruned = dict.fromkeys(KINDS, False)
    for folder in ctx.inputs.values():
        for split, kinds in merged.items():
            for kind, counts in kinds.items():
                frame = pd.read_parquet(folder / "counts" / f"{kind}.{split}.parquet")
                counts.update(dict(zip(frame["token"], frame["count"].astype(int))))
                pruned[kind] |= prune_counts(counts, ctx.params.max_types)
    return write_vocab(
        ctx, merged["train"], merged["validation"], gathered(list(ctx.facts.values())), pruned
    )


def write_vocab(
    ctx: BuildContext,
    train: dict[str, Counter],
    validation: dict[str, Counter],
    facts: Facts,
    pruned: dict[str, bool],
) -> BuildOutput:
    """Each kind's vocab.txt and freq.tsv from its train counts; its OOV rate from the validation
    counts; `<kind>_types_pruned` says whether counting dropped its rarest types (`max_types`)."""
    metrics = {f"{kind}_types_pruned": float(pruned[kind]) for kind in KINDS}
    for kind in KINDS:
        counts = train[kind]
        vocab = build_vocab(counts, ctx.params)
        folder = ctx.out / kind
        folder.mkdir()
        (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
        freq = pd.DataFrame(counts.most_common(), columns=["token", "count"])
        freq.to_csv(folder / "freq.tsv", sep="\t", index=False)
        metrics[f"{kind}_vocab_size"] = len(vocab)
        metrics[f"{kind}_types_seen"] = len(counts)
        known, seen = set(vocab), validation[kind]
        total = sum(seen.values())
        metrics[f"{kind}_validation_oov_rate"] = (
            sum(c for t, c in seen.items() if t not in known) / total if total else 0.0
        )
    return BuildOutput(
        rows=int(metrics["words_vocab_size"]),
        metrics=metrics,
        facts=facts,
        artifacts=["words/vocab.txt", "chars/vocab.txt", "words/freq.tsv", "chars/freq.tsv"],
    )
