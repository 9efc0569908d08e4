"""Stage `download`: fetch or find the raw corpus, verify it, and read it into one Parquet table.

What it guards against: a file that does not match its sha256 (deleted and fetched again, a bounded number
of times), an http(s) source without a sha256 (refused unless `allow_unverified`, which keys the download by
the server's ETag/Last-Modified/size and re-checks them), a resume against a changed file (`If-Range`, and
`Content-Range` checked), a redirect from https to http, a server slower than the deadline, a file larger
than the size limit, archives that unpack into a bomb, escape their folder or hold links, and rows that
cannot be read (kept in `quarantine.parquet` with their line numbers, never dropped silently).
"""
from __future__ import annotations

import codecs
import csv
import gzip
import hashlib
import io
import json
import logging
import tarfile
import time
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Literal

import pandas as pd
from pydantic import Field, field_validator, model_validator

from tasks.core import BuildContext, BuildOutput, Section
from tasks.errors import DataError, ZhpipeError
from tasks.io import ROW_GROUP_ROWS, PartWriter, atomic_write_text, file_sha256, resolve_path, sorted_labels
from tasks.urls import is_internal, redact, redact_text, reveal

# what its key sees besides params, inputs and code (flows/fingerprint.py): the libraries that shape
# its output, and the params that name files (counted by content)
LIBRARIES = ("pandas", "pyarrow", "charset-normalizer")
FILES: tuple[str, ...] = ()
log = logging.getLogger("zhpipe")


def _sha256_hex(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"sha256: expected 64 hex digits, got {len(value)} characters")
    return value


class GivenSplit(Section):
    """A validation or test file that comes with the corpus (`source.splits`), read like the source."""

    path: str | None = None
    url: str | None = None
    sha256: str | None = None

    _hex = field_validator("sha256")(_sha256_hex)

    @model_validator(mode="after")
    def _has_location(self) -> "GivenSplit":
        if not self.path and not self.url:
            raise ValueError("a given split needs `path` or `url`")
        return self


class Source(Section):
    """Where the corpus comes from and how to read it (the pipeline's `source`)."""

    path: str | None = None  # local file (relative to the project root) or file:// / http(s):// URL
    url: str | None = None  # canonical URL, fetched only when `path` does not exist
    sha256: str | None = None  # verified whenever given; a mismatch is an error
    allow_unverified: bool = False  # fetch an http(s) source without a sha256, keyed by ETag/Last-Modified/size
    # conll: `token TAG` lines, a blank line between sentences (task ner); jsonl holds spans for task ner
    format: Literal["auto", "csv", "tsv", "jsonl", "parquet", "txt", "conll"] = "auto"
    encoding: str = "auto"  # auto detects utf-8, utf-8-sig and GB18030/GBK
    text_column: str = "text"
    label_column: str | None = "label"  # None for unlabelled corpora (txt)
    member: str | None = None  # file inside a .zip or tar archive; default: its only data file
    tag_scheme: Literal["auto", "bio", "bioes", "bmes"] = "auto"  # task ner, conll: auto = detected from the tags
    # task ner: validation and test files that come with the corpus (`path` is then the train file); the
    # split stage keeps them as they are (split.use_given)
    splits: dict[Literal["validation", "test"], GivenSplit] = {}
    # append: the file only grows at its end (a log of reviews): the lines each run finds past the last run's
    # end are a partition of their own, and a change before that end is an error. no: any change is a new corpus
    grows: Literal["no", "append"] = "no"
    # a partition of an appended file: the bytes [start, end) it holds (set by zhpipe, not in pipelines.yaml)
    byte_range: tuple[int, int] | None = Field(None, exclude=False)

    def given(self) -> dict[str, "Source"]:
        """The source's files by split: {"train": ..., "validation": ..., "test": ...} with given splits, else
        {"": the source}."""
        if not self.splits:
            return {"": self}
        parts = {"train": self.model_copy(update={"splits": {}})}
        for name, split in self.splits.items():
            parts[name] = self.model_copy(update={"path": split.path, "url": split.url, "sha256": split.sha256, "splits": {}})
        return parts

    @model_validator(mode="after")
    def _has_location(self) -> "Source":
        if not self.path and not self.url:
            raise ValueError("source needs `path` or `url`")
        if self.partitioned and (self.sha256 or self.url or self.splits):
            raise ValueError("source.path is a folder or glob, or grows by appends (a partition per file or per append): "
                             "it takes no sha256, url or splits (each partition is keyed by its own sha256)")
        if self.grows == "append" and self.path and (any(c in self.path for c in "*?[") or self.path.endswith("/")):
            raise ValueError("source.grows: append is for one file that grows; a folder or glob is partitioned by file already")
        return self

    @property
    def partitioned(self) -> bool:
        """A source of many parts: `path` is a glob (`data/raw/reviews/*.csv`) or ends in `/` (a folder), or one
        file that grows by appends (`grows: append`)."""
        if self.byte_range is not None or not self.path or "://" in self.path:
            return False
        return any(c in self.path for c in "*?[") or self.path.endswith("/") or self.grows == "append"

    def partitions(self, root: Path, appended: list[dict] | None = None) -> list["Partition"]:
        """Each partition of a partitioned source: its files sorted by name (a corpus that grows by one file a
        day names its files so that new ones sort last, `2026-12-01.csv`); for an appended file, the byte
        ranges of earlier runs (`appended`, checked against the file) and the new complete lines after them."""
        base = Path(self.path).expanduser()
        base = base if base.is_absolute() else root / base
        if self.grows == "append":
            return append_partitions(base, appended or [])
        files = sorted(p for p in (base.glob("*") if self.path.endswith("/") else base.parent.glob(base.name))
                       if p.is_file() and not p.name.startswith("."))
        if not files:
            raise DataError(f"source.path {self.path}: no files match (expected one file per partition, e.g. data/raw/reviews/*.csv)")
        return [Partition(p.name, p) for p in files]

    def partition(self, part: "Partition", shown: Path) -> "Source":
        """The source of one partition: this source with `path` set to its file (shown as `shown`) and, for an
        append, its byte range."""
        return self.model_copy(update={"path": str(shown), "grows": "no", "byte_range": part.byte_range})

    _hex = field_validator("sha256")(_sha256_hex)


@dataclass
class Partition:
    """One part of a partitioned source: a file, or a byte range of an appended file."""

    name: str  # the unit's suffix (`segment:<name>`) and what `repeats` names
    path: Path
    byte_range: tuple[int, int] | None = None
    digest: str | None = None  # the range's sha256 (a file's is computed when asked)

    def fingerprint(self) -> str:
        if self.digest is None:
            self.digest = file_sha256(self.path)
        return self.digest


def append_partitions(path: Path, appended: list[dict]) -> list[Partition]:
    """The partitions of a file that grows at its end: each earlier run's range (checked: a byte changed
    before the last run's end is an error) and the complete lines after it, if any, as a new one."""
    if not path.is_file():
        raise DataError(f"source not found: {path} (no such file)")
    size, parts, start = path.stat().st_size, [], 0
    with open(path, "rb") as f:
        for i, seen in enumerate(appended):
            end = int(seen["end"])
            if end > size:
                raise DataError(f"{path}: the file is shorter ({size} bytes) than at an earlier run ({end} bytes); source.grows: "
                                "append takes a file that only grows")
            digest = _range_sha256(f, start, end)
            if digest != seen["sha256"]:
                raise DataError(f"{path}: bytes {start}-{end} differ from an earlier run's; source.grows: append takes a file "
                                "that only grows at its end (set grows: no to read it as a new corpus)")
            parts.append(Partition(f"{path.name}@{i:04d}", path, (start, end), digest))
            start = end
        if size > start:
            f.seek(start)
            tail = f.read(size - start)
            cut = tail.rfind(b"\n") + 1  # complete lines only: a line being written waits for the next run
            if cut:
                parts.append(Partition(f"{path.name}@{len(parts):04d}", path, (start, start + cut), hashlib.sha256(tail[:cut]).hexdigest()))
    if not parts:
        raise DataError(f"{path}: no complete line to read")
    return parts


def _range_blocks(f, start: int, end: int):
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
    for block in _range_blocks(f, start, end):
        h.update(block)
    return h.hexdigest()


def range_file(source: "Source", path: Path, scratch: Path) -> Path:
    """An appended file's partition as a file of its own: the header line (CSV and TSV) and its byte range."""
    start, end = source.byte_range
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / f"part-{start}-{end}{path.suffix}"
    with open(path, "rb") as src, open(out, "wb") as dst:
        if start and file_format(path, source) in ("csv", "tsv"):
            dst.write(src.readline())
        for block in _range_blocks(src, start, end):
            dst.write(block)
    return out


class Params(Section):
    """The `download` section."""

    timeout_s: float = Field(60.0, gt=0)  # per network read; a stalled server fails instead of hanging
    deadline_s: float = Field(3600.0, gt=0)  # the whole download, retries included
    retries: int = Field(3, ge=0)  # network errors and 5xx answers, with back-off; also sha256 mismatches
    max_bytes: int = Field(2 << 30, gt=0)  # largest file fetched (2 GiB)
    max_unpacked_bytes: int = Field(8 << 30, gt=0)  # largest file unpacked from .gz/.zip/.tar (8 GiB)
    max_ratio: float = Field(100.0, gt=1)  # unpacked / packed size beyond 1 MiB: more is a decompression bomb


DATA_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "txt"}
ARCHIVES = (".zip", ".gz", ".tgz", ".tar")


class ChecksumError(DataError):
    """Downloaded or local bytes do not match the declared sha256."""


class NetworkError(ZhpipeError):
    """A transport error or a 5xx answer: worth another attempt."""


def is_http(location: str | None) -> bool:
    return bool(location) and location.lower().startswith(("http://", "https://"))


def where(source: Source, root: Path) -> tuple[Path | None, str | None]:
    """(the local file holding the source, None) when `path` or `url` names an existing file, else (None, the
    http(s) URL to fetch it from); (None, None) when there is neither."""
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
    """The URL to fetch; refuse an http(s) source without a sha256 unless `allow_unverified` is set."""
    url = fetched_location(source, root)
    if url and not source.sha256 and not source.allow_unverified:
        raise DataError(f"source {redact(url)}: an http(s) source needs source.sha256 (--set source.sha256=HEX), "
                        "or --allow-unverified to key it by the server's ETag/Last-Modified/size")
    return url


@dataclass
class Validators:
    """What a server says identifies a file's version: ETag, Last-Modified, size."""

    etag: str | None = None
    last_modified: str | None = None
    size: int | None = None

    @classmethod
    def of(cls, headers) -> "Validators":
        size = headers.get("content-length")
        return cls(headers.get("etag"), headers.get("last-modified"), int(size) if size and size.isdigit() else None)

    def fingerprint(self) -> str:
        return f"etag={self.etag} last-modified={self.last_modified} size={self.size}"

    def if_range(self) -> str | None:
        """A validator a server may compare for `If-Range` (a strong ETag, else the date)."""
        if self.etag and not self.etag.startswith("W/"):
            return self.etag
        return self.last_modified


def _client(timeout_s: float):
    import httpx

    return httpx.Client(timeout=timeout_s, follow_redirects=False)


def _send(client, method: str, url: str, headers: dict, deadline: float, max_redirects: int = 5):
    """One request, following redirects by hand: https -> http is refused, and so is a loop."""
    shown = redact(url)
    for _ in range(max_redirects + 1):
        if time.monotonic() > deadline:
            raise DataError(f"download {shown}: deadline passed (download.deadline_s)")
        req = client.build_request(method, url, headers=headers)
        resp = client.send(req, stream=True)
        if resp.status_code not in (301, 302, 303, 307, 308) or "location" not in resp.headers:
            return resp
        target = str(resp.url.join(resp.headers["location"]))
        resp.close()
        if url.lower().startswith("https://") and not target.lower().startswith("https://"):
            raise DataError(f"download {shown}: refused a redirect from https to {redact(target).split('://')[0]}:// ({redact(target)})")
        if is_internal(target) and not is_internal(url):  # a public server may not send us into this machine or its network
            raise DataError(f"download {shown}: refused a redirect to an address of this machine or a private network ({redact(target)})")
        url = target
    raise DataError(f"download {shown}: more than {max_redirects} redirects")


def probe(url: str, params: Params) -> Validators:
    """The server's validators for `url` (a HEAD request), for keying an unverified download."""
    import httpx

    deadline = time.monotonic() + min(params.deadline_s, params.timeout_s * 2)
    try:
        with _client(params.timeout_s) as client:
            resp = _send(client, "HEAD", reveal(url), {}, deadline)
            resp.close()
            if resp.status_code in (405, 501):  # no HEAD here: the headers of a GET, its body left unread
                resp = _send(client, "GET", reveal(url), {}, deadline)
                resp.close()
    except httpx.HTTPError as e:
        raise NetworkError(f"download {redact(url)}: {type(e).__name__}: {redact_text(str(e))}") from None
    if resp.status_code >= 400:
        raise DataError(f"download {redact(url)}: HTTP {resp.status_code} (expected 200)")
    return Validators.of(resp.headers)


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


def _read_meta(path: Path) -> dict:
    try:
        return json.loads(_meta_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _discard(*paths: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)
        _meta_path(p).unlink(missing_ok=True)


def _fetch_once(client, url: str, final: Path, part: Path, params: Params, deadline: float) -> Validators:
    """Download (or resume) `url` into `part`, then rename it to `final`."""
    shown = redact(url)
    meta = _read_meta(part)
    offset = part.stat().st_size if part.exists() else 0
    headers = {}
    if offset and meta.get("if_range"):  # resume only when the server can tell us the file is unchanged
        headers = {"Range": f"bytes={offset}-", "If-Range": meta["if_range"]}
    else:
        offset = 0
    resp = _send(client, "GET", url, headers, deadline)
    try:
        if resp.status_code in (500, 502, 503, 504, 429):
            raise NetworkError(f"download {shown}: HTTP {resp.status_code}")
        if resp.status_code >= 400 and resp.status_code != 416:
            raise DataError(f"download {shown}: HTTP {resp.status_code} (expected 200)")
        validators = Validators.of(resp.headers)
        mode = "wb"
        if resp.status_code == 206:
            start, total = _content_range(resp.headers.get("content-range", ""))
            if start != offset:
                _discard(part)
                raise NetworkError(f"download {shown}: asked to resume at byte {offset}, the server sent Content-Range from {start}")
            validators.size = total
            mode = "ab"
        elif resp.status_code == 416:
            _discard(part)
            raise NetworkError(f"download {shown}: the server refused to resume (HTTP 416); starting again")
        else:
            offset = 0
        if validators.size is not None and validators.size > params.max_bytes:
            raise DataError(f"download {shown}: {validators.size} bytes is over the size limit download.max_bytes={params.max_bytes}")
        # a Content-Encoding (gzip, br) is undone as the bytes arrive: Content-Length counts the encoded bytes, the
        # file holds the decoded ones, the ratio limit bounds them, and a resume (a range of encoded bytes) is off
        encoded = resp.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity")
        atomic_write_text(_meta_path(part), json.dumps({"if_range": None if encoded else validators.if_range()}))
        written = offset
        with open(part, mode) as f:
            for block in resp.iter_bytes():  # as the bytes arrive, so the deadline is checked as they do
                written += len(block)
                if written > params.max_bytes:
                    f.close()
                    _discard(part)
                    raise DataError(f"download {shown}: more than download.max_bytes={params.max_bytes} bytes; stopped")
                if encoded and written > (1 << 20) and written / max(resp.num_bytes_downloaded, 1) > params.max_ratio:
                    f.close()
                    _discard(part)
                    raise DataError(f"download {shown}: its {resp.headers['content-encoding']} transfer decodes to more than "
                                    f"{params.max_ratio:g}x its size (a decompression bomb?); stopped (download.max_ratio)")
                if time.monotonic() > deadline:
                    raise DataError(f"download {shown}: deadline of {params.deadline_s:g} s passed after {written} bytes (download.deadline_s)")
                f.write(block)
        received = offset + resp.num_bytes_downloaded if encoded else written
    finally:
        resp.close()
    if validators.size is not None and received != validators.size:
        raise NetworkError(f"download {shown}: got {received} of {validators.size} bytes")
    validators.size = written
    part.rename(final)
    _meta_path(part).unlink(missing_ok=True)
    atomic_write_text(_meta_path(final), json.dumps(validators.__dict__))
    return validators


def _content_range(value: str) -> tuple[int | None, int | None]:
    """(start, total) of `bytes start-end/total`."""
    try:
        unit, _, rest = value.partition(" ")
        span, _, total = rest.partition("/")
        return int(span.split("-")[0]), (int(total) if total.isdigit() else None)
    except ValueError:
        return None, None


def fetch(url: str, folder: Path, params: Params, sha256: str | None = None, expect: Validators | None = None) -> Path:
    """The verified local copy of `url` in `folder`: resumed when partial, fetched again (at most
    `params.retries` times) after a network error or a sha256 mismatch; a mismatching file is deleted."""
    import httpx

    shown = redact(url)
    url = reveal(url)
    name = Path(url.split("?")[0].split("#")[0]).name or "download"
    final, part = folder / name, folder / f"{name}.part"
    deadline = time.monotonic() + params.deadline_s
    problem = ""
    with _client(params.timeout_s) as client:
        for attempt in range(params.retries + 1):
            if attempt:
                delay = min(2.0 ** (attempt - 1), 10.0)
                log.warning("download %s: %s; attempt %d of %d in %.0f s", shown, problem, attempt + 1, params.retries + 1, delay)
                if time.monotonic() + delay > deadline:
                    break
                time.sleep(delay)
            if final.is_file() and expect is not None and _read_meta(final) != expect.__dict__:
                log.warning("download %s: the server's file changed (%s); fetching it again", shown, expect.fingerprint())
                _discard(final)
            if not final.is_file():
                try:
                    _fetch_once(client, url, final, part, params, deadline)
                except NetworkError as e:
                    problem = str(e).split(": ", 1)[-1]
                    continue
                except httpx.HTTPError as e:
                    problem = f"{type(e).__name__}: {redact_text(str(e)) or 'no answer'}"
                    continue
            if sha256 is None:
                return final
            actual = file_sha256(final)
            if actual == sha256:
                return final
            _discard(final, part)
            problem = f"sha256 mismatch (expected {sha256}, got {actual}); the file was deleted"
            if attempt == params.retries:
                raise ChecksumError(f"download {shown}: {problem}, {params.retries + 1} attempts")
    if time.monotonic() > deadline:
        raise DataError(f"download {shown}: deadline of {params.deadline_s:g} s passed ({problem})")
    raise DataError(f"download {shown}: gave up after {params.retries + 1} attempts ({problem})")


def check_sha256(path: Path, expected: str | None) -> str:
    """Return the file's sha256; raise ChecksumError when it differs from `expected`."""
    actual = file_sha256(path)
    if expected and actual != expected.lower():
        raise ChecksumError(f"{path}: sha256 mismatch (expected {expected}, got {actual}): the file changed since its "
                            "sha256 was pinned; if the new content is intended, set source.sha256 to the new value")
    return actual


class _Budget:
    """Counts unpacked bytes against the size and ratio limits."""

    def __init__(self, archive: Path, packed: int, params: Params):
        self.archive, self.packed, self.params, self.total = archive, max(packed, 1), params, 0

    def copy(self, src, dst) -> None:
        while block := src.read(1 << 20):
            self.total += len(block)
            if self.total > self.params.max_unpacked_bytes:
                raise DataError(f"{self.archive}: unpacks to more than download.max_unpacked_bytes={self.params.max_unpacked_bytes} bytes; refusing")
            if self.total > (1 << 20) and self.total / self.packed > self.params.max_ratio:
                raise DataError(f"{self.archive}: unpacks to more than {self.params.max_ratio:g}x its {self.packed} bytes "
                                "(a decompression bomb?); refusing (download.max_ratio)")
            dst.write(block)


def _pick(archive: Path, names: list[str], member: str | None) -> str:
    data = [n for n in names if Path(n).suffix.lower() in DATA_SUFFIXES and not n.endswith("/")]
    chosen = member or (data[0] if len(data) == 1 else None)
    if chosen is None:
        raise DataError(f"{archive}: archive holds {len(data)} data files {data[:5]}; set source.member to pick one")
    if chosen not in names:
        raise DataError(f"{archive}: no member '{chosen}' in archive (found: {', '.join(data[:10])})")
    return chosen


def _safe_name(archive: Path, name: str, target: Path) -> None:
    if name.startswith(("/", "\\")) or ".." in Path(name.replace("\\", "/")).parts or not (target / name).resolve().is_relative_to(target.resolve()):
        raise DataError(f"{archive}: archive entry '{name}' escapes the extraction folder; refusing")


def extract(path: Path, target: Path, member: str | None, params: Params | None = None) -> Path:
    """Unpack a .gz file or one member of a .zip/.tar(.gz) archive into `target`, within the size and ratio
    limits; refuse entries that escape `target`, and links."""
    params = params or Params()
    target.mkdir(parents=True, exist_ok=True)
    budget = _Budget(path, path.stat().st_size, params)
    name = path.name.lower()
    if name.endswith((".tar", ".tar.gz", ".tgz")):
        with tarfile.open(path) as tf:
            members = tf.getmembers()
            for m in members:
                _safe_name(path, m.name, target)
                if m.issym() or m.islnk():
                    raise DataError(f"{path}: archive entry '{m.name}' is a link (to '{m.linkname}'); refusing")
                if not (m.isfile() or m.isdir()):
                    raise DataError(f"{path}: archive entry '{m.name}' is not a regular file; refusing")
            chosen = _pick(path, [m.name for m in members if m.isfile()], member)
            out = target / Path(chosen).name
            with tf.extractfile(chosen) as src, open(out, "wb") as dst:
                budget.copy(src, dst)
            return out
    if name.endswith(".gz"):
        out = target / path.stem
        try:
            with gzip.open(path, "rb") as src, open(out, "wb") as dst:
                budget.copy(src, dst)
        except (OSError, EOFError) as e:
            raise DataError(f"{path}: not a readable gzip file ({e})") from None
        return out
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise DataError(f"{path}: not a readable zip file ({e})") from None
    with zf:
        for info in zf.infolist():
            _safe_name(path, info.filename, target)
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise DataError(f"{path}: archive entry '{info.filename}' is a link; refusing")
        chosen = _pick(path, zf.namelist(), member)
        out = target / Path(chosen).name
        with zf.open(chosen) as src, open(out, "wb") as dst:
            budget.copy(src, dst)
        return out


def detect_encoding(raw: bytes) -> str:
    """utf-8-sig, utf-8 or gb18030 (a superset of GBK and GB2312), else charset-normalizer's guess. `raw` may
    be the head of a file: a multi-byte character cut at its end does not count against utf-8."""
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
        raise DataError("cannot detect the text encoding (tried utf-8, gb18030); set source.encoding")
    return best.encoding


def physical_lines(text: str) -> list[str]:
    """Lines split on \\n (and \\r\\n) only: U+2028, U+0085 and \\x1c-\\x1e are characters inside a line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


HEAD_BYTES = 4 << 20  # the encoding is detected from the file's first 4 MiB
BATCH_CHARS = 1 << 20  # a file is read, parsed and written about 1 M characters at a time
MAX_RECORD_CHARS = 16 << 20  # a CSV record spanning more characters than this is a stray quote's doing


def line_batches(path: Path, encoding: str, batch_chars: int | None = None) -> Iterator[list[str]]:
    """The file's physical lines (split on \\n only, \\r\\n's \\r dropped, a leading BOM dropped), in batches
    of about `batch_chars` characters: the file is decoded as it is read, never held whole."""
    with open(path, "rb") as raw, io.TextIOWrapper(raw, encoding=encoding, newline="\n") as f:
        first = True
        read = 0
        try:
            while batch := f.readlines(batch_chars or BATCH_CHARS):
                if first and batch[0].startswith("\ufeff"):
                    batch[0] = batch[0][1:]
                first = False
                read += len(batch)
                yield [line[:-2] if line.endswith("\r\n") else line[:-1] if line.endswith("\n") else line for line in batch]
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: cannot decode as {encoding} after line {read}: {e.reason} "
                            "(set source.encoding if the encoding was guessed from the file's head)") from None


@dataclass
class Parsed:
    """Rows read from (part of) a file, and the rows that could not be read, with their line numbers."""

    rows: list[dict]
    lines: list[int]  # the physical line each row starts on
    bad: list[dict]  # {line, reason, raw}
    physical: int  # physical lines read


def csv_records(lines: list[str], sep: str, width: int, offset: int, final: bool) -> tuple[Parsed, int]:
    """Rows of CSV/TSV physical lines, by a header `width` fields wide; `offset` is the line number of
    `lines[0]` minus one. A row with the wrong number of fields, or a quote that swallows the lines after
    it, is quarantined with its line number instead of shifting or merging other rows. Unless `final`, the
    last record may go on in the next batch: it is left unread, and the number of lines used is returned."""
    csv.field_size_limit(1 << 30)  # a long text is the clean stage's to judge (clean.max_chars), not the reader's
    rows, starts, bad = [], [], []

    def parse(first: int, last: int) -> list[tuple[int, int, list[str]]]:
        """Records of lines [first, last) as (start line, end line, fields), 0-based."""
        reader = csv.reader(io.StringIO("\n".join(lines[first:last]) + "\n", newline=""), delimiter=sep)
        out, start = [], first
        for fields in reader:
            end = first + reader.line_num
            out.append((start, end, fields))
            start = end
        return out

    def swallowed(start: int, end: int) -> bool:
        """A multi-line record whose inner lines read as whole rows: a stray quote, not a quoted newline."""
        inner = [next(csv.reader([ln], delimiter=sep), []) for ln in lines[start + 1 : end]]
        return sum(len(f) == width for f in inner) >= max(1, len(inner) // 2)

    records = parse(0, len(lines))
    used = len(lines)
    # the last record may be cut by the batch's end: it is read again with the next batch, unless it is already
    # longer than any record can be (a stray quote's doing, judged here)
    if not final and records and sum(map(len, lines[records[-1][0] :])) <= MAX_RECORD_CHARS:
        used = records[-1][0]
        records.pop()
    pending = [records]
    while pending:
        for start, end, fields in pending.pop():
            if end - start > 1 and swallowed(start, end):
                bad.append({"line": offset + start + 1, "reason": "stray_quote", "raw": lines[start][:500]})
                pending.append(parse(start + 1, end))
                continue
            if (not fields or fields == [""]) and not "".join(lines[start:end]).strip():
                continue  # a blank line is not a row
            if len(fields) != width:
                bad.append({"line": offset + start + 1, "reason": f"fields_{len(fields)}_expected_{width}", "raw": sep.join(fields)[:500]})
                continue
            rows.append(fields)
            starts.append(offset + start + 1)
    order = sorted(range(len(rows)), key=starts.__getitem__)
    return Parsed([rows[i] for i in order], [starts[i] for i in order], sorted(bad, key=lambda b: b["line"]), used), used


def parse_csv(text: str, sep: str) -> Parsed:
    """Rows of a whole CSV/TSV text by its header (see `csv_records`)."""
    lines = physical_lines(text)
    if not lines:
        return Parsed([], [], [], 0)
    header = next(csv.reader([lines[0]], delimiter=sep))
    parsed, _ = csv_records(lines[1:], sep, len(header), 1, final=True)
    return Parsed([dict(zip(header, r)) for r in parsed.rows], parsed.lines, parsed.bad, len(lines))


def jsonl_records(lines: list[str], offset: int) -> Parsed:
    """Objects of JSON lines; `offset` is the line number of `lines[0]` minus one."""
    rows, starts, bad = [], [], []
    for i, line in enumerate(lines, offset + 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            bad.append({"line": i, "reason": f"invalid_json: {str(e).split(':')[0]}", "raw": line[:500]})
            continue
        if not isinstance(row, dict):
            bad.append({"line": i, "reason": "not_an_object", "raw": line[:500]})
            continue
        rows.append(row)
        starts.append(i)
    return Parsed(rows, starts, bad, len(lines))


def parse_jsonl(text: str) -> Parsed:
    return jsonl_records(physical_lines(text), 0)


def parsed_batches(path: Path, source: Source, fmt: str) -> Iterator[Parsed]:
    """The file's rows, batch by batch (each a `Parsed` of dicts), streamed: memory is one batch, not the file."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        line = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=50_000):
            rows = batch.to_pylist()
            yield Parsed(rows, list(range(line + 1, line + len(rows) + 1)), [], len(rows))
            line += len(rows)
        return
    if source.encoding == "auto":
        with open(path, "rb") as f:
            encoding = detect_encoding(f.read(HEAD_BYTES))
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
                yield Parsed([{source.text_column: ln} for _, ln in kept], [i for i, _ in kept], [], len(lines))
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
    """Read csv/tsv/jsonl/parquet/txt in batches of (rows with `id`, `line`, `text` and `label` when labelled,
    quarantined rows with `line`, `reason`, `raw`, physical lines read); ids count on across batches."""
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
        raise DataError(f"{path}: cannot tell the format from suffix '{path.suffix}'; set source.format (csv, tsv, jsonl, parquet, txt)")
    return fmt


def read_table(path: Path, source: Source) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The whole file at once (`read_batches` joined): (rows, quarantined rows, facts such as physical lines)."""
    frames, bad, physical = [], [], 0
    for df, quarantine, lines in read_batches(path, source):
        frames.append(df)
        bad.append(quarantine)
        physical += lines
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    quarantine = pd.concat(bad, ignore_index=True) if bad else empty_quarantine()
    if df.empty:
        no_rows(path, quarantine["reason"].value_counts().to_dict())
    return df, quarantine, {"lines_physical": physical, "labelled": labelled(source, file_format(path, source))}


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


def _normalise(parsed: Parsed, path: Path, source: Source, fmt: str, first_id: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    columns = set().union(*(r.keys() for r in parsed.rows[:1000])) if parsed.rows else set()
    if parsed.rows and source.text_column not in columns:
        raise DataError(f"{path}: no text column '{source.text_column}' (columns found: {', '.join(map(str, sorted(columns)))})")
    with_labels = labelled(source, fmt)
    if parsed.rows and with_labels and source.label_column not in columns:
        raise DataError(f"{path}: no label column '{source.label_column}' (columns found: {', '.join(map(str, sorted(columns)))})")
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
            bad.append({"line": line, "reason": reason, "raw": json.dumps(row, ensure_ascii=False, default=str)[:500]})
            continue
        ids.append(first_id + len(ids))
        lines.append(line)
        texts.append(str(text))
        if with_labels:
            labels.append(str(label).strip())
    out = pd.DataFrame({"id": pd.Series(ids, dtype="int64"), "line": pd.Series(lines, dtype="int64"), "text": pd.Series(texts, dtype="string")})
    if with_labels:
        out["label"] = pd.Series(labels, dtype="string")
    quarantine = pd.DataFrame(sorted(bad, key=lambda b: b["line"]), columns=list(QUARANTINE_COLUMNS)).astype(QUARANTINE_COLUMNS)
    return out, quarantine


def locate(source: Source, root: Path, folder_for: Callable[[str], Path], params: Params,
           expect: Validators | None = None) -> tuple[Path, str]:
    """The local file holding the source bytes and their sha256: the given path when it exists, else a
    verified download (hashed once: a file that `fetch` returns matches `source.sha256`)."""
    local, url = where(source, root)
    if local is not None:
        return local, check_sha256(local, source.sha256)
    if url is not None:
        require_verifiable(source, root)
        path = fetch(url, folder_for(redact(url)), params, source.sha256, expect)
        return path, source.sha256 or file_sha256(path)
    raise DataError(f"source not found: {redact(source.path or source.url)} (no such file, and no url to fetch it from)")


PARTITION_IDS = 10**10  # a partition's row ids start at its ordinal times this (partitions of up to 10^10 rows)


def build(ctx: BuildContext) -> BuildOutput:
    """Find or fetch, verify, unpack and read the source (`ctx.source`); write `data.parquet` and
    `quarantine.parquet`. The file is decoded, parsed and written batch by batch, so memory does not grow with
    the corpus."""
    p: Params = ctx.params
    source: Source = ctx.source
    raw, sha = locate(source, ctx.root, ctx.store.downloads, p, ctx.store.expect(source))
    data_file = extract(raw, ctx.scratch / "extracted", source.member, p) if raw.name.lower().endswith(ARCHIVES) else raw
    if source.byte_range is not None:  # a partition of an appended file: its lines only
        data_file = range_file(source, data_file, ctx.scratch / "range")
    data = PartWriter(ctx.out / "data.parquet", ROW_GROUP_ROWS)
    bad = PartWriter(ctx.out / "quarantine.parquet", ROW_GROUP_ROWS)
    labels: set[str] = set()
    reasons: Counter = Counter()
    rows = physical = 0
    first_bad = None
    offset = PARTITION_IDS * ctx.partition[0] if ctx.partition else 0  # ids unique across partitions
    for df, quarantine, lines in read_batches(data_file, source):
        physical += lines
        if offset:
            df = df.assign(id=df["id"] + offset)
            quarantine = quarantine.assign(id=quarantine["id"] + offset) if "id" in quarantine else quarantine
        if len(df):
            data.write(df)
            rows += len(df)
            if "label" in df:
                labels.update(df["label"].unique().tolist())
        if len(quarantine):
            bad.write(quarantine)
            reasons.update(quarantine["reason"].tolist())
            first_bad = first_bad if first_bad is not None else int(quarantine["line"].min())
    if not rows:
        no_rows(data_file, dict(reasons))
    data.close()
    bad.close(empty_quarantine())
    if bad.rows:
        log.warning("download: %d of %d rows quarantined (%s), first at line %d; see quarantine.parquet",
                    bad.rows, rows + bad.rows, dict(reasons), first_bad)
    with_labels = labelled(source, file_format(data_file, source))
    info = {"source_sha256": sha, "source_file": redact(str(raw) if raw.is_relative_to(ctx.root) else raw.name), "labelled": with_labels}
    metrics = {"rows_raw": rows, "rows_quarantined": bad.rows, "lines_physical": physical}
    if with_labels:
        info["labels"] = sorted_labels(labels)
        metrics["num_labels"] = len(info["labels"])
    return BuildOutput(rows=rows, metrics=metrics, info=info)
