"""Content-addressed stage store: the one place that decides where a stage's output lives.

Layout: `<root>/<stage>/<key>/` holds a finished output and its `manifest.json`; an output is built
in `<root>/<stage>/.tmp-<key>-<pid>/` and renamed into place, so a killed run never leaves a
half-written folder that counts as done. `<root>/<stage>/.scratch-<key>/` holds what a killed build
resumes from, and `<root>/<stage>/.lock-<key>` makes concurrent runs build each output once (on an
object store, where a file lock cannot reach other machines, a Prefect global concurrency limit per
key does).

The root is a local folder or any fsspec URL (s3://, gs://, a shared file system). For a remote root
the outputs are built in, and read from, a local mirror (`ZHPIPE_CACHE`, default
`<project>/data/.remote/<root hash>`); publishing uploads the files first and `manifest.json` last,
so an output counts as done only once all of it is there, on every machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tasks.errors import ZhpipeError
from tasks.util.io import atomic_write_text, file_sha256
from tasks.util.procs import alive
from tasks.util.urls import check_storage_url, conceal, redact, reveal, storage_options

MANIFEST = "manifest.json"
# files up to this size are hashed on every reuse; larger ones with --verify
HASH_ON_REUSE_BYTES = 8 << 20
log = logging.getLogger("zhpipe")


def unit_folder(unit: str) -> str:
    """The store folder of a unit: a partition unit (`clean:2026-12-01.csv`) lives in its stage's
    folder beside the stage's gathered outputs, told apart by key; a model unit (`train.textcnn`)
    has a folder of its own."""
    return unit.split(":", 1)[0]


def stage_key(causes: dict[str, Any]) -> str:
    """Hash of everything that determines a stage's output (see
    flows.orchestrate.execute.key_causes)."""
    blob = json.dumps(causes, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Manifest:
    """What a finished stage output records about itself."""

    stage: str
    key: str
    params: dict[str, Any]
    inputs: dict[str, str]
    rows: int | None
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    # what the stage tells later stages (tasks.core.Facts)
    facts: dict[str, Any] = field(default_factory=dict)
    mlflow_run_id: str | None = None  # the stage run that logged this output's artifacts
    created: float = field(default_factory=time.time)
    # what the key hashed: `zhpipe status` diffs these
    causes: dict[str, Any] = field(default_factory=dict)
    # relative path -> {size, sha256}: checked on reuse
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the pipeline whose run built it: `zhpipe status` explains a pipeline by its own builds
    pipeline: str | None = None

    @classmethod
    def from_json(cls, text: str, where: str = MANIFEST) -> Manifest:
        """A manifest from its JSON (fields this version does not know are ignored);
        `CorruptManifest` naming `where` when it is not one (truncated, edited, not UTF-8)."""
        try:
            doc = json.loads(text)
            manifest = cls(**{k: v for k, v in doc.items() if k in cls.__dataclass_fields__})
            if not isinstance(manifest.files, dict) or not isinstance(manifest.key, str):
                raise TypeError("'files' or 'key' of the wrong type")
            return manifest
        except (ValueError, TypeError, AttributeError) as e:
            raise CorruptManifest(where, str(e).splitlines()[0][:120]) from None

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptManifest(str(path), f"not UTF-8 ({e.reason})") from None
        return cls.from_json(text, str(path))

    def write(self, folder: Path) -> None:
        atomic_write_text(folder / MANIFEST, json.dumps(asdict(self), indent=2, ensure_ascii=False))


class CorruptManifest(ZhpipeError):
    """A manifest that cannot be read as one: its output counts as missing (rebuilt) and as corrupt
    (`verify`)."""

    def __init__(self, where: str, reason: str):
        self.where, self.reason = where, reason
        super().__init__(f"{where}: unreadable manifest ({reason})")


def _fsync_dir(folder: Path) -> None:
    """Make a folder's entries (new files, renames) durable."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_remote(root: str | Path) -> bool:
    """Whether a storage root is an fsspec URL other than a local path or file:// URL."""
    text = str(root)
    return "://" in text and not text.startswith("file://")


def local_root(root: str | Path) -> Path:
    """The local folder of a plain path or file:// URL."""
    text = str(root)
    if text.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(text).path))
    return Path(text).expanduser()


# attempts at each request to an S3 store (botocore's standard retry mode: jittered backoff doubling
# to 20 s): an object store that does not answer for a minute or two is waited out; reads and writes
# of whole objects are safe to repeat
S3_ATTEMPTS = 16


def _retrying(url: str) -> dict:
    """fsspec options that make a request to the store retry where a retry is safe (S3;
    AWS_MAX_ATTEMPTS still wins)."""
    if not url.startswith(("s3://", "s3a://")) or os.environ.get("AWS_MAX_ATTEMPTS"):
        return {}
    return {"config_kwargs": {"retries": {"max_attempts": S3_ATTEMPTS, "mode": "standard"}}}


class StageStore:
    """Finds, creates and publishes stage outputs under one root: a local folder or an fsspec
    URL."""

    def __init__(self, root: str | Path, cache: Path | None = None):
        # what messages, tags and Prefect parameters show; the real URL only connects
        self.url = redact(str(root))
        self.fs = None
        # remote manifests read by this store: one GET per output
        self._manifests: dict[tuple[str, str], Manifest] = {}
        check_storage_url(reveal(str(root)))
        if is_remote(root):
            import fsspec

            self.fs, self.base = fsspec.core.url_to_fs(
                reveal(str(root)), **_retrying(str(root)), **storage_options()
            )
            self.base = self.base.rstrip("/")
            if cache is None and not os.environ.get("ZHPIPE_CACHE"):
                from flows.plan.project import current

                cache = current().data / ".remote"
            mirror = cache or Path(os.environ["ZHPIPE_CACHE"])
            # the local mirror
            self.root = mirror / hashlib.sha256(self.url.encode()).hexdigest()[:12]
        else:
            self.root = local_root(root)

    def __repr__(self) -> str:
        return f"StageStore({self.url!r})"

    def path(self, stage: str, key: str) -> Path:
        """The local folder of an output (for a remote root: its mirror, see `local`)."""
        return self.root / unit_folder(stage) / key

    def _remote(self, stage: str, *parts: str) -> str:
        return "/".join((self.base, stage, *parts))

    def remote_url(self, local_path: str) -> str:
        """The object-store URL of a file in the local mirror of a remote root (what Dask workers on
        other machines read); a local root's paths are returned as they are."""
        path = Path(local_path)
        if self.fs is None or not path.is_relative_to(self.root):
            return local_path
        if self.url != reveal(self.url):
            raise ZhpipeError(
                f"storage {self.url}: a Dask cluster on other machines cannot be given a storage "
                "URL "
                f"with credentials; give the workers their credentials in their environment (e.g. "
                f"AWS_ACCESS_KEY_ID) instead"
            )
        return self.fs.unstrip_protocol(self._remote(*path.relative_to(self.root).parts))

    def is_done(self, stage: str, key: str) -> bool:
        if self.fs is not None:
            return self._remote_manifest(stage, key) is not None
        return (self.path(stage, key) / MANIFEST).is_file()

    def manifest(self, stage: str, key: str) -> Manifest:
        if self.fs is not None:
            found = self._remote_manifest(stage, key)
            if found is None:
                raise FileNotFoundError(self._remote(unit_folder(stage), key, MANIFEST))
            return found
        return Manifest.read(self.path(stage, key))

    def _remote_manifest(self, stage: str, key: str) -> Manifest | None:
        """The output's manifest in the object store (one GET, kept: a key's output does not change
        unless this store retracts it), or None while it is not published."""
        memo = (str(stage), str(key))
        if memo not in self._manifests:
            where = self._remote(unit_folder(stage), key, MANIFEST)
            try:
                text = self.fs.cat_file(where)
            except FileNotFoundError:
                return None
            self._manifests[memo] = Manifest.from_json(
                text.decode("utf-8", errors="replace"), where
            )
        return self._manifests[memo]

    def local(self, stage: str, key: str) -> Path:
        """A local folder holding the finished output; a remote one is downloaded into the mirror
        once."""
        folder = self.path(stage, key)
        if self.fs is None or (folder / MANIFEST).is_file():
            return folder
        tmp = folder.with_name(f".get-{key}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.fs.get(self._remote(unit_folder(stage), key) + "/", str(tmp) + "/", recursive=True)
        if not (tmp / MANIFEST).is_file():
            raise FileNotFoundError(
                f"{self._remote(unit_folder(stage), key)}: no {MANIFEST} after download"
            )
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        return folder

    def others(self, stage: str, key: str) -> list[str]:
        """Keys of other finished outputs of this stage (their presence makes `key` stale, not
        missing)."""
        if self.fs is not None:
            if not self.fs.exists(self._remote(unit_folder(stage))):
                return []
            names = [
                p.rstrip("/").rsplit("/", 1)[-1]
                for p in self.fs.ls(self._remote(unit_folder(stage)), detail=False)
            ]
            return [
                n
                for n in names
                if n != key
                and not n.startswith(".")
                and self.fs.exists(self._remote(unit_folder(stage), n, MANIFEST))
            ]
        folder = self.root / unit_folder(stage)
        if not folder.is_dir():
            return []
        return [p.name for p in folder.iterdir() if p.name != key and (p / MANIFEST).is_file()]

    def begin(self, stage: str, key: str) -> Path:
        """A fresh temporary folder to build an output in; those of killed builds of this key are
        removed."""
        for old in (self.root / unit_folder(stage)).glob(f".tmp-{key}-*"):
            pid = old.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        tmp = self.root / unit_folder(stage) / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp

    def publish(self, tmp: Path, manifest: Manifest) -> Path:
        """Record every file's size and sha256 in the manifest, make the files durable (fsync),
        write the manifest last, then rename the folder into place (atomic on one file system)."""
        manifest.files = {}
        for path in sorted(p for p in tmp.rglob("*") if p.is_file() and p.name != MANIFEST):
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            manifest.files[path.relative_to(tmp).as_posix()] = {
                "size": path.stat().st_size,
                "sha256": file_sha256(path),
            }
        manifest.write(tmp)
        _fsync_dir(tmp)
        final = self.path(manifest.stage, manifest.key)
        if final.exists():  # forced rebuild or a concurrent run: replace the old output
            trash = final.with_name(f".old-{final.name}-{os.getpid()}")
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(final.parent)
        if self.fs is not None:
            self._upload(final, manifest)
        return final

    def verify(self, stage: str, key: str, full: bool = False) -> list[str]:
        """Problems of a finished output against its manifest (empty when sound): every file's size,
        and its sha256 when `full` or the file is small enough to hash on every reuse."""
        folder = self.local(stage, key)
        try:
            manifest = Manifest.read(folder)
        except CorruptManifest as e:
            return [str(e)]
        problems = []
        root = folder.resolve()
        listed = set(manifest.files)
        # a file the manifest does not list (added, or one whose entry was removed) is a problem too
        if full:
            for path in sorted(folder.rglob("*")):
                rel = path.relative_to(folder).as_posix()
                if path.is_file() and rel != MANIFEST and rel not in listed:
                    problems.append(f"{rel}: not in the manifest")
        for rel, facts in manifest.files.items():
            path = folder / rel
            if (
                Path(rel).is_absolute()
                or not path.resolve().is_relative_to(root)
                or path.is_symlink()
            ):
                problems.append(f"{rel}: a manifest path outside the output")
                continue
            if not path.is_file():
                problems.append(f"{rel}: missing")
            elif path.stat().st_size != facts["size"]:
                problems.append(
                    f"{rel}: {path.stat().st_size} bytes, manifest says {facts['size']}"
                )
            elif (full or facts["size"] <= HASH_ON_REUSE_BYTES) and file_sha256(path) != facts[
                "sha256"
            ]:
                problems.append(f"{rel}: sha256 differs from the manifest")
        return problems

    def discard(self, stage: str, key: str) -> None:
        """Remove a finished output (a corrupt one), remote copy included, so it is rebuilt."""
        self._manifests.pop((str(stage), str(key)), None)
        if self.fs is not None and self.fs.exists(self._remote(unit_folder(stage), key, MANIFEST)):
            self.fs.rm_file(self._remote(unit_folder(stage), key, MANIFEST))
        folder = self.path(stage, key)
        if folder.exists():
            trash = folder.with_name(f".old-{key}-{os.getpid()}")
            os.replace(folder, trash)
            shutil.rmtree(trash, ignore_errors=True)

    def _upload(self, final: Path, manifest: Manifest) -> None:
        """Every file of the output, then its manifest: readers elsewhere see it done only when
        complete."""
        target = self._remote(unit_folder(manifest.stage), manifest.key)
        self._manifests.pop((str(manifest.stage), str(manifest.key)), None)
        # a forced rebuild: retract the old output first
        if self.fs.exists(target + "/" + MANIFEST):
            self.fs.rm_file(target + "/" + MANIFEST)
        for path in sorted(final.rglob("*")):
            if path.is_file() and path.name != MANIFEST:
                rel = path.relative_to(final).as_posix()
                self.fs.makedirs(f"{target}/{rel}".rsplit("/", 1)[0], exist_ok=True)
                self.fs.put_file(str(path), f"{target}/{rel}")
        self.fs.put_file(str(final / MANIFEST), f"{target}/{MANIFEST}")

    @contextlib.contextmanager
    def lock(self, stage: str, key: str, shared: Callable[[str, str], Any] | None = None):
        """Hold the key's lock (a file lock, so it works across processes): two runs that need the
        same output build it once; the second waits, then finds it done. On an object store,
        `shared(name, waiting)` is the lock across machines (the orchestration passes a Prefect
        global concurrency slot)."""
        from filelock import FileLock, Timeout

        (self.root / unit_folder(stage)).mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.root / unit_folder(stage) / f".lock-{key}")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log.info("%s: another run is building %s; waiting for it", stage, key)
            lock.acquire()
        try:
            if self.fs is None or shared is None:
                yield
            # an object store: the file lock covers this machine only; the shared lock covers all
            else:
                name = (
                    "zhpipe-store-"
                    + hashlib.sha256(f"{self.url}|{stage}|{key}".encode()).hexdigest()[:16]
                )
                with shared(name, f"{stage}: another machine is building {key}; waiting for it"):
                    yield
        finally:
            lock.release()

    def scratch(self, stage: str, key: str) -> Path:
        """A folder kept across attempts at one key (training checkpoints), so a killed build can
        resume; removed once the output is published."""
        folder = self.root / unit_folder(stage) / f".scratch-{key}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def cache_file(self, name: str) -> Path:
        """A file shared by all runs on this store (e.g. the translation cache)."""
        folder = self.root / "_cache"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / name

    def derived(self, name: str, compute: Callable[[], str]) -> str:
        """A value computed from files' contents, kept in `_cache/<name>`: `name` holds those files'
        sha256, so a kept value is never stale. Computed once, then read."""
        path = self.cache_file(name)
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError:
            pass
        value = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, value)
        return value

    def downloads(self, url: str) -> Path:
        """Folder for a URL's downloaded bytes, kept across attempts so a partial file can
        resume."""
        folder = self.root / "_downloads" / hashlib.sha256(url.encode()).hexdigest()[:16]
        folder.mkdir(parents=True, exist_ok=True)
        return folder


def storage_root(config, explicit: str | None = None) -> str:
    """The stage store root: --storage, else ZHPIPE_STORAGE (or the older ZHPIPE_DATA), else the
    pipeline's `storage`, else the project's data/. A folder or an fsspec URL, without credentials
    (`check_storage_url`)."""
    for where, url in (
        ("--storage", explicit),
        ("ZHPIPE_STORAGE", os.environ.get("ZHPIPE_STORAGE")),
        ("storage", config.storage),
    ):
        check_storage_url(url, where)
    return conceal(
        explicit
        or os.environ.get("ZHPIPE_STORAGE")
        or os.environ.get("ZHPIPE_DATA")
        or config.storage
        or str(_project_data())
    )


def _project_data() -> Path:
    from flows.plan.project import current

    return current().data
