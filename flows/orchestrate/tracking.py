"""The hooks around one unit of the run engine (flows/orchestrate/execute.py): where its run is
tracked (an MLflow run under the parent, or a model's run it is given), what its build streams there
while it runs (curves, system metrics), what its output shows (artifacts, tables, datasets, Prefect
artifacts), and how it ends. The engine only calls them: reuse or build, publish, in between."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from pathlib import Path

from flows.plan.config import flatten
from flows.plan.store import Manifest
from flows.track.tracker import Tracker, experiment_id
from tasks.core import BuildOutput, Unit

log = logging.getLogger("zhpipe")


class UnitTracking:
    """One unit's MLflow run. By default a run of its own under the parent (created with its tags,
    logged, finished whether the unit was reused or built); with `tracker`, an existing run (a
    model's, holding its train and evaluate units) that is logged into and left open."""

    def __init__(
        self,
        experiment: str,
        parent_run_id: str | None,
        unit: Unit,
        key: str,
        reused: Manifest | None,
        tracker: Tracker | None = None,
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
    ):
        self.unit, self.own = unit, tracker is None
        link = _link(unit, reused, experiment_id(experiment)) if reused is not None else {}
        # a reused output's run is written in three calls: created with its tags, logged, finished
        if self.own:
            cache = {"zhpipe.cache": "hit" if reused is not None else "miss"}
            tracker = Tracker.start(
                experiment,
                run_name or unit,
                parent=parent_run_id,
                tags={"zhpipe.stage": unit, "zhpipe.key": key, **cache, **(tags or {}), **link},
            )
        elif link:
            tracker.tags(link)  # known: no lookup of the run
        self.tracker = tracker

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    @property
    def sink(self) -> Tracker:
        """Where the build's per-epoch curves go."""
        return self.tracker

    @contextlib.contextmanager
    def building(self, system_metrics: bool):
        """Around the build itself: MLflow system metrics sampled while a model trains."""
        with _system_metrics(self.tracker.run_id, system_metrics):
            yield

    def built(self, folder: Path, out: BuildOutput, pipeline: str) -> None:
        """What a built output shows: its files, tables and datasets in the run, Markdown and tables
        in Prefect."""
        track_output(self.tracker, folder, out, pipeline, self.unit)

    def done(self, manifest: Manifest, params: Callable[[], dict]) -> None:
        """The unit's params (in its own run only: asked for there alone) and totals, in one write;
        its own run finished."""
        # a model run holds its train and evaluate units
        prefix = "" if self.own else f"{self.unit.stage}_"
        metrics = {
            **manifest.metrics,
            f"{prefix}rows": manifest.rows or 0,
            f"{prefix}seconds": manifest.seconds,
        }
        self.tracker.log(flatten(params()) if self.own else {}, metrics)
        if self.own:
            self.tracker.finish()

    def failed(self, params: Callable[[], dict]) -> None:
        """A failed unit's own run still says what it was asked to build (when that can be said),
        and ends FAILED."""
        if self.own:
            with contextlib.suppress(Exception):
                self.tracker.params(flatten(params()))
            self.tracker.finish(ok=False)


def _link(unit: Unit, manifest: Manifest, experiment: str) -> dict[str, str]:
    """A reused output's artifacts stay where they were logged: the tags that point the run there
    (nothing is uploaded)."""
    source = manifest.mlflow_run_id or ""
    tags = {
        f"zhpipe.{unit.stage}_artifacts_run_id" if unit.model else "zhpipe.artifacts_run_id": source
    }
    if source:
        tags["mlflow.note.content"] = (
            f"{unit}: cached output {manifest.key}, reused; its artifacts are in "
            f"[run {source[:8]}](#/experiments/{experiment}/runs/{source})."
        )
    return tags


@contextlib.contextmanager
def _system_metrics(run_id: str, enabled: bool, interval: float = 5.0):
    """MLflow system metrics (CPU, memory, GPU, disk, network) in `run_id` while a model trains,
    with a last sample at the end so a short training has one too."""
    if not enabled:
        yield
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    from flows.track.tracker import tracking_uri

    monitor = SystemMetricsMonitor(run_id, sampling_interval=interval, tracking_uri=tracking_uri())
    monitor.start()
    try:
        yield
    finally:
        try:
            monitor.collect_metrics()
            monitor.publish_metrics(monitor.aggregate_metrics())
        except Exception as e:  # noqa: BLE001 - system metrics must never fail a training
            log.warning("system metrics: %s", e)
        monitor.finish()


def track_output(
    tracker: Tracker, folder: Path, out: BuildOutput, pipeline: str, stage: str
) -> None:
    """What a stage returned, where people look: files, tables, datasets and tags in its MLflow run,
    Markdown and tables as Prefect artifacts."""
    for rel in out.artifacts:  # a folder keeps its name in the run's artifacts, a file its folder
        where = (
            rel
            if (folder / rel).is_dir()
            else str(Path(rel).parent)
            if Path(rel).parent != Path(".")
            else None
        )
        tracker.artifact(folder / rel, where)
    for name, table in out.tables.items():
        tracker.table(table, name)
    for ds in out.datasets:
        tracker.dataset(ds.frame, source=ds.source, name=ds.name, context=ds.context, rows=ds.rows)
    if out.tags:
        tracker.tags(out.tags)
    if out.markdown or out.records:
        from prefect.artifacts import create_markdown_artifact, create_table_artifact

        for suffix, text in out.markdown.items():
            create_markdown_artifact(
                text, key=artifact_key(pipeline, suffix), description=f"zhpipe {stage}"
            )
        for suffix, rows in out.records.items():
            create_table_artifact(
                rows, key=artifact_key(pipeline, suffix), description=f"zhpipe {stage}"
            )


def artifact_key(pipeline: str, suffix: str) -> str:
    """A Prefect artifact key: lower-case letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]", "-", f"{pipeline}-{suffix}".lower())
