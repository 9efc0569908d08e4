"""A night's report: one HTML page per pipeline run (`report.html` in the MLflow parent run, linked
from the Prefect flow run) that says whether to worry: what arrived, what clean quarantined and why,
each data check with its figure and threshold, tonight against the reference (label shares, text
lengths), and the champion decision with its interval and slices."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import pandas as pd

LENGTH_QUANTILE = 0.99  # the length axis ends here (longer texts are counted in the last bin)
TOP_LABELS = 20  # labels drawn in the shares plot (a corpus may have thousands)
REASONS = ("empty", "too_short", "too_long", "duplicate", "label_conflict", "misaligned")


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return f'<img src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def comparison_plot(name: str, night: pd.DataFrame, reference: pd.DataFrame | None) -> str:
    """Label shares and text lengths of one partition against the reference, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tasks.util.plots import cjk_font

    # the font the profile stage draws Chinese with: label names are often Chinese
    font = cjk_font()
    style = {}
    if font:
        from matplotlib import font_manager

        font_manager.fontManager.addfont(font)
        style = {"font.family": font_manager.FontProperties(fname=font).get_name()}
    with plt.rc_context(style):
        return _png(_comparison_figure(plt, name, night, reference))


def _comparison_figure(plt, name: str, night: pd.DataFrame, reference: pd.DataFrame | None):
    import numpy as np

    labelled = "label" in night and reference is not None and "label" in reference
    fig, axes = plt.subplots(1, 2 if labelled else 1, figsize=(9 if labelled else 4.5, 2.8))
    axes = list(axes) if labelled else [axes]
    lengths = axes[-1]
    both = [night["text"].str.len()] + (
        [reference["text"].str.len()] if reference is not None else []
    )
    # clipped to the data: a few long texts squeeze the rest
    top = max(1.0, float(np.quantile(pd.concat(both), LENGTH_QUANTILE)))
    bins = np.linspace(0, top, 41)
    lengths.hist(
        night["text"].str.len().clip(upper=top), bins=bins, alpha=0.6, density=True, label=name
    )
    if reference is not None:
        lengths.hist(
            reference["text"].str.len().clip(upper=top),
            bins=bins,
            alpha=0.6,
            density=True,
            label="reference",
        )
    lengths.set_xlim(0, top)
    lengths.set_xlabel(f"characters (up to the {LENGTH_QUANTILE:.0%} quantile)")
    lengths.set_title("text length")
    lengths.legend(fontsize=7)
    if labelled:
        shares = pd.DataFrame(
            {
                name: night["label"].astype(str).value_counts(normalize=True),
                "reference": reference["label"].astype(str).value_counts(normalize=True),
            }
        ).fillna(0)
        # the most common
        shares = shares.loc[shares.max(axis=1).sort_values(ascending=False).index[:TOP_LABELS]]
        shares.plot.bar(ax=axes[0], rot=0)
        axes[0].set_title("label shares")
        axes[0].legend(fontsize=7)
    return fig


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = ""
    for row in rows:
        bad = "failed" in str(row.get("result", ""))
        cells = "".join(
            f"<td>{html.escape('' if row.get(c) is None else str(row.get(c)))}</td>"
            for c in columns
        )
        body += f'<tr class="{"bad" if bad else ""}">{cells}</tr>'
    return f"<table><tr>{head}</tr>{body}</table>"


STYLE = """body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}
tr.bad td{background:#fde2e2}
.verdict{font-size:20px;padding:.6em;border-radius:6px}
.ok{background:#e3f6e3}.worry{background:#fde2e2}"""


def _metrics(metrics: dict[str, float]) -> str:
    if not metrics:
        return "<p>no model was trained or selected in this run</p>"
    return (
        "<p>" + ", ".join(f"{html.escape(k)} <b>{v:.4f}</b>" for k, v in metrics.items()) + "</p>"
    )


def worries(
    ok: bool, checks_rows: list[dict], champion: dict[str, str], still_held: list[dict] = ()
) -> list[str]:
    """What a reader should worry about, one line each (none: a quiet night); `still_held`: every
    partition held out now, earlier runs' included (a held night is a worry until it is accepted or
    removed)."""
    lines = [] if ok else [f"the run failed: {champion.get('error', 'see the log')}"]
    held = sorted({r["partition"] for r in checks_rows if "held out" in str(r["result"])})
    if held:
        lines.append(f"held out of the corpus: {', '.join(held)} (put back with `zhpipe accept`)")
    older = [h["name"] for h in still_held if h["name"] not in held]
    if older:
        lines.append(
            f"still held out from earlier runs: {', '.join(older)} (each waits for `zhpipe accept`)"
        )
    # a model it left no time for, or a stage over it by more than 10%
    if champion.get("zhpipe.budget"):
        lines.append(f"the training budget: {champion['zhpipe.budget']}")
    warned = [f"{r['check']} on {r['partition']}" for r in checks_rows if r["result"] == "failed"]
    if warned:
        lines.append(f"warnings: {', '.join(warned)}")
    from flows.track.champion import DATA_SUSPECT, OWN_DROP, kept_worse

    reason = champion.get("zhpipe.champion_reason", "")
    if champion.get("zhpipe.champion") == "no" and kept_worse(reason):
        lines.append(f"the new model is worse than the champion, which stays: {reason}")
    elif DATA_SUSPECT in reason:
        lines.append(
            f"the champion fell on today's test rows: scores {reason.split(OWN_DROP, 1)[-1]}"
        )
    return lines


def history_plot(points: list[dict], metric: str) -> str:
    """The test `metric` of each run's best model and of the champion over the runs (oldest first):
    `points` hold `when`, `best` and `champion` (None where a run registered nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.6))
    x = list(range(1, len(points) + 1))
    for key, style in (("best", "o-"), ("champion", "s--")):
        ys = [p.get(key) for p in points]
        ax.plot(
            [i for i, y in zip(x, ys) if y is not None],
            [y for y in ys if y is not None],
            style,
            label=f"{'best model of the run' if key == 'best' else 'champion'}",
        )
    ax.set_xticks(x, [p["when"] for p in points], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(f"test {metric}")
    ax.set_title(f"test {metric} over the last {len(points)} runs")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _png(fig)


def _still_held(held: list[dict]) -> str:
    """Every partition still held out (by any run, this one or earlier), with why and the command
    that puts it back."""
    if not held:
        return ""
    rows = [
        {
            "partition": h["name"],
            "held since": h.get("at", ""),
            "why": h.get("line", h.get("check", "")),
            "put back with": h["accept"],
        }
        for h in held
    ]
    return (
        "<h2>Still held out of the "
        f"corpus</h2>{_table(rows, ['partition', 'held since', 'why', 'put back with'])}"
    )


def render(
    title: str,
    ok: bool,
    arrived: list[dict],
    checks_rows: list[dict],
    plots: list[str],
    champion: dict[str, str],
    metrics: dict[str, float] | None = None,
    held: list[dict] = (),
    history: str = "",
) -> str:
    """The page. `metrics`: the headline test metrics of the run's best model (every night, the
    first included); `held`: every partition held out now (name, line, at, accept); `history`: the
    metric-over-runs picture."""
    lines = worries(ok, checks_rows, champion, held)
    verdict = (
        "<div class='verdict worry'>Look at this run: "
        + "; ".join(html.escape(x) for x in lines)
        + "</div>"
        if lines
        else "<div class='verdict ok'>Nothing to worry about: every check passed and the run "
        "completed.</div>"
    )
    # the built-in reasons, then one column per rule of the team's (`dropped_rule_<function>`)
    rules = sorted(
        {k.removeprefix("dropped_") for a in arrived for k in a if k.startswith("dropped_rule_")}
    )
    quarantined = [
        {
            "partition": a["partition"],
            **{r: a.get(f"dropped_{r}", 0) for r in (*REASONS, *rules) if a.get(f"dropped_{r}")},
        }
        for a in arrived
    ]
    reasons = [r for r in (*REASONS, *rules) if any(q.get(r) for q in quarantined)]
    decision = champion.get("zhpipe.champion_reason", "no model was registered by this run")
    state = {
        "yes": "promoted",
        "already": "already the champion",
        "no": "kept out: the champion stays",
    }.get(champion.get("zhpipe.champion", ""), "")
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>zhpipe night report</h1><p>{html.escape(title)}</p>{verdict}
{_still_held(list(held))}
<h2>What arrived</h2>{
        _table(arrived, ["partition", "cache", "rows_in", "rows_kept", "rows_dropped"])
    }
<h2>Quarantined, by reason</h2>{
        _table(quarantined, ["partition", *reasons]) if reasons else "<p>nothing</p>"
    }
<h2>Data checks</h2>{
        _table(
            sorted(checks_rows, key=lambda r: not str(r["result"]).startswith("failed")),
            ["partition", "check", "severity", "figure", "threshold", "result", "note"],
        )
    }
<h2>Tonight against the reference</h2>{
        "".join(plots) or "<p>no partition was judged in this run</p>"
    }
<h2>Model</h2>{_metrics(metrics or {})}{history}
<h2>Champion</h2><p><b>{html.escape(champion.get("zhpipe.registered", "-"))}</b> {
        html.escape(state)
    }</p>
<p>{html.escape(decision)}</p>
</body></html>"""
