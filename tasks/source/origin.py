"""The source as the key plan and the download stage ask about it: where its bytes are and what
identifies them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.source import fetch, schema
from tasks.util.io import file_sha256, resolve_path
from tasks.util.urls import redact


class Origin:
    """One pipeline's source in one run (or one `zhpipe status`): a file's digest, a declared
    sha256, or, for an http(s) source allowed unverified, the server's ETag/Last-Modified/size. The
    server is asked once per URL and Origin, so the key a run plans with and the download's re-check
    use the same answer."""

    def __init__(self, source: schema.Source, root: Path, fetch_params: Any):
        self.source, self.root, self.fetch_params = source, root, fetch_params
        self._validators: dict[str, fetch.Validators] = {}
        # per file of the source: its key and its run tags hash it once
        self._fingerprints: dict[str, str] = {}

    def local(self, src: schema.Source | None = None) -> Path | None:
        """The local file of `src` (default: the pipeline's source), or None for a URL."""
        src = src or self.source
        return resolve_path(src.path, self.root) if src.path else None

    def fingerprint(self, src: schema.Source | None = None) -> str:
        """What identifies the raw bytes of `src` (one file of the source: the source itself, or a
        given split), computed once per Origin (a corpus of gigabytes is read once to plan a run,
        not once per use)."""
        src = src or self.source
        key = src.model_dump_json()
        if key not in self._fingerprints:
            self._fingerprints[key] = self._fingerprint(src)
        return self._fingerprints[key]

    def _fingerprint(self, src: schema.Source) -> str:
        local = self.local(src)
        if local is not None and local.is_file():
            return file_sha256(local)
        url = schema.require_verifiable(src, self.root)
        if src.sha256:
            return src.sha256
        if url:
            return f"unverified {redact(url)} {self.validators(src).fingerprint()}"
        return redact(src.path or src.url or "")

    def validators(self, src: schema.Source | None = None) -> fetch.Validators | None:
        """The server's validators of an http(s) source; None for a local file."""
        url = schema.fetched_location(src or self.source, self.root)
        if url is None:
            return None
        if url not in self._validators:
            self._validators[url] = fetch.probe(url, self.fetch_params)
        return self._validators[url]

    def expect(self, src: schema.Source) -> fetch.Validators | None:
        """What an unverified http(s) download must still match (the validators its key was planned
        with)."""
        return self.validators(src) if src.allow_unverified and not src.sha256 else None
