"""A training budget (`train.budget`, `train.model_budget`), as AutoGluon's `time_limit` and FLAML's `time_budget`:
the models of a train stage run cheapest first (`ModelSpec.cost`), and each model that trains through the shared loop
(`ModelSpec.races`) gets a share of what is left, races the leader (the best validation score so far) and is stopped
when its share runs out or its validation curve cannot reach the leader within it. A model cut short says why; the
selection and the champion gate treat it as any other model."""
from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

log = logging.getLogger("zhpipe.train")
_UNITS = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}


def seconds(value: float | str | None) -> float | None:
    """A budget as seconds: a number (seconds), or text such as `90s`, `3min`, `1.5h`; None: no budget."""
    if value is None or isinstance(value, int | float):
        if value is not None and value <= 0:
            raise ValueError(f"a budget must be positive, got {value}")
        return None if value is None else float(value)
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*", str(value))
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"a budget is a positive number of seconds or a time such as 90s, 3min, 1.5h (got {value!r})")
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]


@dataclass
class Race:
    """One model's part in the race: its share of the budget (seconds), the leader it races (model and validation
    scores), and, once it ran, why it was cut short (empty: it trained as configured)."""

    share: float
    leader: str | None = None
    leader_scores: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    cut: str = ""

    def left(self) -> float:
        return self.share - (time.monotonic() - self.started)

    def target(self, monitor: str, mode: str) -> float | None:
        """The leader's score on `monitor`, signed so that higher is better (None: no leader on that metric)."""
        score = self.leader_scores.get(monitor)
        return None if score is None else (score if mode == "max" else -score)

    def hopeless(self, curve: list[float], epochs_left: int, monitor: str, mode: str) -> str:
        """Why the model cannot reach the leader within its share (empty: it still can), from its validation curve
        (signed: higher is better): even gaining its best epoch's gain every epoch left, it stays behind. Judged from
        the second epoch on (one point has no gain)."""
        target = self.target(monitor, mode)
        if target is None or len(curve) < 2:
            return ""
        best = max(curve)
        gain = max(max(b - a for a, b in zip(curve, curve[1:])), 0.0)
        if best >= target or best + gain * epochs_left >= target:
            return ""
        shown = abs(self.leader_scores[monitor])
        return (f"cannot reach the leader {self.leader} ({monitor} {shown:.4f}) within its share: best {abs(best):.4f},"
                f" at most {gain:.4f} an epoch over {epochs_left} more epoch{'s' if epochs_left != 1 else ''}")


class Budget:
    """The clock of one train stage: `budget` seconds for all its models, at most `per_model` for each. A model that
    races gets an even share of what is left among the racing models still to run; the others (linear models,
    fastText, n-grams: seconds each) run first and are never stopped."""

    def __init__(self, budget: float | None, per_model: float | None, racing: list[str], leads: str = "val_accuracy"):
        self.budget, self.per_model, self.waiting, self.leads = budget, per_model, list(racing), leads
        self.started = time.monotonic()
        self.leader: tuple[str, dict[str, float]] | None = None

    @property
    def active(self) -> bool:
        return self.budget is not None or self.per_model is not None

    def race(self, model: str) -> Race | None:
        """The race of the next racing model (None when no budget is set)."""
        if model in self.waiting:
            self.waiting.remove(model)
        if not self.active:
            return None
        left = math.inf if self.budget is None else self.budget - (time.monotonic() - self.started)
        share = min(left / (len(self.waiting) + 1), self.per_model or math.inf)
        leader, scores = self.leader or (None, {})
        return Race(max(share, 0.0), leader, dict(scores))

    def finished(self, model: str, summary: dict) -> None:
        """A model is done (built, or reused): with its validation scores it leads when it is ahead on `leads` (what
        the selection ranks by); a network then races the leader on the metric its own loop monitors."""
        if model in self.waiting:
            self.waiting.remove(model)
        score = summary.get(self.leads)
        if isinstance(score, int | float) and (self.leader is None or score > self.leader[1][self.leads]):
            self.leader = (model, {k: float(v) for k, v in summary.items()
                                   if isinstance(v, int | float) and not isinstance(v, bool)})


# ---- the shared loop's side of the race (tasks/models/trainer.py) ------------------------------------------------

# the training time is estimated after this many batches (or a tenth of an epoch, if more), or seconds, whichever
# comes first (the first batch, which pays for warm-up, left out): batches of different lengths cost differently,
# and a few are a noisy sample
ESTIMATE_AFTER = (20, 30.0)


def estimate_line(name: str, seconds: float, batches: int, steps: int, epochs_left: int) -> str:
    """How long a model's training will take, from its first batches (validation and early stopping aside)."""
    per_batch = seconds / max(batches, 1)
    total = per_batch * (steps * epochs_left - batches)
    shown = f"{total / 3600:.1f} h" if total >= 5400 else f"{total / 60:.0f} min" if total >= 90 else f"{total:.0f} s"
    return (f"{name}: about {shown} more to train ({epochs_left} epoch{'s' if epochs_left != 1 else ''} of {steps} "
            f"batches at {per_batch:.2f} s a batch, from its first {batches}); fewer epochs or a smaller "
            f"model is one --set away")


def say_estimate(name: str, seconds: float, batches: int, steps: int, epoch: int, cfg, plan: dict) -> str:
    """Say the estimate (a log line; in a race, with the model's share). Returns the progress bar's short form."""
    line = estimate_line(name, seconds, batches, steps, plan["epochs"] - epoch + 1)
    race = plan.get("race")
    if race is not None:
        line += f"; its share of the budget is {race.share:.0f} s"
    log.info("%s", line)
    return line.split(" (")[0].split(": ", 1)[1]


def judge_race(name: str, plan: dict, state: dict, cfg, sign: float, epoch_seconds: float) -> None:
    """After an epoch of a model in a race (`plan["race"]`, `cfg` its LoopConfig): stop it when its share ran out
    (inside the epoch, or too little is left for another), or when its curve cannot reach the leader in the epochs that
    still fit; plan fewer epochs when fewer fit."""
    race, epoch = plan["race"], state["epoch"]
    left = plan["epochs"] - epoch
    if not race.cut.startswith("stopped") and left and not state["done"]:
        fits = max(0, min(left, int(race.left() / max(epoch_seconds, 1e-9))))  # a share overrun: none, not < 0
        curve = [sign * row[cfg.monitor] for row in state["history"]]
        why = race.hopeless(curve, fits, cfg.monitor, cfg.mode) or (
            f"stopped after epoch {epoch} of {plan['epochs']}: an epoch takes about {epoch_seconds:.0f} s and "
            f"{max(race.left(), 0):.0f} s of its share of the budget ({race.share:.0f} s) are left" if not fits else "")
        if why:
            race.cut = why if why.startswith("stopped") else f"stopped after epoch {epoch}: {why}"
        elif fits < left:  # fewer epochs fit: the learning rate now decays to 0 over those
            replan(plan, epoch + fits, cfg.warmup_ratio, plan["steps"])
            race.cut = (f"trained {plan['epochs']} of {cfg.epochs} epochs: an epoch takes about {epoch_seconds:.0f} s "
                        f"and its share of the budget is {race.share:.0f} s")
            log.info("%s: %d more epoch%s fit its share of the budget (%.0f s left)", name, fits,
                     "s" if fits != 1 else "", race.left())
    if race.cut.startswith("stopped"):
        state["done"] = True  # said once, with the model's summary (flows/orchestrate/model_stages.py)


def replan(plan: dict, epochs: int, warmup_ratio: float, steps_per_epoch: int) -> None:
    """The step counts the learning-rate schedule (tasks/models/trainer.py `warmup_linear_decay`) decays over."""
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
