"""Stage `download` (task translation): find or fetch and verify the file of sentence pairs, and
read it batch by batch into `data.parquet`: `id`, `line`, `text` (the Chinese side), `en` (the
English side) and `credit` (an attribution column, kept with the data when the corpus has one).
Tab-separated lines without a header (Tatoeba's `english<TAB>chinese<TAB>attribution`, named by
`download.columns`) or JSON lines (`{"zh", "en"}`, or any two fields named by `download.zh_field` /
`download.en_field`, such as `{"src", "tgt"}`). A line that cannot be read goes to
`quarantine.parquet` with its line number and reason."""

from __future__ import annotations

import logging
from collections import Counter

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Facts
from tasks.errors import DataError
from tasks.source.archives import ARCHIVES, extract
from tasks.source.fetch import FetchParams, locate
from tasks.source.readers import (
    HEAD_BYTES,
    QUARANTINE_COLUMNS,
    detect_encoding,
    empty_quarantine,
    jsonl_records,
    line_batches,
    no_rows,
)
from tasks.source.schema import Source
from tasks.util.io import ROW_GROUP_ROWS, PartWriter
from tasks.util.urls import redact

LIBRARIES = ("pandas", "pyarrow", "charset-normalizer")
FILES: tuple[str, ...] = ()
log = logging.getLogger("zhpipe")
COLUMNS = {"id": "int64", "line": "int64", "text": "string", "en": "string", "credit": "string"}


class Params(FetchParams):
    """The `download` section of a translation pipeline: the fetch settings and how a pair is
    read."""

    # the fields of a tab-separated line, in order (the file has no header)
    columns: list[str] = ["en", "zh", "credit"]
    # the field holding the Chinese side (tsv: a name in `columns`; jsonl: a key)
    zh_field: str = "zh"
    en_field: str = "en"
    credit_field: str | None = "credit"  # an attribution kept beside each pair; None = none


def pair_rows(
    lines: list[str], first_line: int, fmt: str, p: Params
) -> tuple[list[dict], list[dict]]:
    """(pairs as {line, text, en, credit}, quarantined {line, reason, raw}) of one batch of physical
    lines."""
    if fmt == "jsonl":  # the classification reader's JSON lines: the same reasons for a broken line
        parsed = jsonl_records(lines, first_line - 1)
        records, bad = list(zip(parsed.lines, parsed.rows)), list(parsed.bad)
    else:
        records, bad = [], []
        for n, line in enumerate(lines, first_line):
            if not line.strip():
                continue
            fields = line.split("\t")
            if not 2 <= len(fields) <= len(p.columns):
                bad.append(
                    {
                        "line": n,
                        "reason": f"fields_{len(fields)}_expected_{len(p.columns)}",
                        "raw": line[:500],
                    }
                )
                continue
            records.append((n, dict(zip(p.columns, fields))))
    rows = []
    for n, record in records:
        zh, en = record.get(p.zh_field), record.get(p.en_field)
        if not isinstance(zh, str) or not isinstance(en, str):
            missing = p.zh_field if not isinstance(zh, str) else p.en_field
            bad.append({"line": n, "reason": f"no_{missing}", "raw": lines[n - first_line][:500]})
            continue
        credit = record.get(p.credit_field) if p.credit_field else None
        rows.append(
            {"line": n, "text": zh, "en": en, "credit": credit if isinstance(credit, str) else None}
        )
    return rows, sorted(bad, key=lambda b: b["line"])


def pair_format(path, source: Source) -> str:
    fmt = (
        source.format
        if source.format != "auto"
        else {".jsonl": "jsonl", ".json": "jsonl"}.get(path.suffix.lower(), "tsv")
    )
    if fmt not in ("tsv", "jsonl"):
        raise DataError(
            f"{path}: task translation reads tab-separated pairs (tsv) or JSON lines (jsonl), not "
            f"{fmt} "
            f"(source.format)"
        )
    return fmt


def build(ctx: BuildContext) -> BuildOutput:
    """The source (`ctx.source`) into `data.parquet` (+ `quarantine.parquet`), one batch of lines at
    a time."""
    p: Params = ctx.params
    source: Source = ctx.source
    if p.zh_field not in p.columns and pair_format_of(source) == "tsv":
        raise DataError(
            f"download.zh_field {p.zh_field!r} is not one of download.columns {p.columns}"
        )
    raw, sha = locate(source, ctx.root, ctx.store.downloads, p, ctx.store.expect(source))
    data_file = (
        extract(raw, ctx.scratch / "extracted", source.member, p)
        if raw.name.lower().endswith(ARCHIVES)
        else raw
    )
    fmt = pair_format(data_file, source)
    if source.encoding == "auto":
        with open(data_file, "rb") as f:
            encoding = detect_encoding(f.read(HEAD_BYTES), data_file)
    else:
        encoding = source.encoding
    data = PartWriter(ctx.out / "data.parquet", ROW_GROUP_ROWS)
    bad = PartWriter(ctx.out / "quarantine.parquet", ROW_GROUP_ROWS)
    reasons: Counter = Counter()
    line = rows = 0
    for lines in line_batches(data_file, encoding):
        if line == 0 and lines:
            lines[0] = lines[0].removeprefix("\ufeff")
        good, wrong = pair_rows(lines, line + 1, fmt, p)
        line += len(lines)
        if good:
            frame = pd.DataFrame(good)
            frame.insert(0, "id", range(rows, rows + len(frame)))
            data.write(frame.astype(COLUMNS))
            rows += len(frame)
        if wrong:
            bad.write(pd.DataFrame(wrong).astype(QUARANTINE_COLUMNS))
            reasons.update(b["reason"] for b in wrong)
    if not rows:
        no_rows(data_file, dict(reasons))
    data.close()
    bad.close(empty_quarantine())
    if bad.rows:
        log.warning(
            "download: %d of %d lines quarantined (%s); see quarantine.parquet",
            bad.rows,
            rows + bad.rows,
            dict(reasons),
        )
    facts = Facts(
        source_sha256=sha,
        source_file=redact(str(raw) if raw.is_relative_to(ctx.root) else raw.name),
        labelled=False,
    )
    return BuildOutput(
        rows=rows,
        metrics={"rows_raw": rows, "rows_quarantined": bad.rows, "lines_physical": line},
        facts=facts,
    )


def pair_format_of(source: Source) -> str:
    path = source.path or source.url or ""
    return (
        "jsonl"
        if source.format == "jsonl"
        or (source.format == "auto" and path.lower().endswith((".jsonl", ".json")))
        else "tsv"
    )
