"""What a night's run leaves for the people who did not watch it: the data checks' results (MLflow
metrics and table on the parent run, a Prefect table artifact, the `zhpipe.checks` tag `zhpipe runs`
shows) and its report (report.html in the parent run, linked from the Prefect flow run), written at
the end of every run, failed ones included."""

from __future__ import annotations

import html
import logging

import pandas as pd

from flows.orchestrate.execute import RunContext
from flows.orchestrate.tracking import artifact_key
from flows.plan.cache import StageResult
from flows.track import report
from flows.track.tracker import Tracker, ui_url
from tasks.shared.reports import markdown_text

log = logging.getLogger("zhpipe")

PLOTTED = 3  # partitions judged in a run that the report draws (the held ones first)


def arrived(checked, gate, results: dict[str, StageResult]) -> list[dict]:
    """The checked stage's partitions (or its whole output) with what clean did to them; `gate`:
    the run's data checks (flows/orchestrate/gate.py), which name the partitions they held out."""
    result = results.get(checked.name) if checked else None
    if result is None:
        return []
    units = result.parts.values() if result.parts else [result]
    rows = [
        {
            "partition": unit.stage.part or "(corpus)",
            "cache": "built" if unit.cache == "miss" else "reused",
            **_counts(unit.metrics),
        }
        for unit in units
    ]
    # cleaned, then held: its quarantine too
    for judged in [j for j in gate.judged if j.held] if gate else ():
        rows.append(
            {
                "partition": judged.name,
                "cache": "held out",
                **_counts(judged.metrics),
                "rows_in": judged.rows_in,
            }
        )
    return rows


def _counts(metrics: dict) -> dict:
    return {
        k: int(v)
        for k, v in metrics.items()
        if k.startswith(("rows_", "dropped_")) and isinstance(v, int | float)
    }


def still_held(config) -> list[dict]:
    """Every partition held out now, by this run or an earlier one (the checks' record), with its
    `accept` command."""
    import shlex

    from flows.plan import held

    return [
        {
            "name": name,
            **entry,
            "accept": f"zhpipe accept {shlex.quote(config.name)} {shlex.quote(name)}",
        }
        for name, entry in held.held(config.identity).items()
    ]


def history(config, limit: int = 30) -> str:
    """The picture of the best model's and the champion's test metric over this pipeline's last runs
    ('' before the second run: one point is no trend)."""
    import time as _time

    from flows.track.runs import pipeline_runs

    metric = config.kind.metric(config)
    # the pipeline's runs (experiment zhpipe-<identity>), newest first
    runs = pipeline_runs(config.identity, limit)
    points = []
    for r in reversed(runs):
        m, tags = r.data.metrics, r.data.tags
        champion = (
            m.get(f"challenger_test_{metric}")
            if tags.get("zhpipe.champion") in ("yes", "already")
            else m.get(f"champion_test_{metric}")
        )
        points.append(
            {
                "when": _time.strftime("%m-%d %H:%M", _time.localtime(r.info.start_time / 1000)),
                "best": m.get(f"best_test_{metric}"),
                "champion": champion,
            }
        )
    if sum(p["best"] is not None or p["champion"] is not None for p in points) < 2:
        return ""
    return report.history_plot(points, metric)


def record(run: RunContext, results: dict[str, StageResult], ok: bool, error: str = "") -> None:
    """Checks and report into the parent run and the Prefect flow run; never fails the run (a
    report that cannot be written is a warning, not a lost night)."""
    from flows.track.alerts import flush

    try:
        gate, config = run.gate, run.config
        held_now = still_held(config)
        fresh = gate.fresh if gate else []
        if ok and not fresh and all(r.cache == "hit" for r in results.values()) and not held_now:
            # nothing built, nothing judged: the parent run names the runs that built it all (no
            # new artifacts)
            return
        parent = Tracker(run.parent_run_id)
        rows = gate.rows() if gate else []
        if rows:
            for step, judged in enumerate(gate.fresh):
                parent.metrics(
                    {f"check_{v.check}": v.figure for v in judged.verdicts if v.figure is not None},
                    step=step,
                )
            parent.table(pd.DataFrame(rows), "checks.json")
            parent.tags({"zhpipe.checks": gate.summary()})
        judged = sorted((j for j in fresh if j.night is not None), key=lambda j: not j.held)
        tags = parent.client.get_run(run.parent_run_id).data.tags
        champion = {
            k: v
            for k, v in tags.items()
            if k
            in ("zhpipe.champion", "zhpipe.champion_reason", "zhpipe.registered", "zhpipe.budget")
        }
        if error:
            champion["error"] = error
        page = report.render(
            run.title or config.name,
            ok,
            arrived(config.kind.checked, gate, results),
            rows,
            night_plots(judged[:PLOTTED]),
            champion,
            headline(config.kind, results),
            held=held_now,
            history=history(config),
        )
        parent.text(page, "report.html")
        link = ui_url(run.experiment, run.parent_run_id)
        _prefect(config.name, link, rows, report.worries(ok, rows, champion, held_now))
        flush()
    except Exception as e:  # noqa: BLE001
        log.warning("the night's report could not be written: %s", e)


def headline(kind, results: dict[str, StageResult]) -> dict[str, float]:
    """The best model's headline test metrics (accuracy and macro-F1, entity F1, BLEU: the task
    kind's reported ones)."""
    selection = results.get(kind.selection.name) if kind.selection else None
    if selection is None or not selection.facts.best_model:
        return {}
    scores = selection.facts.results.get(selection.facts.best_model, {})
    return {
        f"{selection.facts.best_model} {name}": float(scores[name])
        for name in kind.reported
        if name in scores
    }


def attention(gate, parent_run_id: str | None) -> dict:
    """What a person should hear of this run (what `zhpipe run --fail-on` reads): partitions held
    and checks warned in this run (its `gate`), and whether the champion was kept over a worse new
    version (its parent run's tags)."""
    from flows.track.champion import DATA_SUSPECT, kept_worse

    fresh = gate.fresh if gate else []
    tags = Tracker(parent_run_id).client.get_run(parent_run_id).data.tags if parent_run_id else {}
    reason = tags.get("zhpipe.champion_reason", "")
    worse = (tags.get("zhpipe.champion") == "no" and kept_worse(reason)) or DATA_SUSPECT in reason
    return {
        "held": [j.name for j in fresh if j.held],
        "warned": [f"{v.check} on {j.name}" for j in fresh for v in j.verdicts if v.warns],
        "kept_worse": reason if worse else "",
    }


def night_plots(judged: list) -> list[str]:
    """Each judged partition's heading (its name escaped: a file may be named `<img
    onerror=...>.csv`) and its plots."""
    return [
        f"<h3>{html.escape(j.name)}{' (held out)' if j.held else ''}</h3>"
        + report.comparison_plot(j.name, j.night, j.reference)
        for j in judged
    ]


def _prefect(pipeline: str, link: str, rows: list[dict], worries: list[str]) -> None:
    """The Prefect flow run's report (its worries, linking `link`: the MLflow parent run) and the
    checks' table."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    page, _, view = link.partition("?")
    link = f"{page}/artifacts?{view}"  # the run page's Artifacts tab, report.html among them
    lines = (
        "\n".join(f"- {markdown_text(w)}" for w in worries)
        or "- nothing to worry about: every check passed and the run completed"
    )
    create_markdown_artifact(
        markdown=f"### zhpipe night report\n{lines}\n\nThe whole report: `report.html` of the "
        f"[MLflow parent run]({link}).",
        key=artifact_key(pipeline, "night-report"),
        description="zhpipe: whether to worry about this run",
    )
    if rows:
        create_table_artifact(
            rows,
            key=artifact_key(pipeline, "checks"),
            description="zhpipe: the data checks of this run",
        )
