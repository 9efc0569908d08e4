"""Two models compared on the same test rows, as the champion rule needs it: per row what a metric
is made of (`Outcomes`), the metric of any resample of rows, a paired bootstrap interval of the
difference (the same resampled rows for both models), and the slices (classes, length buckets,
entity types) on which the challenger is worse. The interval is over rows: sentences for entity F1
and BLEU, as sacrebleu's paired bootstrap."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Outcomes:
    """What one model did on each row of a test split. `kind` says how the metric is made: `labels`
    (columns `truth` and `predicted`: accuracy or macro-F1), `spans` (per-row `tp`, `fp`, `fn`:
    strict entity F1) or `bleu` (per-row sacrebleu statistics `stats`, rows x 10, and its
    tokenizer). `slices`: per slice family, each row's slice (a class, a length bucket);
    `slice_counts`: per entity type, per-row (tp, fp, fn) for span slices."""

    kind: str
    metric: str
    columns: dict[str, np.ndarray]
    slices: dict[str, np.ndarray] = field(default_factory=dict)
    tokenize: str = "13a"

    @property
    def proportion(self) -> bool:
        """Whether its metric is a proportion of rows (accuracy, F1), whose noise is that of a
        proportion (not BLEU)."""
        return self.kind != "bleu"

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values())))

    def score(self, idx: np.ndarray | None = None) -> float:
        """The metric on the rows `idx` (all rows when None)."""
        cols = self.columns if idx is None else {k: v[idx] for k, v in self.columns.items()}
        if self.kind == "labels":
            truth, predicted = cols["truth"], cols["predicted"]
            if self.metric == "macro_f1":
                return macro_f1(truth, predicted)
            return float(np.mean(truth == predicted)) if len(truth) else 0.0
        if self.kind == "spans":
            tp, fp, fn = (float(cols[k].sum()) for k in ("tp", "fp", "fn"))
            return 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        from sacrebleu.metrics import BLEU

        return float(
            BLEU(tokenize=self.tokenize)
            ._compute_score_from_stats(cols["stats"].sum(0).tolist())
            .score
        )


def macro_f1(truth: np.ndarray, predicted: np.ndarray) -> float:
    """Macro-F1 over the classes present in `truth` (as sklearn's with `labels=` those classes)."""
    scores = []
    for label in np.unique(truth):
        tp = np.sum((truth == label) & (predicted == label))
        fp, fn = (
            np.sum((truth != label) & (predicted == label)),
            np.sum((truth == label) & (predicted != label)),
        )
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return float(np.mean(scores)) if scores else 0.0


@dataclass
class Comparison:
    """The challenger's score minus the champion's on the same rows, with its paired bootstrap
    interval."""

    champion: float
    challenger: float
    low: float
    high: float
    rows: int
    confidence: float
    worse_slices: list[str] = field(default_factory=list)

    @property
    def difference(self) -> float:
        return self.challenger - self.champion

    def better(self) -> bool:
        """Better beyond the noise: the whole interval above zero, and worse on no slice beyond the
        tolerance."""
        return self.low > 0 and not self.worse_slices


def compare(
    champion: Outcomes,
    challenger: Outcomes,
    rounds: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    tolerance: float = 0.05,
    min_slice_rows: int = 20,
) -> Comparison:
    """Paired bootstrap over rows: `rounds` resamples of the test rows, each scored for both models;
    the interval is the central `confidence` share of the differences. A slice (of at least
    `min_slice_rows` rows) on which the challenger scores more than `tolerance` below the champion
    is named."""
    if champion.rows != challenger.rows:
        raise ValueError(
            f"the two models were scored on different rows ({champion.rows} and {challenger.rows})"
        )
    rng = np.random.default_rng(seed)
    n = champion.rows
    diffs = np.empty(rounds)
    for r in range(rounds):
        idx = rng.integers(0, n, n)
        diffs[r] = challenger.score(idx) - champion.score(idx)
    tail = (1 - confidence) / 2
    low, high = np.quantile(diffs, [tail, 1 - tail]) if n else (0.0, 0.0)
    worse = []
    for family, per_row in champion.slices.items():
        for value in np.unique(per_row):
            idx = np.flatnonzero(per_row == value)
            theirs, ours = (
                slice_score(challenger, family, value, idx),
                slice_score(champion, family, value, idx),
            )
            if len(idx) >= min_slice_rows and theirs < ours - tolerance:
                what = " F1" if family == "class" and champion.kind == "labels" else ""
                worse.append(
                    f"{family} {value}{what}: {theirs:.4f} against {ours:.4f} ({len(idx)} rows)"
                )
    # an entity type: its F1 over all sentences, judged on enough gold entities
    for kind in entity_types(champion):
        gold = int(champion.columns[f"tp:{kind}"].sum() + champion.columns[f"fn:{kind}"].sum())
        theirs, ours = type_f1(challenger, kind), type_f1(champion, kind)
        if gold >= min_slice_rows and theirs < ours - tolerance:
            worse.append(f"entity {kind} F1: {theirs:.4f} against {ours:.4f} ({gold} entities)")
    return Comparison(
        champion.score(), challenger.score(), float(low), float(high), n, confidence, worse
    )


def entity_types(outcomes: Outcomes) -> list[str]:
    """The entity types a span outcome counts per type (`tp:<type>` columns)."""
    return (
        sorted(k.split(":", 1)[1] for k in outcomes.columns if k.startswith("tp:"))
        if outcomes.kind == "spans"
        else []
    )


def type_f1(outcomes: Outcomes, kind: str) -> float:
    """Strict F1 of one entity type over all sentences (0 when the model has no counts of that
    type)."""
    if f"tp:{kind}" not in outcomes.columns:
        return 0.0
    tp, fp, fn = (float(outcomes.columns[f"{k}:{kind}"].sum()) for k in ("tp", "fp", "fn"))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def slice_score(outcomes: Outcomes, family: str, value, idx: np.ndarray) -> float:
    """A model's score on one slice. A class is judged by its F1 over all rows, not by accuracy on
    its own rows (its recall): a model that puts every row in one class would otherwise win that
    class's slice."""
    if outcomes.kind == "labels" and family == "class":
        truth, predicted = outcomes.columns["truth"], outcomes.columns["predicted"]
        tp = np.sum((truth == value) & (predicted == value))
        fp, fn = (
            np.sum((truth != value) & (predicted == value)),
            np.sum((truth == value) & (predicted != value)),
        )
        return float(2 * tp / (2 * tp + fp + fn)) if tp else 0.0
    return outcomes.score(idx)


def length_buckets(texts, edges: tuple[int, ...] = (20, 50, 100, 200)) -> np.ndarray:
    """Each text's length bucket (`<20`, `20-49`, ... `200+` characters), a slice family of every
    kind."""
    lengths = np.array([len(t) for t in texts])
    names = [f"<{edges[0]}", *(f"{a}-{b - 1}" for a, b in zip(edges, edges[1:])), f"{edges[-1]}+"]
    return np.array(names, dtype=object)[np.searchsorted(edges, lengths, side="right")]
