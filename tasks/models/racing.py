"""A training budget (`train.budget`, `train.model_budget`), as AutoGluon's `time_limit` and FLAML's
`time_budget`: a bound on the whole training stage's wall time, every model counted. The models run
cheapest first (`ModelSpec.cost`); the first always trains, so that there is a model. Each later
model's cost is estimated before it starts: a model that does not race from its history in the store
(its last fit's seconds per training row), else from timed fits on two samples of the train split; a
network from its first batches. A model whose estimate does not fit in what is left is not started
(or stopped within its first epoch): `BudgetCut`, `not trained: the budget left it no time`: named
in the comparison without scores, never registered. A model that trains through the shared loop
(`ModelSpec.races`) gets a share of what is left, races the leader (the best validation score so
far) and is stopped when its share runs out or its validation curve cannot reach the leader within
it; a model cut short says why, and the selection and the champion gate treat it as any other
model."""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from tasks.errors import ZhpipeError

log = logging.getLogger("zhpipe.train")
_UNITS = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}


def seconds(value: float | str | None) -> float | None:
    """A budget as seconds: a number (seconds), or text such as `90s`, `3min`, `1.5h`; None: no
    budget."""
    if value is None or isinstance(value, int | float):
        if value is not None and value <= 0:
            raise ValueError(f"a budget must be positive, got {value}")
        return None if value is None else float(value)
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*", str(value))
    if not found or float(found.group(1)) <= 0:
        raise ValueError(
            "a budget is a positive number of seconds or a time such as 90s, 3min, 1.5h (got "
            f"{value!r})"
        )
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]


@dataclass
class Race:
    """One model's part in the race: its share of the budget (seconds), the leader it races (model
    and validation scores), and, once it ran, why it was cut short (empty: it trained as
    configured)."""

    share: float
    leader: str | None = None
    leader_scores: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    cut: str = ""
    first: bool = False  # no model has trained yet: this one always does
    # its cost in seconds, from its history in the store (None: not known yet)
    estimate: float | None = None

    def left(self) -> float:
        return self.share - (time.monotonic() - self.started)

    def admit(self, estimate: float | None = None, how: str = "") -> None:
        """Start the model, or raise `BudgetCut` when what is left of its share is less than its
        estimated cost (`estimate`, else its history's) or nearly nothing (the first model always
        starts)."""
        estimate = self.estimate if estimate is None else estimate
        left = self.left()
        if self.first:
            return
        if left < MIN_START:
            raise BudgetCut(f"{NOT_TRAINED} ({max(left, 0):.0f} s of the budget left)")
        if estimate is not None and estimate > left:
            raise BudgetCut(
                f"{NOT_TRAINED} (it would take about {estimate:.0f} s{how}; {left:.0f} s of its "
                "share "
                f"were left)"
            )

    def target(self, monitor: str, mode: str) -> float | None:
        """The leader's score on `monitor`, signed so that higher is better (None: no leader on that
        metric)."""
        score = self.leader_scores.get(monitor)
        return None if score is None else (score if mode == "max" else -score)

    def hopeless(self, curve: list[float], epochs_left: int, monitor: str, mode: str) -> str:
        """Why the model cannot reach the leader within its share (empty: it still can), from its
        validation curve (signed: higher is better): even gaining its best epoch's gain every epoch
        left, it stays behind. Judged from the second epoch on (one point has no gain)."""
        target = self.target(monitor, mode)
        if target is None or len(curve) < 2:
            return ""
        best = max(curve)
        gain = max(max(b - a for a, b in zip(curve, curve[1:])), 0.0)
        if best >= target or best + gain * epochs_left >= target:
            return ""
        shown = abs(self.leader_scores[monitor])
        return (
            f"cannot reach the leader {self.leader} ({monitor} {shown:.4f}) within its share: best "
            f"{abs(best):.4f},"
            f" at most {gain:.4f} an epoch over {epochs_left} more "
            f"epoch{'s' if epochs_left != 1 else ''}"
        )


MIN_START = 1.0  # seconds: with less left, a model (but the first) is not started
NOT_TRAINED = "not trained: the budget left it no time"


class BudgetCut(ZhpipeError):
    """A model the training budget left no time for: not started, or stopped within its first
    epoch."""


class Budget:
    """The clock of one train stage: `budget` seconds for all its models, at most `per_model` for
    each. A model that races gets an even share of what is left among the racing models still to
    run; another (linear models, fastText, n-grams, a team's estimator) may use all that is left,
    and is never stopped once started."""

    def __init__(
        self,
        budget: float | None,
        per_model: float | None,
        racing: list[str],
        leads: str = "val_accuracy",
    ):
        self.budget, self.per_model, self.waiting, self.leads = (
            budget,
            per_model,
            list(racing),
            leads,
        )
        self.started = time.monotonic()
        self.leader: tuple[str, dict[str, float]] | None = None
        self.done: list[str] = []  # the models built or reused, in order
        self.cut: dict[str, str] = {}  # the models the budget left no time for, and why

    @property
    def active(self) -> bool:
        return self.budget is not None or self.per_model is not None

    def spent(self) -> float:
        return time.monotonic() - self.started

    def race(self, model: str, races: bool = True, estimate: float | None = None) -> Race | None:
        """The race of the next model (None when no budget is set): a racing model's share is an
        even part of what is left among the racing models still to run; another's, all that is
        left."""
        if model in self.waiting:
            self.waiting.remove(model)
        if not self.active:
            return None
        left = math.inf if self.budget is None else self.budget - self.spent()
        share = min(left / (len(self.waiting) + 1) if races else left, self.per_model or math.inf)
        leader, scores = self.leader or (None, {})
        return Race(max(share, 0.0), leader, dict(scores), first=not self.done, estimate=estimate)

    def skipped(self, model: str, why: str) -> None:
        if model in self.waiting:
            self.waiting.remove(model)
        self.cut[model] = why

    def finished(self, model: str, summary: dict) -> None:
        """A model is done (built, or reused): with its validation scores it leads when it is ahead
        on `leads` (what the selection ranks by); a network then races the leader on the metric its
        own loop monitors."""
        if model in self.waiting:
            self.waiting.remove(model)
        self.done.append(model)
        score = summary.get(self.leads)
        if isinstance(score, int | float) and (
            self.leader is None or score > self.leader[1][self.leads]
        ):
            self.leader = (
                model,
                {
                    k: float(v)
                    for k, v in summary.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                },
            )

    def said(self) -> str:
        """One line on what the budget did (empty: it cut nothing and was kept within 10%)."""
        parts = [f"{model} {why}" for model, why in self.cut.items()]
        spent = self.spent()
        if self.budget is not None and spent > 1.1 * self.budget:
            parts.append(f"training took {spent:.0f} s, over its budget of {self.budget:.0f} s")
        return "; ".join(parts)


def from_history(builds: list[tuple[float, int | None]], rows: int) -> float | None:
    """A model's estimated seconds on `rows` training rows from its earlier builds' (seconds, rows),
    newest first: the newest's seconds per row (None: no build with rows)."""
    for seconds, built_rows in builds:
        if built_rows:
            return seconds * rows / built_rows
    return None


def from_samples(points: list[tuple[int, float]], rows: int) -> float:
    """Seconds on `rows` rows from timed fits on samples, `(rows, seconds)`: the line through the
    two (a fixed cost and a cost per row), extrapolated; in proportion to the larger sample when
    noise hid the slope."""
    (n1, t1), (n2, t2) = sorted(points)[0], sorted(points)[-1]
    per_row = (t2 - t1) / (n2 - n1) if n2 > n1 else 0.0
    if per_row <= 0:  # the samples' noise hid the cost per row: in proportion to the larger sample
        return t2 * rows / max(n2, 1)
    return max(t1 - per_row * n1, 0.0) + per_row * rows


# ---- the shared loop's side of the race (tasks/models/trainer.py) --------------------------------

# the training time is estimated after this many batches (or a tenth of an epoch, if more), or
# seconds, whichever comes first (the first batch, which pays for warm-up, left out): batches of
# different lengths cost differently, and a few are a noisy sample
ESTIMATE_AFTER = (20, 30.0)


def estimate_line(name: str, seconds: float, batches: int, steps: int, epochs_left: int) -> str:
    """How long a model's training will take, from its first batches (validation and early stopping
    aside)."""
    per_batch = seconds / max(batches, 1)
    total = per_batch * (steps * epochs_left - batches)
    shown = (
        f"{total / 3600:.1f} h"
        if total >= 5400
        else f"{total / 60:.0f} min"
        if total >= 90
        else f"{total:.0f} s"
    )
    return (
        f"{name}: about {shown} more to train ({epochs_left} "
        f"epoch{'s' if epochs_left != 1 else ''} of {steps} "
        f"batches at {per_batch:.2f} s a batch, from its first {batches}); fewer epochs or a "
        "smaller "
        f"model is one --set away"
    )


def say_estimate(
    name: str, seconds: float, batches: int, steps: int, epoch: int, cfg, plan: dict
) -> str:
    """Say the estimate (a log line; in a race, with the model's share). Returns the progress bar's
    short form."""
    line = estimate_line(name, seconds, batches, steps, plan["epochs"] - epoch + 1)
    race = plan.get("race")
    if race is not None:
        line += f"; its share of the budget is {race.share:.0f} s"
    log.info("%s", line)
    return line.split(" (")[0].split(": ", 1)[1]


def judge_race(name: str, plan: dict, state: dict, cfg, sign: float, epoch_seconds: float) -> None:
    """After an epoch of a model in a race (`plan["race"]`, `cfg` its LoopConfig): stop it when its
    share ran out (inside the epoch, or too little is left for another), or when its curve cannot
    reach the leader in the epochs that still fit; plan fewer epochs when fewer fit."""
    race, epoch = plan["race"], state["epoch"]
    left = plan["epochs"] - epoch
    if not race.cut.startswith("stopped") and left and not state["done"]:
        # a share overrun: none, not < 0
        fits = max(0, min(left, int(race.left() / max(epoch_seconds, 1e-9))))
        curve = [sign * row[cfg.monitor] for row in state["history"]]
        why = race.hopeless(curve, fits, cfg.monitor, cfg.mode) or (
            f"stopped after epoch {epoch} of {plan['epochs']}: an epoch takes about "
            f"{epoch_seconds:.0f} s and "
            f"{max(race.left(), 0):.0f} s of its share of the budget ({race.share:.0f} s) are left"
            if not fits
            else ""
        )
        if why:
            race.cut = why if why.startswith("stopped") else f"stopped after epoch {epoch}: {why}"
        elif fits < left:  # fewer epochs fit: the learning rate now decays to 0 over those
            replan(plan, epoch + fits, cfg.warmup_ratio, plan["steps"])
            race.cut = (
                f"trained {plan['epochs']} of {cfg.epochs} epochs: an epoch takes about "
                f"{epoch_seconds:.0f} s "
                f"and its share of the budget is {race.share:.0f} s"
            )
            log.info(
                "%s: %d more epoch%s fit its share of the budget (%.0f s left)",
                name,
                fits,
                "s" if fits != 1 else "",
                race.left(),
            )
    if race.cut.startswith("stopped"):
        # said once, with the model's summary (flows/orchestrate/model_stages.py)
        state["done"] = True


def replan(plan: dict, epochs: int, warmup_ratio: float, steps_per_epoch: int) -> None:
    """The step counts the learning-rate schedule (tasks/models/trainer.py `warmup_linear_decay`)
    decays over."""
    plan["epochs"], plan["total"] = epochs, max(1, steps_per_epoch * epochs)
    plan["warmup"] = int(warmup_ratio * plan["total"])


_RACE: ContextVar[Race | None] = ContextVar("zhpipe_race", default=None)


@contextlib.contextmanager
def racing(race: Race | None) -> Iterator[Race | None]:
    """Train inside `race`: the shared loop (tasks.models.trainer.fit) reads it with `current()`."""
    token = _RACE.set(race)
    try:
        yield race
    finally:
        _RACE.reset(token)


def current() -> Race | None:
    return _RACE.get()
