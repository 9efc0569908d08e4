"""Where a corpus comes from (the pipeline's `source`): its location, checksum, format and columns,
the partitions of a folder, glob or appended file, and how a location is told local or remote."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tasks.core import Section
from tasks.errors import DataError
from tasks.util.io import file_sha256, resolve_path
from tasks.util.private import foreign_link
from tasks.util.urls import redact


def _sha256_hex(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"sha256: expected 64 hex digits, got {len(value)} characters")
    return value


class GivenSplit(Section):
    """A validation or test file that comes with the corpus (`source.splits`), read like the
    source."""

    path: str | None = None
    url: str | None = None
    sha256: str | None = None

    _hex = field_validator("sha256")(_sha256_hex)

    @model_validator(mode="after")
    def _has_location(self) -> GivenSplit:
        if not self.path and not self.url:
            raise ValueError("a given split needs `path` or `url`")
        return self


class Source(Section):
    """Where the corpus comes from and how to read it (the pipeline's `source`)."""

    path: str | None = None  # local file (relative to the project root) or file:// / http(s):// URL
    url: str | None = None  # canonical URL, fetched only when `path` does not exist
    sha256: str | None = None  # verified whenever given; a mismatch is an error
    # fetch an http(s) source without a sha256, keyed by ETag/Last-Modified/size
    allow_unverified: bool = False
    # conll: `token TAG` lines, a blank line between sentences (task ner); jsonl holds spans for
    # task ner
    format: Literal["auto", "csv", "tsv", "jsonl", "parquet", "txt", "conll"] = "auto"
    encoding: str = "auto"  # auto detects utf-8, utf-8-sig and GB18030/GBK
    text_column: str = "text"
    label_column: str | None = "label"  # None for unlabelled corpora (txt)
    member: str | None = None  # file inside a .zip or tar archive; default: its only data file
    # task ner, conll: auto = detected from the tags
    tag_scheme: Literal["auto", "bio", "bioes", "bmes"] = "auto"
    # task ner: validation and test files that come with the corpus (`path` is then the train file);
    # the split stage keeps them as they are (split.use_given)
    splits: dict[Literal["validation", "test"], GivenSplit] = {}
    # append: the file only grows at its end (a log of reviews): the lines each run finds past the
    # last run's end are a partition of their own, and a change before that end is an error. no: any
    # change is a new corpus snapshot: the file (or the newest file of a glob) is a full export each
    # night: the rows no earlier export had are a partition of their own (flows/plan/snapshots.py),
    # so old rows are not cleaned or segmented again
    grows: Literal["no", "append", "snapshot"] = "no"
    # a folder or glob source: a file the last run read and this one does not find is a warning (its
    # rows leave the corpus), or with `error` the run stops. A policy, not part of any output: not
    # in the keys
    missing_partitions: Literal["warn", "error"] = Field("warn", exclude=True)
    # a partition of an appended file: the bytes [start, end) it holds (set by zhpipe, not in
    # pipelines.yaml)
    byte_range: tuple[int, int] | None = Field(None, exclude=False)

    def given(self) -> dict[str, Source]:
        """The source's files by split: {"train": ..., "validation": ..., "test": ...} with given
        splits, else {"": the source}."""
        if not self.splits:
            return {"": self}
        parts = {"train": self.model_copy(update={"splits": {}})}
        for name, split in self.splits.items():
            parts[name] = self.model_copy(
                update={"path": split.path, "url": split.url, "sha256": split.sha256, "splits": {}}
            )
        return parts

    @model_validator(mode="after")
    def _has_location(self) -> Source:
        if not self.path and not self.url:
            raise ValueError("source needs `path` or `url`")
        if self.partitioned and (self.sha256 or self.url or self.splits):
            raise ValueError(
                "source.path is a folder or glob, or grows by appends (a partition per file or per "
                "append): it takes no sha256, url or splits (each partition is keyed by its own "
                "sha256)"
            )
        if (
            self.grows == "append"
            and self.path
            and (any(c in self.path for c in "*?[") or self.path.endswith("/"))
        ):
            raise ValueError(
                "source.grows: append is for one file that grows; a folder or glob is "
                "partitioned by file already"
            )
        return self

    @property
    def partitioned(self) -> bool:
        """A source of many parts: `path` is a glob (`data/raw/reviews/*.csv`) or ends in `/` (a
        folder), or one file that grows by appends (`grows: append`)."""
        if self.byte_range is not None or not self.path or "://" in self.path:
            return False
        return (
            any(c in self.path for c in "*?[")
            or self.path.endswith("/")
            or self.grows in ("append", "snapshot")
        )

    def partitions(self, root: Path, appended: list[dict] | None = None) -> list[Partition]:
        """Each partition of a partitioned source: its files sorted by name (a corpus that grows by
        one file a day names its files so that new ones sort last, `2026-12-01.csv`); for an
        appended file, the byte ranges of earlier runs (`appended`, checked against the file) and
        the new complete lines after them."""
        base = Path(self.path).expanduser()
        base = base if base.is_absolute() else root / base
        if self.grows == "append":
            return append_partitions(base, appended or [])
        files = sorted(
            p
            for p in (base.glob("*") if self.path.endswith("/") else base.parent.glob(base.name))
            if p.is_file() and not p.name.startswith(".")
        )
        if not files:
            raise DataError(
                f"source.path {self.path}: no files match (expected one file per partition, e.g. "
                f"data/raw/reviews/*.csv)"
            )
        for p in files:
            if why := foreign_link(p, p.parent):
                raise DataError(
                    f"source.path {self.path}: {p.name} is {why}; it is not read (remove the link, "
                    "or "
                    f"copy the file in)"
                )
            if not p.name.isprintable():
                raise DataError(
                    f"source.path {self.path}: the file name {p.name!r} holds a line break or "
                    "control "
                    f"character; rename it (a partition's name appears in logs and reports)"
                )
        return [Partition(p.name, p) for p in files]

    def partition(self, part: Partition, shown: Path) -> Source:
        """The source of one partition: this source with `path` set to its file (shown as `shown`)
        and, for an append, its byte range."""
        return self.model_copy(
            update={"path": str(shown), "grows": "no", "byte_range": part.byte_range}
        )

    _hex = field_validator("sha256")(_sha256_hex)


@dataclass
class Partition:
    """One part of a partitioned source: a file, or a byte range of an appended file."""

    name: str  # the unit's suffix (`segment:<name>`) and what `repeats` names
    path: Path
    byte_range: tuple[int, int] | None = None
    digest: str | None = None  # the range's sha256 (a file's is computed when asked)
    # a snapshot's new version: the export it was found in (recorded when a run starts)
    export_sha256: str | None = None

    def fingerprint(self) -> str:
        if self.digest is None:
            self.digest = file_sha256(self.path)
        return self.digest


def append_partitions(path: Path, appended: list[dict]) -> list[Partition]:
    """The partitions of a file that grows at its end: each earlier run's range (checked: a byte
    changed before the last run's end is an error) and the complete lines after it, if any, as a new
    one."""
    if not path.is_file():
        raise DataError(f"source not found: {path} (no such file)")
    size, parts, start = path.stat().st_size, [], 0
    with open(path, "rb") as f:
        for i, seen in enumerate(appended):
            end = int(seen["end"])
            if end > size:
                raise DataError(
                    f"{path}: the file is shorter ({size} bytes) than at an earlier run ({end} "
                    "bytes); "
                    f"source.grows: append takes a file that only grows"
                )
            digest = _range_sha256(f, start, end)
            if digest != seen["sha256"]:
                raise DataError(
                    f"{path}: bytes {start}-{end} differ from an earlier run's; source.grows: "
                    "append takes "
                    f"a file that only grows at its end (set grows: no to read it as a new corpus)"
                )
            parts.append(Partition(f"{path.name}@{i:04d}", path, (start, end), digest))
            start = end
        if size > start:
            f.seek(start)
            tail = f.read(size - start)
            # complete lines only: a line being written waits for the next run
            cut = tail.rfind(b"\n") + 1
            if cut:
                parts.append(
                    Partition(
                        f"{path.name}@{len(parts):04d}",
                        path,
                        (start, start + cut),
                        hashlib.sha256(tail[:cut]).hexdigest(),
                    )
                )
    if not parts:
        raise DataError(f"{path}: no complete line to read")
    return parts


def range_blocks(f, start: int, end: int):
    """The bytes [start, end) of an open file, a megabyte at a time."""
    f.seek(start)
    left = end - start
    while left > 0:
        block = f.read(min(left, 1 << 20))
        if not block:
            break
        yield block
        left -= len(block)


def _range_sha256(f, start: int, end: int) -> str:
    h = hashlib.sha256()
    for block in range_blocks(f, start, end):
        h.update(block)
    return h.hexdigest()


def where(source: Source, root: Path) -> tuple[Path | None, str | None]:
    """(the local file holding the source, None) when `path` or `url` names an existing file, else
    (None, the http(s) URL to fetch it from); (None, None) when there is neither."""
    for location in (source.path, source.url):
        if not location:
            continue
        local = resolve_path(location, root)
        if local is None:
            return None, location
        if local.is_file():
            return local, None
    return None, None


def fetched_location(source: Source, root: Path) -> str | None:
    """The http(s) URL the source would be fetched from, or None when it is a local file."""
    return where(source, root)[1]


def require_verifiable(source: Source, root: Path) -> str | None:
    """The URL to fetch; refuse an http(s) source without a sha256 unless `allow_unverified` is
    set."""
    url = fetched_location(source, root)
    if url and not source.sha256 and not source.allow_unverified:
        raise DataError(
            f"source {redact(url)}: an http(s) source needs source.sha256 (--set "
            "source.sha256=HEX), "
            "or --allow-unverified to key it by the server's ETag/Last-Modified/size"
        )
    return url
