"""Stage `download` (task ner): find or fetch and verify the tagged corpus, one file or given
train/validation/test files, read CoNLL-style `token TAG` lines (BIO, BIOES or BMES) or JSONL with
spans into `data.parquet`: `id`, `line`, `text`, BIOES `tags` per character and the given `split`.
Malformed sentences go to `quarantine.parquet` with their file, line and reason."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Facts
from tasks.errors import DataError
from tasks.ner.tagging import TaggedFile, parse_conll, parse_span_jsonl, spans_of
from tasks.source.archives import ARCHIVES, extract
from tasks.source.fetch import FetchParams, locate
from tasks.source.readers import detect_encoding, physical_lines
from tasks.source.schema import Source
from tasks.util.io import write_parquet
from tasks.util.urls import redact

LIBRARIES = ("pandas", "pyarrow", "charset-normalizer")
FILES: tuple[str, ...] = ()


class Params(FetchParams):
    """The `download` section of a ner pipeline: how a remote corpus is fetched and unpacked."""


log = logging.getLogger("zhpipe")


def read_tagged(path: Path, source: Source) -> TaggedFile:
    """A tagged file: JSONL with spans (`.jsonl`/`.json`, or format jsonl), else CoNLL-style
    lines."""
    fmt = (
        source.format
        if source.format != "auto"
        else ("jsonl" if path.suffix.lower() in (".jsonl", ".json") else "conll")
    )
    if fmt not in ("conll", "jsonl"):
        raise DataError(
            f"{path}: task ner reads conll (`token TAG` lines) or jsonl with spans, not {fmt}"
        )
    raw = path.read_bytes()
    encoding = detect_encoding(raw, path) if source.encoding == "auto" else source.encoding
    try:
        text = raw.decode(encoding)
    except (UnicodeDecodeError, LookupError) as e:
        raise DataError(f"{path}: cannot decode as {encoding}: {e}") from None
    lines = physical_lines(text.removeprefix("\ufeff"))
    return (
        parse_span_jsonl(lines, source.text_column)
        if fmt == "jsonl"
        else parse_conll(lines, source.tag_scheme)
    )


def build(ctx: BuildContext) -> BuildOutput:
    """Every file of the source (`ctx.source`) into one `data.parquet` (+ `quarantine.parquet`)."""
    p: Params = ctx.params
    source: Source = ctx.source
    frames, bad, shas, schemes = [], [], {}, {}
    for split, src in source.given().items():
        raw, sha = locate(src, ctx.root, ctx.store.downloads, p, ctx.store.expect(src))
        data_file = (
            extract(raw, ctx.scratch / "extracted" / (split or "all"), src.member, p)
            if raw.name.lower().endswith(ARCHIVES)
            else raw
        )
        tagged = read_tagged(data_file, src)
        name = redact(str(raw.relative_to(ctx.root)) if raw.is_relative_to(ctx.root) else raw.name)
        shas[split or "all"], schemes[split or "all"] = sha, tagged.scheme
        frames.append(
            pd.DataFrame(
                {
                    "line": pd.Series([s.line for s in tagged.sentences], dtype="int64"),
                    "text": pd.Series([s.text for s in tagged.sentences], dtype="string"),
                    "tags": [s.tags for s in tagged.sentences],
                    "split": pd.Series([split or None] * len(tagged.sentences), dtype="string"),
                    "file": pd.Series([name] * len(tagged.sentences), dtype="string"),
                }
            )
        )
        bad += [{**b, "file": name} for b in tagged.bad]
    df = pd.concat(frames, ignore_index=True)
    df.insert(0, "id", pd.Series(range(len(df)), dtype="int64"))
    quarantine = pd.DataFrame(bad, columns=["file", "line", "reason", "raw"]).astype(
        {"file": "string", "line": "int64", "reason": "string", "raw": "string"}
    )
    if df.empty:
        raise DataError(
            f"{source.path or source.url}: no readable sentences ({len(quarantine)} quarantined"
            + (f", first: line {bad[0]['line']}: {bad[0]['reason']}" if bad else "")
            + ")"
        )
    write_parquet(df, ctx.out / "data.parquet")
    write_parquet(quarantine, ctx.out / "quarantine.parquet")
    if len(quarantine):
        first = quarantine.iloc[0]
        log.warning(
            "download: %d sentences quarantined, first in %s line %d (%s); see quarantine.parquet",
            len(quarantine),
            first["file"],
            first["line"],
            first["reason"],
        )
    entities = [k for tags in df["tags"] for k, _, _ in spans_of(list(tags))]
    kinds = sorted(set(entities))
    if not kinds:
        raise DataError(
            f"{source.path or source.url}: {len(df)} sentences but no entity in their tags (task "
            "ner needs "
            f"tagged entities)"
        )
    facts = Facts(
        source_sha256=" ".join(f"{k}={v}" for k, v in shas.items())
        if len(shas) > 1
        else next(iter(shas.values())),
        labels=kinds,
        own={"tag_scheme": schemes, "given_splits": sorted(k for k in shas if k != "all")},
    )
    metrics = {
        "rows_raw": len(df),
        "rows_quarantined": len(quarantine),
        "entities": len(entities),
        "num_labels": len(kinds),
        "characters": int(df["text"].str.len().sum()),
    }
    return BuildOutput(
        rows=len(df),
        metrics=metrics,
        facts=facts,
        tables={"quarantine_sample.json": quarantine.head(1000).astype(str)}
        if len(quarantine)
        else {},
    )
