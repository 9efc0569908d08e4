"""`zhpipe status`: each stage as cached, stale or missing, and for a stale one why: which of its
key's causes differ from its most recent output in the store (a param, code, a library version, a
named file, upstream)."""

from __future__ import annotations

from typing import Any

from flows.plan import project
from flows.plan.cache import StageCache
from flows.plan.config import flatten
from flows.plan.fingerprint import source_file
from flows.plan.store import CorruptManifest, Manifest, StageStore


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def diff_causes(stage: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed between two key-cause records of one stage, one short phrase per cause."""
    if not old:
        return ["built by an older zhpipe (its causes were not recorded)"]
    why = []
    before, after = flatten(old.get("params", {})), flatten(new.get("params", {}))
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            change = f"{_short(before.get(key))} -> {_short(after.get(key))}"
            named = {
                "source.label_column": "label column",
                "source.text_column": "text column",
            }.get(key)
            why.append(
                f"{named} changed: {change}"
                if named
                else f"param {stage.split('.')[0]}.{key}: {change}"
            )
    for name in sorted(set(old.get("inputs", {})) | set(new.get("inputs", {}))):
        if old.get("inputs", {}).get(name) != new.get("inputs", {}).get(name):
            why.append("source file changed" if name == "source" else f"upstream {name} changed")
    code_old, code_new = old.get("code", {}), new.get("code", {})
    for module in sorted(set(code_old) | set(code_new)):
        if code_old.get(module) != code_new.get(module):
            # a package's: its __init__.py
            found = None if module.endswith(".py") else source_file(module)
            root = project.current().root
            shown = (
                found.relative_to(root).as_posix()
                if found and found.is_relative_to(root)
                else module
                if module.endswith(".py")
                else f"{module.replace('.', '/')}.py"
            )
            why.append(
                f"code of {shown} changed" if module.endswith(".py") else f"code {shown} changed"
            )
    libs_old, libs_new = old.get("libraries", {}), new.get("libraries", {})
    for lib in sorted(set(libs_old) | set(libs_new)):
        if libs_old.get(lib) != libs_new.get(lib):
            why.append(f"library {lib} {libs_old.get(lib, 'none')} -> {libs_new.get(lib, 'none')}")
    files_old, files_new = old.get("files", {}), new.get("files", {})
    for name in sorted(set(files_old) | set(files_new)):
        if files_old.get(name) != files_new.get(name):
            why.append(f"file {name} changed")
    return why or ["no recorded cause differs (forced rebuild elsewhere?)"]


def latest_other(
    store: StageStore, stage: str, key: str, pipeline: str | None = None
) -> Manifest | None:
    """The most recently built other output of `stage` in the store by `pipeline` (when given;
    outputs of an older zhpipe, which did not record their pipeline, count too), or None: another
    pipeline's build explains nothing."""
    manifests = []
    for other in store.others(stage, key):
        try:
            manifest = store.manifest(stage, other)
        except CorruptManifest:  # not a build to explain with (`zhpipe verify` names it)
            continue
        if pipeline is None or manifest.pipeline in (pipeline, None):
            manifests.append(manifest)
    return max(manifests, key=lambda m: m.created, default=None)


def stage_states(
    store: StageStore,
    causes: dict[str, dict[str, Any]],
    keys: dict[str, str],
    pipeline: str | None = None,
) -> list[dict[str, Any]]:
    """Per stage: state (cached, stale, missing), key, rows, build seconds, and why when stale."""
    rows, cache = [], StageCache(store)
    for stage, key in keys.items():
        if cache.published(stage, key):
            try:
                m = store.manifest(stage, key)
            except CorruptManifest as e:  # the next run rebuilds it
                rows.append(
                    {
                        "stage": stage,
                        "state": "corrupt",
                        "key": key,
                        "rows": None,
                        "seconds": None,
                        "why": [f"{e}: the next run rebuilds it"],
                    }
                )
                continue
            rows.append(
                {
                    "stage": stage,
                    "state": "cached",
                    "key": key,
                    "rows": m.rows,
                    "seconds": m.seconds,
                    "why": [],
                }
            )
            continue
        previous = latest_other(store, stage, key, pipeline)
        if previous is None:
            rows.append(
                {
                    "stage": stage,
                    "state": "missing",
                    "key": key,
                    "rows": None,
                    "seconds": None,
                    "why": [missing_reason(store, stage, key, causes[stage])],
                }
            )
        else:
            rows.append(
                {
                    "stage": stage,
                    "state": "stale",
                    "key": key,
                    "rows": None,
                    "seconds": None,
                    "why": diff_causes(stage, previous.causes, causes[stage]),
                }
            )
    return rows


def missing_reason(store: StageStore, stage: str, key: str, causes: dict[str, Any]) -> str:
    """Why a stage this pipeline never built is missing: never built in this store, or how the
    newest build of another pipeline differs from what this one needs (`label column changed: label
    -> cat`, `source file changed`)."""
    other = latest_other(store, stage, key)
    if other is None:
        return "never built in this store"
    why = diff_causes(stage, other.causes, causes)
    source = [
        w for w in why if w == "source file changed" or w.startswith("param download.source.path")
    ]
    if source and len(why) == len(source):
        return "never built for this source"
    by = f"pipeline {other.pipeline}" if other.pipeline else "another pipeline"
    return f"never built for this pipeline; {by}'s build differs: {'; '.join(why[:3])}" + (
        f" (+{len(why) - 3} more)" if len(why) > 3 else ""
    )
