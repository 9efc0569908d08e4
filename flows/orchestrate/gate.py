"""The data checks in a run (tasks/shared/checks.py declares them): judged on the checked stage's
output, per partition against the earlier kept partitions, or for a source without partitions
against the last corpus that passed. A blocking failure holds a partition out of the corpus (the run
goes on without it) or stops a run without partitions before training; each decision is one line
naming the partition and the check, a Prefect event, and a row of the run's checks table (MLflow
metrics and table, Prefect artifact, `zhpipe runs`, the run's report)."""

from __future__ import annotations

import logging
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from flows.plan import held, project
from flows.plan.sources import hold_out
from tasks.errors import ZhpipeError
from tasks.shared import checks
from tasks.util.io import read_rows
from tasks.util.private import atomic_path
from tasks.util.usercode import fingerprint

log = logging.getLogger("zhpipe")


def judged_as(config, key: str) -> str:
    """What a checked output's verdicts are recorded under: its key, and with checks of the team's
    own, their code too (a real edit judges again; a comment does not)."""
    import hashlib
    import json

    own = config.checks.user_code()
    if not own:
        return key
    code = fingerprint(own, project.current().root, "checks.custom")
    return f"{key}+{hashlib.sha256(json.dumps(code, sort_keys=True).encode()).hexdigest()[:12]}"


def unjudged(config, keys: list[str]) -> bool:
    """Whether a checked output of `keys` has no verdicts recorded for the checks as they are
    now."""
    record = held.load(config.identity)["judged"]
    return any(judged_as(config, key) not in record for key in keys)


@dataclass
class Judged:
    """One judged partition (or the corpus): its verdicts, and whether it was held out."""

    name: str
    verdicts: list[checks.Verdict]
    held: bool = False
    accepted: bool = False
    fresh: bool = True  # judged in this run (False: its verdicts were read back from the record)
    rows_in: int | None = None
    # the checked unit's (rows kept, dropped by reason): a held one's too
    metrics: dict = field(default_factory=dict)
    # its rows and the reference's, for the report's plots
    night: pd.DataFrame | None = field(default=None, repr=False)
    reference: pd.DataFrame | None = field(default=None, repr=False)


@dataclass
class Gate:
    """A run's checks: `part` judges a partition unit, `whole` the output of a source without
    partitions."""

    config: object
    judged: list[Judged] = field(default_factory=list)
    # the link to the run's page in MLflow (its report.html): what an alert points to
    report: str = ""

    def _decide(
        self, name: str, digest: str, result, reference: checks.Sample | None, shown: str
    ) -> Judged:
        """Judge a checked output once per unit key (a cached one's verdicts are read back), hold it
        when a blocking check fails and it was not accepted as it is, and report it; the record is
        read and written once."""
        night = sample_of(result, whole=bool(self.config.checks.custom))
        root = project.current().root
        judged = judged_as(self.config, result.key)
        known = held.load(self.config.identity)["judged"].get(judged)
        verdicts = (
            checks.from_json(known["verdicts"])
            if known is not None
            else checks.judge(night, reference, self.config.checks, root)
        )
        blocked = [v for v in verdicts if v.blocks]
        # read, decided and written under the record's lock: an `accept` made meanwhile is seen here
        # and kept
        with held.changing(self.config.identity) as record:
            if known is None:
                record["judged"][judged] = {
                    "unit": result.stage,
                    "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "verdicts": checks.to_json(verdicts),
                }
            accepted = bool(blocked) and held.accepted(record, name, digest)
            judged = Judged(
                name,
                verdicts,
                held=bool(blocked) and not accepted,
                accepted=accepted,
                fresh=known is None,
                rows_in=night.rows_in,
                metrics=dict(result.metrics),
                night=night.frame,
                reference=reference.frame if reference else None,
            )
            if judged.held:
                record["held"][name] = {
                    "check": blocked[0].check,
                    "line": blocked[0].line(shown),
                    "digest": digest,
                    "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }
        self.judged.append(judged)
        self._report(judged)
        return judged

    def part(self, name: str, digest: str, result, earlier: list) -> bool:
        """Judge a partition's checked output against the earlier kept ones; True when a blocking
        check holds it out (recorded, taken out of the run's partitions)."""
        judged = self._decide(name, digest, result, reference_of(earlier), name)
        if judged.held:
            hold_out(self.config, name)
        return judged.held

    def whole(self, result) -> None:
        """Judge the whole cleaned corpus (a source without partitions) against the last one that
        passed; a blocking failure stops the run before training (one error line), unless the corpus
        was accepted as it is."""
        reference_file = _reference_file(self.config)
        reference = None
        if reference_file.is_file():
            frame = pd.read_parquet(reference_file)
            reference = checks.Sample(frame, len(frame), len(frame))
        judged = self._decide(held.CORPUS, result.key, result, reference, "the corpus")
        if judged.held:
            first = next(v for v in judged.verdicts if v.blocks)
            setting = (
                f"checks.custom.{first.check}.blocking: false"
                if first.check in self.config.checks.custom
                else f"checks.{first.check}.severity: warn"
            )
            raise ZhpipeError(
                f"{first.line('the corpus')}; the run stops before training (accept it as it is "
                "with "
                f"`zhpipe accept {shlex.quote(self.config.name)} --all`, or set {setting})"
            )
        _save_reference(self.config, result)

    def _report(self, judged: Judged) -> None:
        from flows.track.alerts import emit

        for v in judged.verdicts:
            if v.passed is False:
                # a verdict read back is news only when it holds the partition out again
                (log.warning if judged.fresh or (v.blocks and judged.held) else log.info)(
                    "%s", v.line(judged.name)
                )
        if judged.held:
            first = next(v for v in judged.verdicts if v.blocks)
            log.warning(
                "%s held out of the corpus by check %s (its rows stay in the store; put it back "
                "with "
                "`zhpipe accept %s %s`)",
                judged.name,
                first.check,
                shlex.quote(self.config.name),
                shlex.quote(judged.name),
            )
        if judged.fresh and any(v.passed is False for v in judged.verdicts):
            failed = [v for v in judged.verdicts if v.passed is False]
            lines = "; ".join(v.line(judged.name) for v in failed)
            # two lines: what happened, then what to do (and where the night's report is)
            see = f"; the night's report: {self.report}" if self.report else ""
            message = (
                f"{self.config.identity}: {judged.name} held out of the corpus ({lines})\nlook at "
                "the file; if "
                f"it is right, put it back with `zhpipe accept {shlex.quote(self.config.name)} "
                f"{shlex.quote(judged.name)}`{see}"
                if judged.held
                else f"{self.config.identity}: {lines}\nthe partition joined the corpus{see}"
            )
            emit(
                "zhpipe.partition.held" if judged.held else "zhpipe.check.failed",
                self.config,
                {
                    "partition": judged.name,
                    "failed": checks.to_json(failed),
                    "held": judged.held,
                    "message": message,
                },
            )

    @property
    def fresh(self) -> list[Judged]:
        """The partitions judged in this run (not those whose verdicts an earlier run recorded)."""
        return [j for j in self.judged if j.fresh]

    def summary(self) -> str:
        """`2 held, 1 warned, 40 passed` over the partitions judged in this run."""
        held_n = sum(j.held for j in self.fresh)
        warned = sum(
            1 for j in self.fresh for v in j.verdicts if v.passed is False and not v.blocks
        )
        passed = sum(1 for j in self.fresh for v in j.verdicts if v.passed)
        return f"{held_n} held, {warned} warned, {passed} passed"

    def rows(self) -> list[dict]:
        """The checks table: a row per partition judged in this run and check."""
        return [
            {
                "partition": j.name,
                "check": v.check,
                "severity": v.severity,
                "figure": v.figure,
                "threshold": v.threshold,
                "result": {True: "passed", None: "not judged", False: "failed"}[v.passed]
                + (
                    " (held out)"
                    if j.held and v.blocks
                    else " (accepted)"
                    if j.accepted and v.blocks
                    else ""
                ),
                "note": v.note,
            }
            for j in self.fresh
            for v in j.verdicts
        ]


COLUMNS = ["text", "label"]


def _frame(path: Path, positions=None) -> pd.DataFrame:
    """The checked columns of a stage's file: the rows at `positions` (None: all of them)."""
    names = pq.read_schema(path).names
    columns = [c for c in COLUMNS if c in names]
    if positions is None:
        return pd.read_parquet(path, columns=columns)
    return read_rows(path, positions, columns)


def _rows(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def sample_of(result, whole: bool = False) -> checks.Sample:
    """Tonight's rows as the checks read them: the seeded sample they judge (read row group by row
    group, never the whole file), or every row when `whole` (the team's own checks are given the
    night's whole frame)."""
    path = result.path / "data.parquet"
    total = _rows(path)
    frame = _frame(path, None if whole else checks.sample_positions(total))
    kept = result.rows if result.rows is not None else total
    rows_in = result.metrics.get("rows_in")
    rows_in = (
        int(rows_in) if rows_in is not None else kept + int(result.metrics.get("rows_dropped", 0))
    )
    return checks.Sample(frame, rows_in, kept)


def reference_of(earlier: list) -> checks.Sample | None:
    """The earlier kept partitions as the reference: their most recent rows, up to
    `checks.REFERENCE_ROWS`."""
    if not earlier:
        return None
    frames, rows = [], 0
    for result in reversed(earlier):
        if rows >= checks.REFERENCE_ROWS:
            break
        path = result.path / "data.parquet"
        total = _rows(path)
        frame = _frame(path, np.arange(max(0, total - (checks.REFERENCE_ROWS - rows)), total))
        frames.insert(0, frame)
        rows += len(frame)
    frame = pd.concat(frames, ignore_index=True)
    recent = tuple(int(r.rows or 0) for r in earlier)
    return checks.Sample(
        frame, len(frame), len(frame), recent, tuple(_quarantined(r) for r in earlier)
    )


def _quarantined(result) -> float | None:
    """The share clean set aside of a partition (None when its metrics do not say)."""
    rows_in, dropped = result.metrics.get("rows_in"), result.metrics.get("rows_dropped")
    return float(dropped) / float(rows_in) if rows_in and dropped is not None else None


def _reference_file(config) -> Path:
    """The last corpus that passed, for a source without partitions read again from the same place
    (a file replaced in place each night): another path is another corpus, and another label
    column another labelling, judged like a first one."""
    import hashlib

    source = config.source
    # the default column keeps the file name references always had
    label = getattr(source, "label_column", None)
    place = str(source.path or source.url) + (f"\0{label}" if label and label != "label" else "")
    where = hashlib.sha256(place.encode()).hexdigest()[:12]
    return held.record_path(config.identity).with_name(
        f"reference-{config.identity}-{where}.parquet"
    )


def _save_reference(config, result) -> None:
    """The corpus that passed, as the next run's reference (a seeded sample)."""
    path = result.path / "data.parquet"
    frame = _frame(path, checks.sample_positions(_rows(path), checks.REFERENCE_ROWS))
    target = _reference_file(config)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp:
        frame.reset_index(drop=True).to_parquet(tmp)
