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


def arrived(run: RunContext, results: dict[str, StageResult]) -> list[dict]:
    """The checked stage's partitions (or its whole output) with what clean did to them."""
    checked = run.config.kind.checked
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
    for judged in [j for j in run.gate.judged if j.held] if run.gate else ():
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


def still_held(run: RunContext) -> list[dict]:
    """Every partition held out now, by this run or an earlier one (the checks' record), with its
    `accept` command."""
    import shlex

    from flows.plan import held

    return [
        {
            "name": name,
            **entry,
            "accept": f"zhpipe accept {shlex.quote(run.config.name)} {shlex.quote(name)}",
        }
        for name, entry in held.held(run.config.identity).items()
    ]


def history(run: RunContext, limit: int = 30) -> str:
    """The picture of the best model's and the champion's test metric over this pipeline's last runs
    ('' before the second run: one point is no trend)."""
    import time as _time

    from flows.track.runs import pipeline_runs

    metric = run.config.kind.metric(run.config)
    # the pipeline's runs (experiment zhpipe-<identity>), newest first
    runs = pipeline_runs(run.config.identity, limit)
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
    """Checks and report into the parent run and the Prefect flow run; never fails the run."""
    try:
        _record(run, results, ok, error)
    # a report that cannot be written is a warning, not a lost night
    except Exception as e:  # noqa: BLE001
        log.warning("the night's report could not be written: %s", e)


def _record(run: RunContext, results: dict[str, StageResult], ok: bool, error: str) -> None:
    from flows.track.alerts import flush

    gate = run.gate
    held_now = still_held(run)
    if (
        ok
        and not (gate and gate.fresh)
        and all(r.cache == "hit" for r in results.values())
        and not held_now
    ):
        # nothing built, nothing judged: the parent run names the runs that built it all (no new
        # artifacts)
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
    judged = sorted(
        (j for j in (gate.fresh if gate else []) if j.night is not None), key=lambda j: not j.held
    )[:PLOTTED]
    plots = night_plots(judged)
    tags = parent.client.get_run(run.parent_run_id).data.tags
    champion = {
        k: v
        for k, v in tags.items()
        if k in ("zhpipe.champion", "zhpipe.champion_reason", "zhpipe.registered", "zhpipe.budget")
    }
    if error:
        champion["error"] = error
    page = report.render(
        run.title or run.config.name,
        ok,
        arrived(run, results),
        rows,
        plots,
        champion,
        headline(run, results),
        held=held_now,
        history=history(run),
    )
    parent.text(page, "report.html")
    _prefect(run, rows, report.worries(ok, rows, champion, held_now))
    flush()


def headline(run: RunContext, results: dict[str, StageResult]) -> dict[str, float]:
    """The best model's headline test metrics (accuracy and macro-F1, entity F1, BLEU: the kind's
    reported ones)."""
    kind = run.config.kind
    selection = results.get(kind.selection.name) if kind.selection else None
    if selection is None or not selection.facts.best_model:
        return {}
    scores = selection.facts.results.get(selection.facts.best_model, {})
    return {
        f"{selection.facts.best_model} {name}": float(scores[name])
        for name in kind.reported
        if name in scores
    }


def attention(run: RunContext) -> dict:
    """What a person should hear of this run (what `zhpipe run --fail-on` reads): partitions held
    and checks warned in this run, and whether the champion was kept over a worse new version."""
    from flows.track.champion import DATA_SUSPECT, kept_worse

    gate = run.gate
    fresh = gate.fresh if gate else []
    tags = (
        Tracker(run.parent_run_id).client.get_run(run.parent_run_id).data.tags
        if run.parent_run_id
        else {}
    )
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


def _prefect(run: RunContext, rows: list[dict], worries: list[str]) -> None:
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    page, _, view = ui_url(run.experiment, run.parent_run_id).partition("?")
    link = f"{page}/artifacts?{view}"  # the run page's Artifacts tab, report.html among them
    lines = (
        "\n".join(f"- {markdown_text(w)}" for w in worries)
        or "- nothing to worry about: every check passed and the run completed"
    )
    create_markdown_artifact(
        markdown=f"### zhpipe night report\n{lines}\n\nThe whole report: `report.html` of the "
        f"[MLflow parent run]({link}).",
        key=artifact_key(run.config.name, "night-report"),
        description="zhpipe: whether to worry about this run",
    )
    if rows:
        create_table_artifact(
            rows,
            key=artifact_key(run.config.name, "checks"),
            description="zhpipe: the data checks of this run",
        )
