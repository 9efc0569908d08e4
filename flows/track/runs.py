"""Runs as people compare them: `zhpipe runs` lists pipeline runs, `zhpipe compare` shows what
differs between runs (predicting is flows/track/predict.py)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.errors import ZhpipeError
from tasks.stages import DEFAULT_KIND, KINDS

log = logging.getLogger("zhpipe")


def _client():
    from flows.track.tracker import client

    return client()


def pipeline_runs(pipeline: str | None, limit: int = 20) -> list:
    """Recent parent (pipeline) runs, newest first, from one pipeline's experiment or all zhpipe
    ones."""
    from flows.track.tracker import tracking_uri

    uri = tracking_uri()
    db = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None
    if db is not None and db.is_file():
        runs = _runs_from_sqlite(db, pipeline, limit)
        if runs is not None:
            return runs
    return runs_from_client(pipeline, limit)


def runs_from_client(pipeline: str | None, limit: int) -> list:
    """`pipeline_runs` through the MLflow client (any tracking store)."""
    c = _client()
    if pipeline:
        exp = c.get_experiment_by_name(f"zhpipe-{pipeline}")
        if exp is None:
            raise ZhpipeError(
                f"no runs of pipeline '{pipeline}' (no MLflow experiment zhpipe-{pipeline}); run "
                "`zhpipe "
                f"run {pipeline}` first"
            )
        ids = [exp.experiment_id]
    else:
        ids = [e.experiment_id for e in c.search_experiments() if e.name.startswith("zhpipe-")]
    if not ids:
        return []
    return c.search_runs(
        ids,
        filter_string="tags.`zhpipe.pipeline` != ''",
        order_by=["attributes.start_time DESC"],
        max_results=limit,
    )


class _Run:
    """The parts of an MLflow run that `runs_table` reads, from the SQLite store's tables."""

    def __init__(self, run_id: str, start_time: int, status: str, tags: dict, metrics: dict):
        from types import SimpleNamespace

        self.info = SimpleNamespace(run_id=run_id, start_time=start_time, status=status)
        self.data = SimpleNamespace(tags=tags, metrics=metrics)


def _runs_from_sqlite(db: Path, pipeline: str | None, limit: int) -> list | None:
    """`pipeline_runs` read straight from MLflow's SQLite file (read-only, its documented tables:
    experiments, runs, tags, latest_metrics), in a few milliseconds instead of the seconds that
    importing MLflow and opening its store take. None when the file does not have those tables (the
    MLflow client reads it then)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            where, args = (
                ("name = ?", [f"zhpipe-{pipeline}"])
                if pipeline
                else ("substr(name, 1, 7) = 'zhpipe-'", [])
            )
            experiments = [
                r[0]
                for r in con.execute(
                    f"SELECT experiment_id FROM experiments WHERE lifecycle_stage = "
                    f"'active' AND {where}",
                    args,
                )
            ]
            if pipeline and not experiments:
                raise ZhpipeError(
                    f"no runs of pipeline '{pipeline}' (no MLflow experiment zhpipe-{pipeline}); "
                    "run "
                    f"`zhpipe run {pipeline}` first"
                )
            marks = ",".join("?" * len(experiments))
            runs = con.execute(
                "SELECT run_uuid, start_time, status FROM runs r WHERE lifecycle_stage = 'active' "
                "AND experiment_id "
                f"IN ({marks}) AND EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND "
                "t.key = "
                f"'zhpipe.pipeline' AND t.value != '') ORDER BY start_time DESC, run_uuid LIMIT ?",
                [*experiments, limit],
            ).fetchall()
            ids = [r[0] for r in runs]
            marks = ",".join("?" * len(ids))
            tags: dict[str, dict] = {i: {} for i in ids}
            metrics: dict[str, dict] = {i: {} for i in ids}
            for run_id, key, value in con.execute(
                f"SELECT run_uuid, key, value FROM tags WHERE run_uuid IN ({marks})", ids
            ):
                tags[run_id][key] = value
            for run_id, key, value, is_nan in con.execute(
                f"SELECT run_uuid, key, value, is_nan FROM latest_metrics "
                f"WHERE run_uuid IN ({marks})",
                ids,
            ):
                metrics[run_id][key] = float("nan") if is_nan else value
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return [
        _Run(run_id, start, status, tags[run_id], metrics[run_id]) for run_id, start, status in runs
    ]


# each kind's test metrics, by heading
SHOWN = tuple(dict.fromkeys(pair for kind in KINDS.values() for pair in kind.shown))


def runs_table(runs: list) -> pd.DataFrame:
    """One row per run: id, date, status, pipeline, commit, source sha256, best model, metrics,
    cache use."""
    rows = []
    for r in runs:
        tags, m = r.data.tags, r.data.metrics
        rows.append(
            {
                "run": r.info.run_id[:12],
                "started": time.strftime(
                    "%Y-%m-%d %H:%M", time.localtime(r.info.start_time / 1000)
                ),
                "status": r.info.status,
                "name": tags.get("mlflow.runName") or getattr(r.info, "run_name", ""),
                "overrides": tags.get("zhpipe.overrides", ""),
                "pipeline": tags.get("zhpipe.pipeline", ""),
                "commit": tags.get("zhpipe.git_commit", "")[:8].replace("unknown", "-"),
                "source": tags.get("zhpipe.source_sha256", "").removeprefix("partitions ")[:8],
                "best model": tags.get("zhpipe.best_model", ""),
                **{heading: m.get(metric) for heading, metric in SHOWN},
                "hit/miss": f"{int(m.get('stages_hit', 0))}/{int(m.get('stages_miss', 0))}",
                "partitions reused/built": (
                    f"{int(m['partitions_hit'])}/{int(m['partitions_miss'])}"
                    if "partitions_hit" in m
                    else ""
                ),
                "rows": int(m["rows_read"]) if "rows_read" in m else "",
                "rows new": int(m["rows_new"]) if "rows_new" in m else "",
                "champion": tags.get("zhpipe.champion", ""),
                "why": tags.get("zhpipe.champion_reason", ""),
                "registered": tags.get("zhpipe.registered", ""),
                "checks": tags.get("zhpipe.checks", ""),
            }
        )
    frame = pd.DataFrame(rows)
    # another kind's columns only where it has a value
    kept = {heading for heading, _ in KINDS[DEFAULT_KIND].shown}
    if len(frame):
        frame = frame.drop(columns=[h for h, _ in SHOWN if h not in kept and frame[h].isna().all()])
    # no partitioned source among them
    if len(frame) and not (frame["partitions reused/built"] != "").any():
        frame = frame.drop(columns=["partitions reused/built", "rows new"])
    return frame


def find_run(prefix: str):
    """A run by its id or an unambiguous prefix of it (as `zhpipe runs` prints them)."""
    from mlflow.exceptions import MlflowException

    c = _client()
    if len(prefix) == 32:
        try:
            return c.get_run(prefix)
        except MlflowException:
            pass
    matches = [r for r in runs_from_client(None, 5000) if r.info.run_id.startswith(prefix)]
    if len(matches) != 1:
        raise ZhpipeError(
            f"run '{prefix}': {'no pipeline run' if not matches else f'{len(matches)} runs'} "
            f"with that id prefix"
        )
    return matches[0]


MODEL_METRICS = (
    "val_accuracy_best",
    "val_macro_f1_best",
    "test_accuracy",
    "test_macro_f1",
    "val_f1_best",
    "test_f1",
    "test_perplexity",
    "train_seconds",
)


def model_metrics(parent) -> dict[str, dict[str, float]]:
    """The model runs under a parent run: per model, its validation and test metrics."""
    c = _client()
    children = c.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
        max_results=500,
    )
    out: dict[str, dict[str, float]] = {}
    for child in children:
        model = child.data.tags.get("zhpipe.model")
        if model and not child.data.tags.get("zhpipe.trial"):
            out[model] = {
                k: child.data.metrics[k] for k in MODEL_METRICS if k in child.data.metrics
            }
    # a run that built nothing names the model runs it reused: their training's, then their
    # scoring's metrics
    reused = sorted(
        (k.removeprefix("zhpipe.reused.").partition("."), v)
        for k, v in parent.data.tags.items()
        if k.startswith("zhpipe.reused.") and "." in k.removeprefix("zhpipe.reused.") and v
    )
    order = (
        list(KINDS[parent.data.tags.get("zhpipe.task")].stages)
        if parent.data.tags.get("zhpipe.task") in KINDS
        else []
    )
    for (_stage, _, model), source in sorted(
        reused, key=lambda item: order.index(item[0][0]) if item[0][0] in order else 0
    ):
        metrics = c.get_run(source).data.metrics
        out.setdefault(model, {}).update({k: metrics[k] for k in MODEL_METRICS if k in metrics})
    return out


def compare_table(run_ids: list[str], everything: bool = False) -> pd.DataFrame:
    """Parameters, metrics and tags side by side, one column per run, and each model's validation
    and test metrics (`model textcnn test_accuracy`); only rows that differ unless `everything` (the
    headline metrics are always shown). `delta` is the last run's value minus the first's (in the
    spirit of `dvc metrics diff`)."""
    runs = [find_run(r) for r in run_ids]
    headline = {
        "metric best_test_accuracy",
        "metric best_test_macro_f1",
        "metric best_test_f1",
        "metric best_test_bleu",
        "tag zhpipe.best_model",
    }
    table: dict[str, dict[str, Any]] = {}
    for r in runs:
        col = r.info.run_id[:12]
        for k, v in r.data.params.items():
            table.setdefault(f"param {k}", {})[col] = v
        for k, v in r.data.metrics.items():
            table.setdefault(f"metric {k}", {})[col] = round(v, 4)
        for model, values in model_metrics(r).items():
            for k, v in values.items():
                table.setdefault(f"model {model} {k}", {})[col] = round(v, 4)
        for k in (
            "zhpipe.best_model",
            "zhpipe.git_commit",
            "zhpipe.source_sha256",
            "zhpipe.config_hash",
            "zhpipe.registered",
            "zhpipe.champion",
        ):
            if k in r.data.tags:
                table.setdefault(f"tag {k}", {})[col] = r.data.tags[k][:16]
    columns = [r.info.run_id[:12] for r in runs]
    frame = pd.DataFrame.from_dict(table, orient="index").reindex(columns=columns)
    if not everything:
        differs = frame.astype(str).nunique(axis=1, dropna=False) > 1
        frame = frame[differs | frame.index.isin(headline)]
    kind = {"model": 0, "metric": 1, "tag": 2, "param": 3}
    order = sorted(frame.index, key=lambda k: (kind[k.split(" ", 1)[0]], k))
    frame = frame.loc[order]
    first, last = (
        pd.to_numeric(frame[columns[0]], errors="coerce"),
        pd.to_numeric(frame[columns[-1]], errors="coerce"),
    )
    frame["delta"] = (last - first).round(4).map(lambda d: "" if pd.isna(d) else f"{d:+.4f}")
    return frame.rename_axis("what").reset_index()


def half_logged_models(since: float) -> list[dict]:
    """Models whose logging never finished (a disk that filled, a killed run): each logged model of
    the project's SQLite store whose status is not READY, and each model folder under the store's
    `artifacts/models/` that the store has no record of, last written before `since` (the start of
    this gc, when no zhpipe run of the project was live: a run that died on a full disk leaves its
    MLflow run RUNNING). {path, mb, id, why} each; nothing is removed here."""
    from mlflow.entities import LoggedModelStatus

    from flows.track.tracker import client, tracking_uri

    uri = tracking_uri()
    if not uri.startswith("sqlite:///"):
        return []
    folder = Path(uri.removeprefix("sqlite:///")).parent / "artifacts" / "models"
    if not folder.is_dir():
        return []
    mlflow_client = client()
    experiments = [e.experiment_id for e in mlflow_client.search_experiments()]
    known, found = set(), []
    for model in mlflow_client.search_logged_models(experiments) if experiments else []:
        known.add(model.model_id)
        path = folder / model.model_id
        if model.status == LoggedModelStatus.READY or (
            path.exists() and path.stat().st_mtime >= since
        ):
            continue
        found.append(
            {
                "path": path,
                "id": model.model_id,
                "why": f"a model whose logging never finished (status {model.status})",
            }
        )
    for path in folder.glob("m-*"):
        if path.name not in known and path.is_dir() and path.stat().st_mtime < since:
            found.append(
                {
                    "path": path,
                    "id": None,
                    "why": "a model folder the tracking store has no record of",
                }
            )
    for item in found:
        files = [f for f in item["path"].rglob("*") if f.is_file()] if item["path"].is_dir() else []
        item["mb"] = sum(f.stat().st_size for f in files) / 1e6
    return found


def remove_half_logged(item: dict) -> None:
    """A model `half_logged_models` found: its record in the store and its folder."""
    import shutil

    from flows.track.tracker import client

    # first: on a full disk, it frees the space the record needs
    shutil.rmtree(item["path"], ignore_errors=True)
    if item["id"]:
        client().delete_logged_model(item["id"])
