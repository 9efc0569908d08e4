"""Fetching a remote corpus and checking it: one HTTP client with retries, resume (`If-Range`,
`Content-Range` checked), a deadline, size and decompression limits, redirects checked by hand
(never https to http, never into this machine or its network), the server's validators for keying an
unverified file, and sha256 checks."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from tasks.core import Section
from tasks.errors import DataError, ZhpipeError
from tasks.source.schema import Source, require_verifiable, where
from tasks.util.io import atomic_write_text, file_sha256
from tasks.util.urls import is_internal, redact, redact_text, reveal

log = logging.getLogger("zhpipe")


class FetchParams(Section):
    """How a remote corpus is fetched and unpacked (the `download` section's settings)."""

    # per network read; a stalled server fails instead of hanging
    timeout_s: float = Field(60.0, gt=0)
    deadline_s: float = Field(3600.0, gt=0)  # the whole download, retries included
    # network errors and 5xx answers, with back-off; also sha256 mismatches
    retries: int = Field(3, ge=0)
    # the first back-off, doubled for each further attempt (at most 10x)
    retry_delay_s: float = Field(1.0, gt=0)
    max_bytes: int = Field(2 << 30, gt=0)  # largest file fetched (2 GiB)
    # largest file unpacked from .gz/.zip/.tar (8 GiB)
    max_unpacked_bytes: int = Field(8 << 30, gt=0)
    # unpacked / packed size beyond 1 MiB: more is a decompression bomb
    max_ratio: float = Field(100.0, gt=1)

    # how long to wait and how often to try again, not what is fetched: a download already cached
    # stays valid (the size limits stay in the key: a lower one must refuse a cached corpus it would
    # have refused to fetch)
    OUTSIDE_KEY = ("timeout_s", "deadline_s", "retries", "retry_delay_s")


class ChecksumError(DataError):
    """Downloaded or local bytes do not match the declared sha256."""


class NetworkError(ZhpipeError):
    """A transport error or a 5xx answer: worth another attempt."""


@dataclass
class Validators:
    """What a server says identifies a file's version: ETag, Last-Modified, size."""

    etag: str | None = None
    last_modified: str | None = None
    size: int | None = None

    @classmethod
    def of(cls, headers) -> Validators:
        size = headers.get("content-length")
        return cls(
            headers.get("etag"),
            headers.get("last-modified"),
            int(size) if size and size.isdigit() else None,
        )

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
            raise DataError(
                f"download {shown}: refused a redirect from https to "
                f"{redact(target).split('://')[0]}:// "
                f"({redact(target)})"
            )
        # a public server may not send us into this machine or its network
        if is_internal(target) and not is_internal(url):
            raise DataError(
                f"download {shown}: refused a redirect to an address of this machine or a private "
                "network "
                f"({redact(target)})"
            )
        url = target
    raise DataError(f"download {shown}: more than {max_redirects} redirects")


def probe(url: str, params: FetchParams) -> Validators:
    """The server's validators for `url` (a HEAD request), for keying an unverified download."""
    import httpx

    deadline = time.monotonic() + min(params.deadline_s, params.timeout_s * 2)
    try:
        with _client(params.timeout_s) as client:
            resp = _send(client, "HEAD", reveal(url), {}, deadline)
            resp.close()
            # no HEAD here: the headers of a GET, its body left unread
            if resp.status_code in (405, 501):
                resp = _send(client, "GET", reveal(url), {}, deadline)
                resp.close()
    except httpx.HTTPError as e:
        raise NetworkError(
            f"download {redact(url)}: {type(e).__name__}: {redact_text(str(e))}"
        ) from None
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


def _fetch_once(
    client, url: str, final: Path, part: Path, params: FetchParams, deadline: float
) -> Validators:
    """Download (or resume) `url` into `part`, then rename it to `final`."""
    shown = redact(url)
    meta = _read_meta(part)
    offset = part.stat().st_size if part.exists() else 0
    headers = {}
    # resume only when the server can tell us the file is unchanged
    if offset and meta.get("if_range"):
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
                raise NetworkError(
                    f"download {shown}: asked to resume at byte {offset}, the server sent "
                    "Content-Range "
                    f"from {start}"
                )
            validators.size = total
            mode = "ab"
        elif resp.status_code == 416:
            _discard(part)
            raise NetworkError(
                f"download {shown}: the server refused to resume (HTTP 416); starting again"
            )
        else:
            offset = 0
        if validators.size is not None and validators.size > params.max_bytes:
            raise DataError(
                f"download {shown}: {validators.size} bytes is over the size limit "
                f"download.max_bytes={params.max_bytes}"
            )
        # a Content-Encoding (gzip, br) is undone as the bytes arrive: Content-Length counts the
        # encoded bytes, the file holds the decoded ones, the ratio limit bounds them, and a resume
        # (a range of encoded bytes) is off
        encoded = resp.headers.get("content-encoding", "identity").strip().lower() not in (
            "",
            "identity",
        )
        atomic_write_text(
            _meta_path(part), json.dumps({"if_range": None if encoded else validators.if_range()})
        )
        written = _stream(resp, part, mode, offset, params, deadline, encoded, shown)
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


def _stream(
    resp,
    part: Path,
    mode: str,
    offset: int,
    params: FetchParams,
    deadline: float,
    encoded: bool,
    shown: str,
) -> int:
    """The response's bytes into `part` (appended from `offset` when resuming) as they arrive, so
    that the size, decoding-ratio and deadline limits are checked as they do; returns the file's
    size."""
    written = offset
    with open(part, mode) as f:
        for block in resp.iter_bytes():
            written += len(block)
            if written > params.max_bytes:
                f.close()
                _discard(part)
                raise DataError(
                    f"download {shown}: more than download.max_bytes={params.max_bytes} bytes; "
                    "stopped"
                )
            if (
                encoded
                and written > (1 << 20)
                and written / max(resp.num_bytes_downloaded, 1) > params.max_ratio
            ):
                f.close()
                _discard(part)
                raise DataError(
                    f"download {shown}: its {resp.headers['content-encoding']} transfer decodes to "
                    "more "
                    f"than {params.max_ratio:g}x its size (a decompression bomb?); stopped "
                    f"(download.max_ratio)"
                )
            if time.monotonic() > deadline:
                raise DataError(
                    f"download {shown}: deadline of {params.deadline_s:g} s passed after {written} "
                    "bytes "
                    f"(download.deadline_s)"
                )
            f.write(block)
    return written


def _content_range(value: str) -> tuple[int | None, int | None]:
    """(start, total) of `bytes start-end/total`."""
    try:
        unit, _, rest = value.partition(" ")
        span, _, total = rest.partition("/")
        return int(span.split("-")[0]), (int(total) if total.isdigit() else None)
    except ValueError:
        return None, None


def fetch(
    url: str,
    folder: Path,
    params: FetchParams,
    sha256: str | None = None,
    expect: Validators | None = None,
) -> Path:
    """The verified local copy of `url` in `folder`: resumed when partial, fetched again (at most
    `params.retries` times) after a network error or a sha256 mismatch; a mismatching file is
    deleted."""
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
                delay = params.retry_delay_s * min(2.0 ** (attempt - 1), 10.0)
                log.warning(
                    "download %s: %s; attempt %d of %d in %.3g s",
                    shown,
                    problem,
                    attempt + 1,
                    params.retries + 1,
                    delay,
                )
                if time.monotonic() + delay > deadline:
                    break
                time.sleep(delay)
            if final.is_file() and expect is not None and _read_meta(final) != expect.__dict__:
                log.warning(
                    "download %s: the server's file changed (%s); fetching it again",
                    shown,
                    expect.fingerprint(),
                )
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
        raise ChecksumError(
            f"{path}: sha256 mismatch (expected {expected}, got {actual}): the file changed since "
            "its "
            "sha256 was pinned; if the new content is intended, set source.sha256 to the new value"
        )
    return actual


def locate(
    source: Source,
    root: Path,
    folder_for: Callable[[str], Path],
    params: FetchParams,
    expect: Validators | None = None,
) -> tuple[Path, str]:
    """The local file holding the source bytes and their sha256: the given path when it exists, else
    a verified download (hashed once: a file that `fetch` returns matches `source.sha256`)."""
    local, url = where(source, root)
    if local is not None:
        return local, check_sha256(local, source.sha256)
    if url is not None:
        require_verifiable(source, root)
        path = fetch(url, folder_for(redact(url)), params, source.sha256, expect)
        return path, source.sha256 or file_sha256(path)
    raise DataError(
        f"source not found: {redact(source.path or source.url)} (no such file, and no "
        f"url to fetch it from)"
    )
