"""What every kind's reports share: the profile section's common settings, the HTML report page and
the Markdown statistics; the model comparison table and training curves."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd
from pydantic import Field

from tasks.core import BuildOutput, Facts, Section


class Common(Section):
    """The `profile` settings every task kind reads (each kind's section adds its own)."""

    top_k: int = Field(20, ge=1)  # words (entities, tokens) shown per label (type, side)
    coverage: float = Field(0.9, gt=0, lt=1)  # the suggested max_len covers this share of texts
    # a font file with Chinese glyphs; default: an installed one (Noto CJK, WenQuanYi, ...)
    font: str | None = None
    seed: int = 0


def report_html(
    title: str,
    stats: dict,
    tables: dict[str, pd.DataFrame],
    pictures: list[Path],
    markup: tuple[str, ...] = (),
) -> str:
    """One page with every table and picture inlined (the MLflow UI shows .html artifacts); the
    tables named in `markup` hold HTML already escaped by their maker."""
    from tasks.util.plots import data_uri

    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}img{max-width:100%}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:2px "
        "8px}</style></head><body>",
        f"<h1>{html.escape(title)}</h1><h2>Corpus</h2>",
        pd.DataFrame([stats]).T.rename(columns={0: "value"}).to_html(),
    ]
    for name, table in tables.items():
        parts += [
            f"<h2>{html.escape(name)}</h2>",
            table.to_html(index=False, escape=name not in markup),
        ]
    for picture in pictures:
        parts += [
            f"<h3>{html.escape(picture.stem.replace('_', ' '))}</h3>",
            f"<img src='{data_uri(picture)}' alt='{picture.stem}'>",
        ]
    return "\n".join(parts + ["</body></html>"])


_MARKDOWN_SPECIAL = str.maketrans(
    {c: "\\" + c for c in "\\`*{}[]()#+!|~"}
    | {"<": "&lt;", ">": "&gt;", "&": "&amp;", "\n": " ", "\r": " "}
)


def markdown_text(value) -> str:
    """A value as literal Markdown text: HTML characters as entities, Markdown's own characters
    escaped (not `_`, which inside a word is literal in CommonMark: `test_accuracy` stays as it is),
    on one line (a partition named `<img onerror=...>` or `[x](javascript:...)` reads as its name,
    never as markup)."""
    return str(value).translate(_MARKDOWN_SPECIAL)


def stats_markdown(pipeline: str, stats: dict) -> str:
    """The corpus statistics as a Markdown table."""
    lines = [f"# {markdown_text(pipeline)}: corpus profile", "", "| measure | value |", "|---|---|"]
    lines += [
        f"| {markdown_text(k)} | {v:.4g} |"
        if isinstance(v, float)
        else f"| {markdown_text(k)} | {markdown_text(v)} |"
        for k, v in stats.items()
    ]
    return "\n".join(lines)


def comparison_markdown(table: pd.DataFrame) -> str:
    """The comparison table as Markdown (for Prefect's artifact view)."""
    header = (
        "| "
        + " | ".join(markdown_text(c) for c in table.columns)
        + " |\n|"
        + "---|" * len(table.columns)
        + "\n"
    )
    body = "".join(
        "| "
        + " | ".join(
            ("" if v != v else f"{v:.4f}") if isinstance(v, float) else markdown_text(v)
            for v in row
        )
        + " |\n"
        for row in table.itertuples(index=False)
    )
    return header + body


def write_comparison(out: Path, rows: list[dict], metric: str, results: dict) -> str:
    """`comparison.csv` and `comparison.md` of the scored models, best first by `metric` (higher is
    better), and their `results.json`; returns the best model."""
    import json

    table = pd.DataFrame(rows).sort_values(metric, ascending=False, kind="stable")
    table.to_csv(out / "comparison.csv", index=False)
    (out / "comparison.md").write_text(comparison_markdown(table), encoding="utf-8")
    (out / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    return table.iloc[0]["model"]


def comparison_output(
    out: Path, rows: list[dict], metric: str, results: dict, logged, headline: str, labels: list
) -> BuildOutput:
    """An evaluate stage's output from its scored models: `write_comparison` by `metric`, each
    model's results whose name `logged` accepts as metrics (`<model>_<name>`), and the best model's
    `headline` result as `best_<headline>`."""
    best = write_comparison(out, rows, metric, results)
    metrics = {f"{m}_{k}": v for m, r in results.items() for k, v in r.items() if logged(k)}
    return BuildOutput(
        rows=None,
        artifacts=["comparison.csv", "comparison.md"],
        metrics=metrics | {f"best_{headline}": results[best][headline]},
        facts=Facts(labels=labels, results=results, best_model=best),
    )


def plot_training_curves(history: list[dict[str, float]], title: str, path: Path) -> Path | None:
    """Loss (train and validation) and validation metrics per epoch; None without a per-epoch
    history."""
    from tasks.util.plots import save, subplots

    if not history:
        return None
    h = pd.DataFrame(history)
    fig, (left, right) = subplots(1, 2, figsize=(9, 3.6))
    for col in [c for c in ("train_loss", "val_loss") if c in h]:
        left.plot(h["epoch"], h[col], marker="o", label=col)
    left.set(xlabel="epoch", ylabel="loss", title="loss")
    left.legend()
    for col in [
        c
        for c in ("val_accuracy", "val_macro_f1", "val_f1", "val_perplexity", "val_bleu")
        if c in h
    ]:
        right.plot(h["epoch"], h[col], marker="o", label=col)
    right.set(xlabel="epoch", title="validation")
    if right.lines:
        right.legend()
    else:  # a model that only watches its validation loss (translators)
        right.set_axis_off()
    fig.suptitle(title)
    return save(fig, path)
