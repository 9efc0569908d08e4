"""What a task kind's serving module holds (`TaskKind.serving`, e.g.
tasks/classification/serving.py). flows/ logs and serves every kind's registered models through one
generic MLflow pyfunc (flows/track/serving.py) that calls these names, so a kind's inference
pipeline, its scoring for the champion rule and how `zhpipe predict` shows its answers live in its
own folder:

- `Served(config, model)`: the kind's inference pipeline, built from the model's zhpipe.json
  (`config`, its segmenter files pointed at the model's artifacts) and the trained model's folder:
  `served(values)` takes raw texts (None for a missing one) and returns one row per text, with a
  `status` column; an input error is a `BadInput`. It has `max_rows` (the most texts one call
  takes).
- `settings(config, labels) -> dict`: the sections of the pipeline config (and the labels) the
  served model replays, saved as its zhpipe.json.
- `example(model) -> list[str]`: texts that show what the model takes (its signature and input
  example).
- `outcomes(served, ask, test, metric) -> tasks.util.paired.Outcomes`: what a served model does on
  each row of a test split (`ask(texts)` returns its answers as served), for the champion rule's
  paired bootstrap.
- `SHOWN`: a `Shown`, how `zhpipe predict` writes its answers.
Imports nothing heavy."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EXAMPLE_ZH = ["房间很干净，服务也好", "早餐太差了"]


class BadInput(ValueError):
    """An input a served model refuses (the scoring server answers HTTP 400 with the message)."""


def segmenter_of(config: dict):
    """The segmenter a served model replays (its zhpipe.json's `segment` section)."""
    from tasks.util.segmenter import Segmenter, SegmenterParams

    segment = config["segment"]
    return Segmenter(
        SegmenterParams(**{k: v for k, v in segment.items() if k in SegmenterParams.model_fields})
    )


def limits(config: dict, max_chars: int) -> tuple[int, int]:
    """(the most texts per call, the longest text) from a served model's `predict` section
    (`max_chars` by default)."""
    predict = config.get("predict") or {}
    return predict.get("max_rows", 10_000), predict.get("max_chars", max_chars)


def checked(values: list[Any], max_rows: int) -> list[Any]:
    """`values` when they are at most `max_rows` strings or None; else a `BadInput` naming the first
    bad one."""
    if len(values) > max_rows:
        raise BadInput(f"{len(values)} texts in one call; at most {max_rows} (predict.max_rows)")
    for n, value in enumerate(values, 1):
        if value is not None and not isinstance(value, str):
            raise BadInput(f"text {n} is a {type(value).__name__}, not a string")
    return values


def status(value: str | None, cleaned: str, max_chars: int) -> str:
    """A text's status as served: missing, empty (nothing left after cleaning), truncated (cut at
    `max_chars`) or ok."""
    if value is None:
        return "missing"
    if not cleaned.strip():
        return "empty"
    return "truncated" if len(value) > max_chars else "ok"


@dataclass(frozen=True)
class Shown:
    """How `zhpipe predict` shows a kind's answers: `answer` is the column that tells its output
    from another kind's, `columns` what a table shows beside the text and status, `nested` the
    columns that hold JSON (objects in JSONL, `cell` text in a table), `found` the one-line count
    after `--output`."""

    answer: str
    columns: tuple[str, ...]
    found: Callable[[Any], str]
    nested: tuple[str, ...] = ()
    cell: Callable[[str], str] = str

    def record(self, row: dict) -> dict:
        """One answer as a JSON line's fields."""
        return {c: json.loads(row[c]) if c in self.nested else row[c] for c in self.columns}
