"""The stage cache, after DVC's: a unit's key (the hash of what it was planned from) names its
output in the stage store. `lookup` is the one reuse decision (published, not forced by `--force`,
and sound against its manifest: a corrupt output is reported in one line, removed and missed, for
this run to rebuild);
`restore` reads a published output as the `StageResult` the next stage takes; `begin` and `save`
build a new one beside the store and publish it atomically. The store (flows/plan/store.py) keeps
the files, locks and the remote copy; this module decides what is reused."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.plan.store import Manifest, StageStore, stage_key
from tasks.core import Facts, Unit, established
from tasks.errors import ZhpipeError
from tasks.util.io import atomic_write_text

log = logging.getLogger("zhpipe")


@dataclass
class StageResult:
    """What a stage task hands to the next: a path and a few facts, never the data itself."""

    stage: Unit  # the unit it is the output of
    key: str
    path: Path
    cache: str  # "hit" or "miss"
    seconds: float
    rows: int | None
    metrics: dict[str, float]
    facts: Facts
    run_id: str | None = None  # the MLflow run this pipeline run tracked it in
    parts: dict[str, StageResult] = field(default_factory=dict)  # train/evaluate: their model units


@dataclass
class StageCache:
    """Reuse by key: lookup, restore, begin/save (a build published atomically), verify."""

    store: StageStore
    full: bool = False  # hash every file of a reused output, not only the small ones (`--verify`)
    # the stages `--force` rebuilds: nothing of them is looked up, reused by content or resumed (a
    # model or partition unit follows its stage); what the run reads of them is still read
    force: set[str] = field(default_factory=set)

    @staticmethod
    def keys(causes: dict[str, dict[str, Any]]) -> dict[str, str]:
        """Each unit's key: the hash of everything its output depends on (flows/plan/keys.py plans
        `causes`)."""
        return {unit: stage_key(c) for unit, c in causes.items()}

    def published(self, unit: str, key: str) -> bool:
        """Whether the unit has a published output under `key` (not verified: `lookup` verifies).
        The one place anything asks the store whether a unit is built."""
        return self.store.is_done(unit, key)

    def forced(self, unit: str) -> bool:
        return Unit.parse(unit).stage in self.force

    def lookup(self, unit: str, key: str) -> Manifest | None:
        """The manifest of the unit's published output under `key` when it is there and sound, else
        None (a corrupt one is reported and removed; a forced unit's is not looked for)."""
        return None if self.forced(unit) else self._found(unit, key)[0]

    def _found(self, unit: str, key: str) -> tuple[Manifest | None, bool]:
        """(the sound manifest or None, whether an output was there)."""
        if not self.published(unit, key):
            return None, False
        problems = self.verify(unit, key)
        if problems:
            log.warning(
                "%s: cached output %s is corrupt (%s); rebuilding it",
                unit,
                key,
                "; ".join(problems[:3]),
            )
            self.store.discard(unit, key)
            return None, True
        return self.store.manifest(unit, key), True

    def verify(self, unit: str, key: str) -> list[str]:
        """What is wrong with a published output against its manifest (empty when sound)."""
        return self.store.verify(unit, key, full=self.full)

    def restore(self, manifest: Manifest, cache: str = "hit", seconds: float = 0.0) -> StageResult:
        """A published output as the next stage takes it (a remote one downloaded into the local
        mirror)."""
        return StageResult(
            stage=Unit.parse(manifest.stage),
            key=manifest.key,
            path=self.store.local(manifest.stage, manifest.key),
            cache=cache,
            seconds=round(seconds, 3),
            rows=manifest.rows,
            metrics=manifest.metrics,
            facts=Facts.from_json(manifest.facts),
        )

    def reuse(self, unit: str, key: str) -> StageResult:
        """A unit this run does not build (before --from, a model evaluate reads): its output, or
        one clear error."""
        manifest, there = self._found(unit, key)
        if not there:
            raise ZhpipeError(
                f"stage '{unit}' has no cached output for this config (key {key}); run it first, "
                "e.g. "
                f"`zhpipe run --to {Unit.parse(unit).stage}`"
            )
        if manifest is None:
            raise ZhpipeError(
                f"stage '{unit}': its cached output {key} failed verification and was removed; "
                f"rebuild it with `zhpipe run --from {Unit.parse(unit).stage}`"
            )
        return self.restore(manifest)

    def begin(self, unit: str, key: str) -> tuple[Path, Path]:
        """(a temporary folder to build in, the unit's scratch folder to resume from; emptied when
        `fresh`)."""
        tmp, scratch = self.store.begin(unit, key), self.store.scratch(unit, key)
        if self.forced(unit):  # --force means from scratch, not from the last checkpoint
            shutil.rmtree(scratch)
            scratch.mkdir()
        return tmp, scratch

    def save(self, tmp: Path, manifest: Manifest) -> Path:
        """Publish a built folder under its key with its manifest (files hashed, made durable,
        renamed into place)."""
        return self.store.publish(tmp, manifest)

    # ---- reuse by content: a stage's `content=` files (tasks/graph.py), as DVC's run cache ----

    def content_key(self, causes: dict, inputs: dict[str, StageResult], files) -> str | None:
        """The hash of a unit's key causes with its inputs' keys replaced by what it reads of them:
        a file's sha256 (its manifest records it), or for `(need, file, columns)` the digest of
        those columns of a Parquet file (`column_digest`); None when one is missing."""
        read = {}
        for need, name, *columns in files:
            result = inputs.get(need)
            entry = Manifest.read(result.path).files.get(name) if result is not None else None
            if entry is None:
                return None
            read[f"{need}/{name}"] = (
                self.column_digest(result.path / name, entry["sha256"], columns[0])
                if columns
                else entry["sha256"]
            )
        return stage_key({**causes, "inputs": read})

    def column_digest(self, path: Path, sha256: str, columns: tuple[str, ...]) -> str:
        """The sha256 of `columns` of a Parquet file (`_column_sha256`), kept in the store's cache
        under the file's own sha256."""
        return self.store.derived(
            f"columns/{sha256}-{'-'.join(columns)}", lambda: _column_sha256(path, columns)
        )

    def _content_record(self, unit: str, content: str) -> Path:
        return self.store.cache_file("by-content") / str(unit) / f"{content}.json"

    def reuse_content(
        self, unit: Unit, key: str, causes, inputs: dict[str, StageResult], files, pipeline
    ) -> Manifest | None:
        """An output of this unit built under another key from the same content (the same params,
        code, libraries and bytes of the files it reads), published again under `key` (its files
        linked, not copied) and returned; None when there is none, or it is gone or unsound (or the
        stage reads no such files, or its causes are unknown)."""
        if not files or not causes or self.forced(unit):
            return None
        content = self.content_key(causes, inputs, files)
        record = self._content_record(unit, content) if content else None
        try:
            entry = json.loads(record.read_text(encoding="utf-8")) if record else None
        except (OSError, ValueError):
            entry = None
        old = self.lookup(unit, entry["key"]) if entry else None
        # the record is believed only for a build of the same params, code, libraries and files
        if old is None or stage_key({**old.causes, "inputs": {}}) != stage_key(
            {**causes, "inputs": {}}
        ):
            return None
        tmp, scratch = self.begin(unit, key)
        try:
            _linked(self.store.local(unit, old.key), tmp, old.files)
        except OSError as e:  # removed meanwhile (gc): built instead
            log.info("%s: %s could not be reused (%s); building", unit, old.key, e)
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        own = Facts.from_json(entry["facts"])
        manifest = Manifest(
            stage=unit,
            key=key,
            params=causes["params"],
            inputs={n: r.key for n, r in inputs.items()},
            rows=old.rows,
            seconds=old.seconds,
            metrics=old.metrics,
            facts=established(unit.stage, {n: r.facts for n, r in inputs.items()}, own).to_json(),
            mlflow_run_id=old.mlflow_run_id,
            causes=causes,
            pipeline=pipeline,
        )
        self.save(tmp, manifest)
        shutil.rmtree(scratch, ignore_errors=True)
        read = ", ".join(
            f"{need}'s {name}" + (f" ({', '.join(columns[0])})" if columns else "")
            for need, name, *columns in files
        )
        log.info(
            "%s: reused by content (%s): built as %s from the same %s", unit, key, old.key, read
        )
        return manifest

    def remember_content(
        self, manifest: Manifest, inputs: dict[str, StageResult], files, own: Facts
    ) -> None:
        """Record a unit's new output under its content key, for `reuse_content`."""
        content = self.content_key(manifest.causes, inputs, files)
        if content:
            record = self._content_record(manifest.stage, content)
            record.parent.mkdir(parents=True, exist_ok=True)
            doc = {"key": manifest.key, "facts": own.to_json()}
            atomic_write_text(record, json.dumps(doc, ensure_ascii=False))


def _column_sha256(path: Path, columns: tuple[str, ...]) -> str:
    """The sha256 of `columns` of a Parquet file, value by value in row order (not the file's bytes,
    which also hold the columns a stage does not read)."""
    import hashlib

    import numpy as np

    from tasks.util.io import iter_frames

    h = hashlib.sha256(json.dumps(columns).encode())
    for frame in iter_frames(path, columns=list(columns)):
        for column in columns:
            values = frame[column].tolist()
            # lengths (-1: missing), then the text: no two lists of values hash alike
            lengths = [-1 if v is None else len(str(v)) for v in values]
            h.update(np.array(lengths, dtype=np.int64).tobytes())
            h.update("".join("" if v is None else str(v) for v in values).encode("utf-8"))
    return h.hexdigest()


def _linked(source: Path, target: Path, files) -> None:
    """Each of `files` of `source` hard-linked into `target` (copied across file systems)."""
    for name in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / name, target / name)
        except OSError:
            shutil.copy2(source / name, target / name)
