"""URLs that carry credentials: what may be shown of them, and where the real ones are kept.

A URL such as `https://user:pw@host/corpus.csv` or a presigned `...?X-Amz-Signature=...` is redacted
before it reaches anything that is stored or shown (MLflow params and tags, manifests, Prefect
parameters, logs, error lines). The configuration holds the redacted form; `conceal` keeps the real
URL in this process only, and `reveal` gives it back at the one place that connects (a download, the
stage store's file system).
"""

from __future__ import annotations

import re
import threading
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
# query parameters whose values are credentials: signatures, tokens, keys, passwords
# (case-insensitive, substring)
_SECRET_QUERY = re.compile(
    r"sig|signature|token|secret|password|passwd|pwd|key|auth|credential", re.IGNORECASE
)
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]{1,15}://[^\s'\"<>()\[\]{}]+")
_real: dict[str, str] = {}
_lock = threading.Lock()


def redact(url: str) -> str:
    """`url` with its user info and credential-like query values replaced by `***`; other text is
    unchanged."""
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return _URL_IN_TEXT.sub(lambda m: m.group(0).split("://")[0] + "://" + MASK, url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    secret_query = any(_SECRET_QUERY.search(k) for k, _ in pairs)
    if "@" not in parts.netloc and not secret_query:
        return url  # nothing to hide: the URL exactly as given
    netloc = f"{MASK}@{parts.netloc.rpartition('@')[2]}" if "@" in parts.netloc else parts.netloc
    query = (
        urlencode([(k, MASK if _SECRET_QUERY.search(k) else v) for k, v in pairs], safe="*")
        if secret_query
        else parts.query
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_webhook(url: str) -> str:
    """A webhook URL as it may be shown: redacted (`redact`), and its path after the first segment
    masked too, where chat services keep the secret (Slack's `/services/T.../B.../XXXX`, Feishu's
    `/open-apis/bot/v2/hook/<token>`, Discord's `/api/webhooks/<id>/<token>`)."""
    shown = redact(url)
    try:
        parts = urlsplit(shown)
    except ValueError:
        return MASK
    segments = parts.path.split("/")
    if len(segments) > 2:
        path = "/".join(segments[:2]) + "/" + MASK
    else:
        path = parts.path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


# a URL's authority up to its last `@`: the user info, whatever characters it holds (`(`, `)`, `'`,
# `"`, ...)
_USER_INFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]{1,15}://)[^\s/?#]*@")


def redact_text(text: str) -> str:
    """Every URL inside a message redacted (error lines, log lines). The user info is found by the
    URL's structure (scheme, then the authority up to its last `@`), not by which characters a
    password may hold."""
    if "://" not in text:
        return text
    text = _USER_INFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    return _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text)


def has_secret(url: str) -> bool:
    return redact(url) != url


def conceal(url: str | None) -> str | None:
    """The redacted form of `url`, remembering the real one in this process for `reveal`."""
    if not url or not has_secret(url):
        return url
    shown = redact(url)
    with _lock:
        _real[shown] = url
    return shown


def reveal(url: str | None) -> str | None:
    """The real URL behind a concealed one (itself when nothing was concealed)."""
    if not url:
        return url
    with _lock:
        return _real.get(url, url)


def is_loopback(url: str) -> bool:
    """Whether the URL's host is this machine: `localhost` or a loopback IP address (127.0.0.0/8,
    ::1). A name that merely starts with `127.` (`127.attacker.example`) is not."""
    import ipaddress

    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_internal(url: str) -> bool:
    """Whether the URL's host is this machine or a private network: a loopback, private, link-local
    (cloud metadata, 169.254.169.254) or unspecified address, given or resolved from the name."""
    import ipaddress
    import socket

    host = (urlsplit(url).hostname or "").lower()
    if not host:
        return False
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            addresses = [
                ipaddress.ip_address(info[4][0].split("%")[0])
                for info in socket.getaddrinfo(host, None)
            ]
        except (OSError, UnicodeError, ValueError):
            return False  # a name that does not resolve cannot be reached either
    return any(
        a.is_loopback or a.is_private or a.is_link_local or a.is_unspecified or a.is_reserved
        for a in addresses
    )


# fsspec options as JSON: where a store's credentials go, never in its URL
OPTIONS_ENV = "ZHPIPE_STORAGE_OPTIONS"


def check_storage_url(url: str | None, where: str = "storage") -> None:
    """One line, the secret masked, for a storage URL that holds credentials
    (`s3://KEY:SECRET@host/bucket`): a URL is shown in messages, tracebacks, Prefect's flow
    parameters and `doctor`, so a secret in it ends up in all of them. Credentials come from the
    environment (AWS_ACCESS_KEY_ID, AWS_PROFILE) or ZHPIPE_STORAGE_OPTIONS."""
    if not url or "://" not in str(url):
        return
    from tasks.errors import ConfigError

    try:
        netloc = urlsplit(str(url)).netloc
    except ValueError:
        netloc = str(url).split("://", 1)[1].split("/", 1)[0]
    if "@" in netloc:
        raise ConfigError(
            f"{where} {redact(str(url))}: a storage URL must not hold credentials (they would be "
            "shown "
            f"wherever the URL is); give them in the environment (AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) or as fsspec options in {OPTIONS_ENV}, e.g. "
            f'\'{{"username": "...", "password": "..."}}\''
        )


def storage_options() -> dict:
    """ZHPIPE_STORAGE_OPTIONS: fsspec options (JSON) for the store, such as an FTP server's username
    and password."""
    import json
    import os

    from tasks.errors import ConfigError

    text = os.environ.get(OPTIONS_ENV)
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError:
        options = None
    if not isinstance(options, dict):
        raise ConfigError(
            f"{OPTIONS_ENV}: expected a JSON object of fsspec options, such as "
            f'\'{{"username": "u", "password": "p"}}\''
        )
    return options
