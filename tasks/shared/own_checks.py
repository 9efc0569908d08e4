"""Data checks of a team's own (`checks.custom.<name>`, docs/extending.md), judged after the
built-in ones of tasks/shared/checks.py and reported, held and alerted exactly as they are."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pydantic import field_validator

from tasks.core import Section
from tasks.util.usercode import CodeRef, last_line, load


class OwnCheck(Section):
    """A check of the team's own (`checks.custom.<name>`), like Dagster's `@asset_check`:
    `function(frame) -> float` over a partition's cleaned rows (`text`, `raw_text`, `label` where
    labelled); it passes when the figure is at most `threshold`. A blocking failure holds the
    partition as a built-in check does; a function that raises fails the check, with its error's
    last line (a broken check never passes in silence)."""

    # module:function, in the project folder or an installed package (docs/extending.md)
    function: str
    threshold: float
    blocking: bool = True  # false: a failure is reported (warn) and the run goes on

    @field_validator("function")
    @classmethod
    def _reference(cls, value: str) -> str:
        return str(CodeRef.parse(value, "checks.custom"))


def judge_own(night: pd.DataFrame, custom: dict[str, OwnCheck], root: Path | None) -> list[tuple]:
    """(check, severity, figure, threshold, passed, note) per check of the team's on tonight's rows,
    their modules found in the project folder `root` first: a checks.Verdict's fields."""
    verdicts = []
    for name, own in custom.items():
        where = f"checks.custom.{name}"
        function = load(CodeRef.parse(own.function, where), root or Path.cwd(), where)
        severity = "block" if own.blocking else "warn"
        try:
            figure = float(function(night.copy()))
        # the team's code may raise anything: the check fails, said
        except Exception as e:  # noqa: BLE001
            verdicts.append(
                (
                    name,
                    severity,
                    None,
                    own.threshold,
                    False,
                    f"{own.function} raised {last_line(e)}",
                )
            )
            continue
        verdicts.append(
            (
                name,
                severity,
                round(figure, 4),
                own.threshold,
                figure <= own.threshold,
                f"{own.function} on {len(night)} rows",
            )
        )
    return verdicts
