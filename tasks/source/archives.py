"""Unpacking .gz, .zip and tar archives within limits: no entry that escapes its folder or is a
link, no decompression bomb (size and ratio limits)."""

from __future__ import annotations

import gzip
import tarfile
import zipfile
from pathlib import Path

from tasks.errors import DataError
from tasks.source.fetch import FetchParams
from tasks.source.readers import DATA_SUFFIXES

ARCHIVES = (".zip", ".gz", ".tgz", ".tar")


class _Budget:
    """Counts unpacked bytes against the size and ratio limits."""

    def __init__(self, archive: Path, packed: int, params: FetchParams):
        self.archive, self.packed, self.params, self.total = archive, max(packed, 1), params, 0

    def copy(self, src, dst) -> None:
        while block := src.read(1 << 20):
            self.total += len(block)
            if self.total > self.params.max_unpacked_bytes:
                raise DataError(
                    f"{self.archive}: unpacks to more than "
                    f"download.max_unpacked_bytes={self.params.max_unpacked_bytes} bytes; refusing"
                )
            if self.total > (1 << 20) and self.total / self.packed > self.params.max_ratio:
                raise DataError(
                    f"{self.archive}: unpacks to more than {self.params.max_ratio:g}x its "
                    f"{self.packed} "
                    f"bytes (a decompression bomb?); refusing (download.max_ratio)"
                )
            dst.write(block)


def _pick(archive: Path, names: list[str], member: str | None) -> str:
    data = [n for n in names if Path(n).suffix.lower() in DATA_SUFFIXES and not n.endswith("/")]
    chosen = member or (data[0] if len(data) == 1 else None)
    if chosen is None:
        raise DataError(
            f"{archive}: archive holds {len(data)} data files {data[:5]}; set source.member to "
            "pick one"
        )
    if chosen not in names:
        raise DataError(
            f"{archive}: no member '{chosen}' in archive (found: {', '.join(data[:10])})"
        )
    return chosen


def _safe_name(archive: Path, name: str, target: Path) -> None:
    outside = not (target / name).resolve().is_relative_to(target.resolve())
    if name.startswith(("/", "\\")) or ".." in Path(name.replace("\\", "/")).parts or outside:
        raise DataError(
            f"{archive}: archive entry '{name}' escapes the extraction folder; refusing"
        )


def extract(
    path: Path, target: Path, member: str | None, params: FetchParams | None = None
) -> Path:
    """Unpack a .gz file or one member of a .zip/.tar(.gz) archive into `target`, within the size
    and ratio limits; refuse entries that escape `target`, and links."""
    params = params or FetchParams()
    target.mkdir(parents=True, exist_ok=True)
    budget = _Budget(path, path.stat().st_size, params)
    name = path.name.lower()
    if name.endswith((".tar", ".tar.gz", ".tgz")):
        with tarfile.open(path) as tf:
            members = tf.getmembers()
            for m in members:
                _safe_name(path, m.name, target)
                if m.issym() or m.islnk():
                    raise DataError(
                        f"{path}: archive entry '{m.name}' is a link (to '{m.linkname}'); refusing"
                    )
                if not (m.isfile() or m.isdir()):
                    raise DataError(
                        f"{path}: archive entry '{m.name}' is not a regular file; refusing"
                    )
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
