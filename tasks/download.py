"""Stage `download`: fetch or find the raw corpus, verify it, and read it into one Parquet table."""
from __future__ import annotations

import gzip
import io
import json
import shutil
import zipfile
from pathlib import Path
from typing import Callable, Literal

import pandas as pd
from pydantic import Field, model_validator

from tasks.core import BuildContext, BuildOutput, Section
from tasks.errors import DataError
from tasks.io import file_sha256, resolve_path, sorted_labels, write_parquet

# what its key sees besides params, inputs and code (flows/fingerprint.py): the libraries that shape
# its output, and the params that name files (counted by content)
LIBRARIES = ("pandas", "pyarrow", "charset-normalizer")
FILES: tuple[str, ...] = ()


class Source(Section):
    """Where the corpus comes from and how to read it (the pipeline's `source`)."""

    path: str | None = None  # local file (relative to the project root) or file:// / http(s):// URL
    url: str | None = None  # canonical URL, fetched only when `path` does not exist
    sha256: str | None = None  # verified whenever given; a mismatch is an error
    format: Literal["auto", "csv", "tsv", "jsonl", "parquet", "txt"] = "auto"
    encoding: str = "auto"  # auto detects utf-8, utf-8-sig and GB18030/GBK
    text_column: str = "text"
    label_column: str | None = "label"  # None for unlabelled corpora (txt)
    member: str | None = None  # file inside a .zip archive; default: its only data file

    @model_validator(mode="after")
    def _has_location(self) -> "Source":
        if not self.path and not self.url:
            raise ValueError("source needs `path` or `url`")
        return self


class Params(Section):
    """The `download` section."""

    timeout_s: float = 60.0  # per network read; a stalled server fails instead of hanging
    retries: int = Field(3, ge=0)  # Prefect task retries for network errors only
    chunk_bytes: int = 1 << 20


DATA_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".txt": "txt"}


class ChecksumError(DataError):
    """Downloaded or local bytes do not match the declared sha256."""


def fetch(url: str, folder: Path, timeout_s: float, chunk_bytes: int = 1 << 20) -> Path:
    """Download `url` into `folder`, resuming a partial `.part` file with an HTTP Range request."""
    import httpx

    name = Path(url.split("?")[0]).name or "download"
    final, part = folder / name, folder / f"{name}.part"
    if final.is_file():
        return final
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    with httpx.stream("GET", url, headers=headers, timeout=timeout_s, follow_redirects=True) as resp:
        if resp.status_code == 416:  # the partial file is already complete
            part.rename(final)
            return final
        if resp.status_code in (404, 401, 403, 410):
            raise DataError(f"download {url}: HTTP {resp.status_code} (expected 200)")
        resp.raise_for_status()
        mode = "ab" if offset and resp.status_code == 206 else "wb"  # a server without Range support restarts
        with open(part, mode) as f:
            for block in resp.iter_bytes(chunk_bytes):
                f.write(block)
    part.rename(final)
    return final


def verify(path: Path, expected: str | None) -> str:
    """Return the file's sha256; raise ChecksumError when it differs from `expected`."""
    actual = file_sha256(path)
    if expected and actual.lower() != expected.lower():
        raise ChecksumError(f"{path}: sha256 mismatch (expected {expected}, got {actual})")
    return actual


def extract(path: Path, target: Path, member: str | None) -> Path:
    """Unpack a .zip member or a .gz file into `target`; refuse archive entries that escape it."""
    target.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        out = target / path.stem
        with gzip.open(path, "rb") as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return out
    with zipfile.ZipFile(path) as zf:
        root = target.resolve()
        for info in zf.infolist():
            dest = (target / info.filename).resolve()
            if not dest.is_relative_to(root):
                raise DataError(f"{path}: archive entry '{info.filename}' escapes the extraction folder; refusing")
        names = [n for n in zf.namelist() if Path(n).suffix.lower() in DATA_SUFFIXES and not n.endswith("/")]
        chosen = member or (names[0] if len(names) == 1 else None)
        if chosen is None:
            raise DataError(f"{path}: archive holds {len(names)} data files {names[:5]}; set source.member to pick one")
        if chosen not in zf.namelist():
            raise DataError(f"{path}: no member '{chosen}' in archive (found: {', '.join(names[:10])})")
        zf.extract(chosen, target)
        return target / chosen


def detect_encoding(raw: bytes) -> str:
    """utf-8-sig, utf-8 or gb18030 (a superset of GBK and GB2312), else charset-normalizer's guess."""
    if raw.startswith(b"\xef\xbb\xbf"):
        return "utf-8-sig"
    try:
        raw.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError:
        pass
    try:
        raw.decode("gb18030")
        return "gb18030"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(raw[:1_000_000]).best()
    if best is None:
        raise DataError("cannot detect the text encoding (tried utf-8, gb18030); set source.encoding")
    return best.encoding


def read_table(path: Path, source: Source) -> pd.DataFrame:
    """Read csv/tsv/jsonl/parquet/txt into columns `id`, `text` and (when labelled) `label` as strings."""
    fmt = source.format if source.format != "auto" else DATA_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"{path}: cannot tell the format from suffix '{path.suffix}'; set source.format (csv, tsv, jsonl, parquet, txt)")
    try:
        if fmt == "parquet":
            df = pd.read_parquet(path)
        else:
            raw = path.read_bytes()
            encoding = detect_encoding(raw) if source.encoding == "auto" else source.encoding
            text = raw.decode(encoding)
            if fmt == "txt":
                df = pd.DataFrame({source.text_column: [line for line in text.splitlines() if line.strip()]})
            elif fmt == "jsonl":
                df = pd.DataFrame([json.loads(line) for line in text.splitlines() if line.strip()])
            else:
                df = pd.read_csv(io.StringIO(text), sep="," if fmt == "csv" else "\t", dtype=str, keep_default_na=False)
    except (UnicodeDecodeError, LookupError) as e:
        raise DataError(f"{path}: cannot decode as {source.encoding}: {e}") from e
    except (ValueError, OSError, pd.errors.ParserError) as e:
        raise DataError(f"{path}: unreadable {fmt}: {str(e).splitlines()[0]}") from e
    return _normalise(df, path, source, fmt)


def _normalise(df: pd.DataFrame, path: Path, source: Source, fmt: str) -> pd.DataFrame:
    if source.text_column not in df.columns:
        raise DataError(f"{path}: no text column '{source.text_column}' (columns found: {', '.join(map(str, df.columns))})")
    out = pd.DataFrame({"id": range(len(df)), "text": df[source.text_column].astype("string").fillna("")})
    if source.label_column and fmt != "txt":
        if source.label_column not in df.columns:
            raise DataError(f"{path}: no label column '{source.label_column}' (columns found: {', '.join(map(str, df.columns))})")
        labels = df[source.label_column].astype("string").str.strip()
        missing = labels.isna() | (labels == "")
        if missing.any():
            raise DataError(f"{path}: {int(missing.sum())} rows have an empty label in column '{source.label_column}' (first at row {int(missing.idxmax()) + 1})")
        out["label"] = labels.values
    if out.empty:
        raise DataError(f"{path}: the corpus is empty (0 rows)")
    return out


def locate(source: Source, root: Path, folder_for: Callable[[str], Path], timeout_s: float, chunk_bytes: int) -> Path:
    """The local file holding the source bytes: the given path when it exists, else a download of `url`."""
    for location in (source.path, source.url):
        if not location:
            continue
        local = resolve_path(location, root)
        if local is not None:
            if local.is_file():
                return local
            continue
        return fetch(location, folder_for(location), timeout_s, chunk_bytes)
    raise DataError(f"source not found: {source.path or source.url} (no such file, and no url to fetch it from)")


def build(ctx: BuildContext, source: Source, folder_for: Callable[[str], Path]) -> BuildOutput:
    """Find or fetch, verify, unpack and read the source; write `data.parquet`."""
    p = ctx.params
    raw = locate(source, ctx.root, folder_for, p.timeout_s, p.chunk_bytes)
    sha = verify(raw, source.sha256)
    data_file = extract(raw, ctx.out / "extracted", source.member) if raw.suffix in (".zip", ".gz") else raw
    df = read_table(data_file, source)
    write_parquet(df, ctx.out / "data.parquet")
    info = {"source_sha256": sha, "source_file": str(raw), "labelled": "label" in df}
    metrics = {"rows_raw": len(df)}
    if "label" in df:
        info["labels"] = sorted_labels(df["label"])
        metrics["num_labels"] = len(info["labels"])
    return BuildOutput(rows=len(df), metrics=metrics, info=info)
