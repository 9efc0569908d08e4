"""The champion rule's settings, shared by every kind's `evaluate` section (`evaluate.champion`): a
newly chosen model replaces the champion only when a paired bootstrap on the same test rows puts the
whole interval of the difference above zero, and it is no worse on any slice (class, length bucket)
beyond a tolerance."""

from __future__ import annotations

from pydantic import Field

from tasks.core import Section


class ChampionRule(Section):
    """The `evaluate.champion` section."""

    # the interval of the difference (challenger - champion)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    rounds: int = Field(1000, ge=100)  # bootstrap resamples of the test rows
    # the most a slice may lose, in the metric's units
    slice_tolerance: float = Field(0.05, ge=0.0, le=1.0)
    min_slice_rows: int = Field(20, ge=1)  # smaller slices are not judged (their scores are noise)
