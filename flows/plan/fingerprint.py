"""What a stage key sees besides params and upstream keys: the code that computes the stage, the
versions of the libraries that shape its output, and the contents of the files its params name.

- Code: the stage's module and every project module it imports (transitively, lazy imports
  included), each as a hash of its syntax tree without docstrings, so comments, docstrings and
  formatting do not count but any change to what runs does.
- Libraries: each stage module's `LIBRARIES` (distribution names), at their installed versions.
- Files: each stage module's `FILES` (dotted paths into its params, `*` for list items); a local
  file or folder counts by content, a registered model (`models:/<name>@<alias>`) by the version it
  resolves to, anything else (a hub model id) by its name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from tasks.errors import ConfigError
from tasks.util.io import file_sha256, resolve_path
from tasks.util.usercode import tree_digest


def source_file(module: str) -> Path | None:
    """The file of a project module, found on disk: importlib's find_spec would import a dotted
    name's parents (and with them PyTorch, for a key that only hashes source text)."""
    import tasks

    base = Path(tasks.__file__).resolve().parent.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    import sys  # a stage or model module from outside the project (a plug-in), once it is imported

    loaded = getattr(sys.modules.get(module), "__file__", None)
    return Path(loaded) if loaded and loaded.endswith(".py") else None


@cache
def _module_info(module: str) -> tuple[str, tuple[str, ...]]:
    """(hash of the module's normalised syntax tree, the project modules it imports). Both are
    functions of the source text alone, so they are kept on disk by the text's sha256 (parsing every
    module again costs a noticeable part of an everyday command)."""
    text = source_file(module).read_bytes()
    cache, key = _code_cache(), hashlib.sha256(text).hexdigest()
    entry = cache.get(key)
    if entry is None:
        digest, imported = tree_digest(text)
        entry = [digest, sorted(m for m in imported if m.split(".")[0] == "tasks")]
        cache[key] = entry
        _CODE_CACHE["dirty"] = True
    return entry[0], tuple(m for m in entry[1] if _is_module(m))


_CODE_CACHE: dict[str, Any] = {}


def _code_cache() -> dict[str, list]:
    """source sha256 -> [tree digest, imported `tasks` names], from
    `<project>/data/_cache/code.json`; written back at exit when it grew."""
    if "entries" not in _CODE_CACHE:
        import atexit
        import json

        from flows.plan.project import current

        path = current().root / "data" / "_cache" / "code.json"
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = {}
        _CODE_CACHE.update(
            entries=entries if isinstance(entries, dict) else {}, path=path, dirty=False
        )
        atexit.register(_save_code_cache)
    return _CODE_CACHE["entries"]


def _save_code_cache() -> None:
    if not _CODE_CACHE.get("dirty"):
        return
    import json

    from tasks.util.io import atomic_write_text

    try:
        _CODE_CACHE["path"].parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(_CODE_CACHE["path"], json.dumps(_CODE_CACHE["entries"]))
    except OSError:
        pass  # a read-only project: parsed again next time


@cache
def _is_module(name: str) -> bool:
    try:
        return source_file(name) is not None
    except (ImportError, ValueError):
        return False


def code_fingerprint(module: str, skip: str | None = None) -> dict[str, str]:
    """Hash per project module that `module` runs (itself and what it imports, transitively);
    modules named `skip` or below it are left out, with what only they import."""
    seen: dict[str, str] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or (
            skip and name != module and (name == skip or name.startswith(skip + "."))
        ):
            continue
        digest, deps = _module_info(name)
        seen[name] = digest
        todo += [d for d in deps if d not in seen]
    return dict(sorted(seen.items()))


def library_versions(names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of the distributions that shape a stage's output ("missing" when
    absent)."""
    return {name: _version(name) for name in names}


@cache  # read once per process (each stage's key asks again)
def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


def _values(params: Any, dotted: str) -> list[str]:
    """The string values at a dotted path of a params dict (`*` walks a list)."""
    nodes = [params]
    for part in dotted.split("."):
        nxt = []
        for node in nodes:
            if part == "*" and isinstance(node, list):
                nxt += node
            elif isinstance(node, dict) and node.get(part) is not None:
                nxt.append(node[part])
        nodes = nxt
    return [v for v in nodes if isinstance(v, str)]


@lru_cache(maxsize=256)
def _content(path: Path, mtime_ns: int, size: int) -> str:
    """sha256 of a file, or of a folder's (relative path, file sha256) list; cached per mtime and
    size."""
    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for f in sorted(folder_files(path, "a setting", str(path))):
        h.update(f"{f.relative_to(path).as_posix()}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


def hub_revision(model_id: str) -> str:
    """`<id>@<commit>` of a hub model in the local Hugging Face cache, `<id>@absent` when it is not
    there (so a model that appears later changes the key, and an output built without it is not
    reused)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_id, "config.json")
    # not a valid repo id, or no huggingface_hub: the name is all there is
    except Exception:  # noqa: BLE001
        return model_id
    if isinstance(found, str) and "/snapshots/" in found:
        return f"{model_id}@{found.split('/snapshots/')[1].split('/')[0]}"
    return f"{model_id}@absent"


def file_fingerprints(
    params: dict[str, Any],
    paths: tuple[str, ...],
    root: Path,
    section: str = "",
    registry: Callable[[str], str] | None = None,
) -> dict[str, str]:
    """For each file a param names: `sha256:<hash>` of a local file or folder,
    `registry:<name>/<version>` of a registered model (`models:/...`, asked of `registry`), else
    `hub:<id>@<revision>` (its commit in the local Hugging Face cache, or `absent`); `section` names
    the params in errors."""
    out = {}
    for path in paths:
        dotted = f"{section}.{path}" if section else path
        for value in _values(params, path):
            if value.startswith("models:/"):
                if registry is None:
                    raise ConfigError(
                        f"{dotted}: {value} is a registered model, whose version is part of the "
                        "key; "
                        "this command cannot ask the model registry (`zhpipe run` "
                        "and `zhpipe status` do)"
                    )
                out[value] = "registry:" + registry(value)
                continue
            local = resolve_path(value, root)
            if local is not None and local.is_symlink() and not local.exists():
                raise ConfigError(f"{dotted}: {value} is a symbolic link to nothing")
            if local is not None and local.exists():
                stat = local.stat()
                newest = (
                    max(
                        (p.stat().st_mtime_ns for p in folder_files(local, dotted, value)),
                        default=stat.st_mtime_ns,
                    )
                    if local.is_dir()
                    else stat.st_mtime_ns
                )
                out[value] = "sha256:" + _content(local.resolve(), newest, stat.st_size)
            else:
                out[value] = "hub:" + hub_revision(value)
    return out


# a model folder holds a handful; a setting that names /usr is a mistake, not a model
MAX_FOLDER_FILES = 10_000


def folder_files(folder: Path, dotted: str, value: str) -> list[Path]:
    """The files of a folder a setting names (hashed into a key): a dangling link in it, or more
    than MAX_FOLDER_FILES files, is one clear error instead of a traceback or an unbounded walk."""
    files = []
    for p in folder.rglob("*"):
        if p.is_symlink() and not p.exists():
            raise ConfigError(f"{dotted}: {value} holds a symbolic link to nothing ({p})")
        if p.is_file():
            files.append(p)
            if len(files) > MAX_FOLDER_FILES:
                raise ConfigError(
                    f"{dotted}: {value} is a folder of more than {MAX_FOLDER_FILES:,} files; "
                    "expected a file or a model folder"
                )
    return files
