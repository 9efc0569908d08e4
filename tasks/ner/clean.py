"""Stage `clean` (task ner): a cleaning that never shifts a tag. Each character is normalised on its
own (NFKC full-width to half-width where it stays one character, traditional to simplified
likewise); control and zero-width characters are removed with their tags, the spans around them
kept; sentences that are empty or longer than `max_chars` are quarantined, and duplicates too when
the corpus has no given splits (a given test set is kept as published)."""

from __future__ import annotations

import unicodedata

import pandas as pd
from pydantic import Field

from tasks.core import BuildContext, BuildOutput, Dataset, Section
from tasks.errors import DataError
from tasks.ner.tagging import bioes, spans_of
from tasks.shared.normalise import CONTROL, to_simplified
from tasks.util.io import write_parquet

LIBRARIES = ("pandas", "pyarrow", "opencc")
FILES: tuple[str, ...] = ()


class Params(Section):
    """The `clean` section of task ner: each character normalised in place, so that its tag stays
    with it (nothing is stripped from a sentence: no HTML, URL or length-based cuts inside it)."""

    nfkc: bool = True  # full-width to half-width, where it gives one character
    traditional_to_simplified: bool = False  # OpenCC t2s, where it gives one character
    max_chars: int = Field(5000, ge=1)  # longer sentences are quarantined
    # repeated sentences (same text and tags) are quarantined, unless the corpus gives its splits
    dedupe: bool = True


def clean_char(char: str, params: Params) -> str:
    """One character normalised, or the character itself where normalising would make it more or
    less than one."""
    out = char
    if params.nfkc:
        n = unicodedata.normalize("NFKC", out)
        out = n if len(n) == 1 else out
    if params.traditional_to_simplified:
        s = to_simplified().convert(out)
        out = s if len(s) == 1 else out
    return out


def clean_chars(text: str, params: Params) -> tuple[str, list[int]]:
    """(the cleaned text, the position in `text` of each of its characters): control characters
    removed, every other character normalised in place. Tags and entity offsets map through the
    positions."""
    kept = [i for i, c in enumerate(text) if not CONTROL.fullmatch(c)]
    return "".join(clean_char(text[i], params) for i in kept), kept


def clean_sentence(text: str, tags: list[str], params: Params) -> tuple[str, list[str], int]:
    """(text, tags, entities lost): `clean_chars`, with each entity's span moved to the characters
    kept; an entity made only of removed characters is lost (and counted)."""
    cleaned, kept = clean_chars(text, params)
    if len(kept) == len(text):
        return cleaned, list(tags), 0
    keep, new_index, pos = set(kept), [], 0  # each original position's position in the cleaned text
    for i in range(len(text)):
        new_index.append(pos)
        pos += i in keep
    new_index.append(pos)
    spans, lost = [], 0
    for kind, start, end in spans_of(list(tags)):
        s, e = new_index[start], new_index[end]
        if e > s:
            spans.append((kind, s, e))
        else:
            lost += 1
    return cleaned, bioes(spans, len(cleaned)), lost


def build(ctx: BuildContext) -> BuildOutput:
    """`data.parquet` cleaned, `quarantine.parquet` with what was set aside and why."""
    p: Params = ctx.params
    df = pd.read_parquet(ctx.file("download", "data.parquet"))
    texts, tags, lost = [], [], 0
    for text, row_tags in zip(df["text"].astype(str), df["tags"]):
        t, g, n = clean_sentence(text, list(row_tags), p)
        texts.append(t)
        tags.append(g)
        lost += n
    df = df.assign(raw_text=df["text"], text=pd.Series(texts, dtype="string"), tags=tags)
    reason = pd.Series(pd.NA, index=df.index, dtype="string")
    reason[df["text"].str.strip().str.len() == 0] = "empty"
    reason[reason.isna() & (df["text"].str.len() > p.max_chars)] = "too_long"
    given = df["split"].notna().any()
    if p.dedupe and not given:
        key = df["text"] + "\x00" + pd.Series([" ".join(t) for t in df["tags"]], index=df.index)
        dup = key[reason.isna()].duplicated(keep="first")
        reason[dup[dup].index] = "duplicate"
    kept = df[reason.isna()].drop(columns=["raw_text"]).reset_index(drop=True)
    quarantine = df[reason.notna()].assign(reason=reason[reason.notna()]).reset_index(drop=True)
    if kept.empty:
        raise DataError(
            f"clean: no sentences left ({len(df)} in, all quarantined: "
            f"{quarantine['reason'].value_counts().to_dict()})"
        )
    write_parquet(kept, ctx.out / "data.parquet")
    write_parquet(quarantine, ctx.out / "quarantine.parquet")
    counts = quarantine["reason"].value_counts().to_dict()
    metrics = {f"dropped_{r}": counts.get(r, 0) for r in ("empty", "too_long", "duplicate")}
    metrics.update(
        rows_in=len(df),
        rows_kept=len(kept),
        rows_dropped=len(quarantine),
        entities_lost=lost,
        changed_characters=sum(
            a != b
            for x, y in zip(df["raw_text"].astype(str), texts)
            if len(x) == len(y)
            for a, b in zip(x, y)
        ),
    )
    return BuildOutput(
        rows=len(kept),
        metrics=metrics,
        artifacts=["quarantine.parquet"],
        tables={"quarantine_sample.json": quarantine.head(1000).astype(str)}
        if len(quarantine)
        else {},
        datasets=[
            Dataset(
                kept.drop(columns=["tags"]),
                str(ctx.out / "data.parquet"),
                f"{ctx.pipeline}-clean",
                "clean",
            )
        ],
    )
