"""Reading a corpus file batch by batch: its encoding detected (UTF-8, UTF-16, GB18030), physical
lines, CSV/TSV records that a stray quote cannot swallow, JSON lines, Parquet and plain text, with
every row that cannot be read set aside with its line number and reason."""

from __future__ import annotations

import codecs
import csv
import errno
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tasks.errors import DataError
from tasks.source.schema import Source, range_blocks
from tasks.util.private import open_within

DATA_SUFFIXES = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".txt": "txt",
}


def detect_encoding(raw: bytes, where: Path | str = "the file") -> str:
    """utf-8-sig, utf-8 or gb18030 (a superset of GBK and GB2312), else charset-normalizer's guess.
    `raw` may be the head of a file (`where`, named in the error): a multi-byte character cut at its
    end does not count against utf-8."""
    if raw.startswith(b"\xef\xbb\xbf"):
        return "utf-8-sig"
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    for encoding in ("utf-8", "gb18030"):
        try:
            codecs.getincrementaldecoder(encoding)().decode(raw, final=False)
            return encoding
        except UnicodeDecodeError:
            pass
    from charset_normalizer import from_bytes

    best = from_bytes(raw[:1_000_000]).best()
    if best is None:
        raise DataError(
            f"{where}: cannot detect the text encoding (tried utf-8, gb18030; is it a mix of "
            "encodings?); "
            f"set source.encoding"
        )
    return best.encoding


def physical_lines(text: str) -> list[str]:
    """Lines split on \\n (and \\r\\n) only: U+2028, U+0085 and \\x1c-\\x1e are characters inside a
    line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


HEAD_BYTES = 4 << 20  # the encoding is detected from the file's first 4 MiB


BATCH_CHARS = 1 << 20  # a file is read, parsed and written about 1 M characters at a time


# a CSV record spanning more characters than this is a stray quote's doing
MAX_RECORD_CHARS = 16 << 20


def _opened(path: Path):
    """A corpus file opened for reading, never through a link another user made (`open_within`): one
    line naming it."""
    try:
        return open_within(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DataError(f"{path}: {e.strerror}; it is not read") from None
        raise


def line_batches(path: Path, encoding: str, batch_chars: int | None = None) -> Iterator[list[str]]:
    """The file's physical lines (split on \\n only, \\r\\n's \\r dropped, a leading BOM dropped),
    in batches of about `batch_chars` characters: the file is decoded as it is read, never held
    whole."""
    with _opened(path) as raw, io.TextIOWrapper(raw, encoding=encoding, newline="\n") as f:
        first = True
        read = 0
        try:
            while batch := f.readlines(batch_chars or BATCH_CHARS):
                if first and batch[0].startswith("\ufeff"):
                    batch[0] = batch[0][1:]
                first = False
                read += len(batch)
                yield [
                    line[:-2]
                    if line.endswith("\r\n")
                    else line[:-1]
                    if line.endswith("\n")
                    else line
                    for line in batch
                ]
        except UnicodeDecodeError as e:
            raise DataError(
                f"{path}: cannot decode as {encoding} after line {read}: {e.reason} "
                "(set source.encoding if the encoding was guessed from the file's head)"
            ) from None


@dataclass
class Parsed:
    """Rows read from (part of) a file, and the rows that could not be read, with their line
    numbers."""

    rows: list[dict]
    lines: list[int]  # the physical line each row starts on
    bad: list[dict]  # {line, reason, raw}
    physical: int  # physical lines read


def csv_records(
    lines: list[str], sep: str, width: int, offset: int, final: bool
) -> tuple[Parsed, int]:
    """Rows of CSV/TSV physical lines, by a header `width` fields wide; `offset` is the line number
    of `lines[0]` minus one. A row with the wrong number of fields, or a quote that swallows the
    lines after it, is quarantined with its line number instead of shifting or merging other rows.
    Unless `final`, the last record may go on in the next batch: it is left unread, and the number
    of lines used is returned."""
    # a long text is the clean stage's to judge (clean.max_chars), not the reader's
    csv.field_size_limit(1 << 30)
    rows, starts, bad = [], [], []

    def parse(first: int, last: int) -> list[tuple[int, int, list[str]]]:
        """Records of lines [first, last) as (start line, end line, fields), 0-based."""
        reader = csv.reader(
            io.StringIO("\n".join(lines[first:last]) + "\n", newline=""), delimiter=sep
        )
        out, start = [], first
        for fields in reader:
            end = first + reader.line_num
            out.append((start, end, fields))
            start = end
        return out

    def swallowed(start: int, end: int) -> bool:
        """A multi-line record whose inner lines read as whole rows: a stray quote, not a quoted
        newline."""
        inner = [next(csv.reader([ln], delimiter=sep), []) for ln in lines[start + 1 : end]]
        return sum(len(f) == width for f in inner) >= max(1, len(inner) // 2)

    records = parse(0, len(lines))
    used = len(lines)
    # the last record may be cut by the batch's end: it is read again with the next batch, unless it
    # is already longer than any record can be (a stray quote's doing, judged here)
    if not final and records and sum(map(len, lines[records[-1][0] :])) <= MAX_RECORD_CHARS:
        used = records[-1][0]
        records.pop()
    pending = [records]
    while pending:
        for start, end, fields in pending.pop():
            if end - start > 1 and swallowed(start, end):
                bad.append(
                    {"line": offset + start + 1, "reason": "stray_quote", "raw": lines[start][:500]}
                )
                pending.append(parse(start + 1, end))
                continue
            if (not fields or fields == [""]) and not "".join(lines[start:end]).strip():
                continue  # a blank line is not a row
            if len(fields) != width:
                bad.append(
                    {
                        "line": offset + start + 1,
                        "reason": f"fields_{len(fields)}_expected_{width}",
                        "raw": sep.join(fields)[:500],
                    }
                )
                continue
            rows.append(fields)
            starts.append(offset + start + 1)
    order = sorted(range(len(rows)), key=starts.__getitem__)
    return Parsed(
        [rows[i] for i in order],
        [starts[i] for i in order],
        sorted(bad, key=lambda b: b["line"]),
        used,
    ), used


def jsonl_records(lines: list[str], offset: int) -> Parsed:
    """Objects of JSON lines; `offset` is the line number of `lines[0]` minus one."""
    rows, starts, bad = [], [], []
    for i, line in enumerate(lines, offset + 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            bad.append(
                {"line": i, "reason": f"invalid_json: {str(e).split(':')[0]}", "raw": line[:500]}
            )
            continue
        if not isinstance(row, dict):
            bad.append({"line": i, "reason": "not_an_object", "raw": line[:500]})
            continue
        rows.append(row)
        starts.append(i)
    return Parsed(rows, starts, bad, len(lines))


def parsed_batches(path: Path, source: Source, fmt: str) -> Iterator[Parsed]:
    """The file's rows, batch by batch (each a `Parsed` of dicts), streamed: memory is one batch,
    not the file."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        line = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=50_000):
            rows = batch.to_pylist()
            yield Parsed(rows, list(range(line + 1, line + len(rows) + 1)), [], len(rows))
            line += len(rows)
        return
    if source.encoding == "auto":
        with _opened(path) as f:
            encoding = detect_encoding(f.read(HEAD_BYTES), path)
    else:
        encoding = source.encoding
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise DataError(f"{path}: unknown encoding {encoding!r} (source.encoding)") from None
    batches = line_batches(path, encoding)
    offset = 0  # lines before the current batch
    if fmt == "jsonl" or fmt == "txt":
        for lines in batches:
            if fmt == "jsonl":
                yield jsonl_records(lines, offset)
            else:
                kept = [(i, ln) for i, ln in enumerate(lines, offset + 1) if ln.strip()]
                yield Parsed(
                    [{source.text_column: ln} for _, ln in kept],
                    [i for i, _ in kept],
                    [],
                    len(lines),
                )
            offset += len(lines)
        return
    sep = "," if fmt == "csv" else "\t"
    header, carry = None, []
    for lines in batches:
        new = len(lines)  # physical lines read in this batch (the header's included)
        if header is None:
            header = next(csv.reader([lines[0]], delimiter=sep), [])
            lines, offset = lines[1:], 1
        lines = carry + lines
        parsed, used = csv_records(lines, sep, len(header), offset, final=False)
        carry, offset = lines[used:], offset + used
        yield Parsed([dict(zip(header, r)) for r in parsed.rows], parsed.lines, parsed.bad, new)
    if header is not None and carry:
        parsed, _ = csv_records(carry, sep, len(header), offset, final=True)
        yield Parsed([dict(zip(header, r)) for r in parsed.rows], parsed.lines, parsed.bad, 0)


def read_batches(path: Path, source: Source) -> Iterator[tuple[pd.DataFrame, pd.DataFrame, int]]:
    """Read csv/tsv/jsonl/parquet/txt in batches of (rows with `id`, `line`, `text` and `label` when
    labelled, quarantined rows with `line`, `reason`, `raw`, physical lines read); ids count on
    across batches."""
    fmt = file_format(path, source)
    first_id = 0
    try:
        for parsed in parsed_batches(path, source, fmt):
            df, quarantine = _normalise(parsed, path, source, fmt, first_id)
            first_id += len(df)
            yield df, quarantine, parsed.physical
    except (ValueError, OSError, csv.Error) as e:
        raise DataError(f"{path}: unreadable {fmt}: {str(e).splitlines()[0]}") from e


def file_format(path: Path, source: Source) -> str:
    fmt = source.format if source.format != "auto" else DATA_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise DataError(
            f"{path}: cannot tell the format from suffix '{path.suffix}'; set source.format (csv, "
            "tsv, "
            f"jsonl, parquet, txt)"
        )
    return fmt


def no_rows(path: Path, reasons: dict[str, int]) -> None:
    detail = f"; {sum(reasons.values())} rows quarantined: {reasons}" if reasons else ""
    raise DataError(f"{path}: the corpus has no readable rows{detail}")


def labelled(source: Source, fmt: str) -> bool:
    return bool(source.label_column) and fmt != "txt"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


QUARANTINE_COLUMNS = {"line": "int64", "reason": "string", "raw": "string"}


def empty_quarantine() -> pd.DataFrame:
    return pd.DataFrame(columns=list(QUARANTINE_COLUMNS)).astype(QUARANTINE_COLUMNS)


def _normalise(
    parsed: Parsed, path: Path, source: Source, fmt: str, first_id: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    columns = set().union(*(r.keys() for r in parsed.rows[:1000])) if parsed.rows else set()
    if parsed.rows and source.text_column not in columns:
        raise DataError(
            f"{path}: no text column '{source.text_column}' (columns found: "
            f"{', '.join(map(str, sorted(columns)))}); set source.text_column, or "
            f"--text-column with --source"
        )
    with_labels = labelled(source, fmt)
    if parsed.rows and with_labels and source.label_column not in columns:
        raise DataError(
            f"{path}: no label column '{source.label_column}' (columns found: "
            f"{', '.join(map(str, sorted(columns)))})"
        )
    ids, lines, texts, labels, bad = [], [], [], [], list(parsed.bad)
    for row, line in zip(parsed.rows, parsed.lines):
        text = row.get(source.text_column)
        label = row.get(source.label_column) if with_labels else None
        reason = None
        if _missing(text):
            reason = "missing_text"
        elif with_labels and (_missing(label) or not str(label).strip()):
            reason = "empty_label"
        if reason:
            bad.append(
                {
                    "line": line,
                    "reason": reason,
                    "raw": json.dumps(row, ensure_ascii=False, default=str)[:500],
                }
            )
            continue
        ids.append(first_id + len(ids))
        lines.append(line)
        texts.append(str(text))
        if with_labels:
            labels.append(str(label).strip())
    out = pd.DataFrame(
        {
            "id": pd.Series(ids, dtype="int64"),
            "line": pd.Series(lines, dtype="int64"),
            "text": pd.Series(texts, dtype="string"),
        }
    )
    if with_labels:
        out["label"] = pd.Series(labels, dtype="string")
    quarantine = pd.DataFrame(
        sorted(bad, key=lambda b: b["line"]), columns=list(QUARANTINE_COLUMNS)
    ).astype(QUARANTINE_COLUMNS)
    return out, quarantine


def range_file(source: Source, path: Path, scratch: Path) -> Path:
    """An appended file's partition as a file of its own: the header line (CSV and TSV) and its byte
    range."""
    start, end = source.byte_range
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / f"part-{start}-{end}{path.suffix}"
    with open(path, "rb") as src, open(out, "wb") as dst:
        if start and file_format(path, source) in ("csv", "tsv"):
            dst.write(src.readline())
        for block in range_blocks(src, start, end):
            dst.write(block)
    return out
