"""Declared checks on the data a night brings, native to Chinese text: each check is declared once
(`CHECKS`: what it measures, its default threshold and severity) and judged on the cleaned rows of a
partition (or of the corpus, for a source without partitions) against a reference (the rows the
current models were trained on: the earlier kept partitions, or the last corpus that passed). A
`block` failure holds the partition out (or stops the run before training); a `warn` failure is
reported and the run goes on. Pure: frames in, verdicts out (flows/orchestrate/gate.py runs them in
a pipeline)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from tasks.core import Section
from tasks.shared.measures import (
    cjk_share,
    looks_mojibake,
    mojibake_share,
    near_key,
    oov_rate,
    traditional_share,
    words,
)
from tasks.shared.own_checks import OwnCheck, judge_own
from tasks.util.usercode import CodeRef

# rows of tonight and of the reference that the text measures read (a seeded sample)
SAMPLE_ROWS = 2000
REFERENCE_ROWS = 20_000  # rows of the reference kept for the checks

Severity = Literal["block", "warn", "off"]


class CheckSetting(Section):
    """One check's setting in `checks:`: how bad is a failure, and its threshold (the check's table
    says in what)."""

    severity: Severity
    threshold: float


@dataclass(frozen=True)
class Sample:
    """What a check reads: the rows (text, raw text before cleaning, label where the corpus is
    labelled) and the counts of the cleaning that produced them."""

    frame: pd.DataFrame
    rows_in: int
    rows_kept: int
    # the reference's rows kept per night, most recent last (partitioned sources)
    recent_rows: tuple[int, ...] = ()
    recent_quarantine: tuple[float, ...] = ()  # the share clean set aside on each of those nights


@dataclass
class Verdict:
    """One check on one partition: its figure against its threshold; `passed` None: not judged (why
    in `note`)."""

    check: str
    severity: str
    figure: float | None
    threshold: float
    passed: bool | None
    note: str = ""

    @property
    def blocks(self) -> bool:
        return self.passed is False and self.severity == "block"

    @property
    def warns(self) -> bool:
        return self.passed is False and self.severity == "warn"

    def line(self, where: str) -> str:
        figure = "-" if self.figure is None else f"{self.figure:.3g}"
        state = {True: "passed", None: "not judged", False: "FAILED"}[self.passed]
        return (
            f"check {self.check} {state} on {where}: {figure} (threshold "
            f"{self.threshold:g}){': ' + self.note if self.note else ''}"
        )


@dataclass(frozen=True)
class Check:
    """A declared check: its name, what it measures (and so what its threshold is in), its defaults,
    and the function that returns its figure and whether the figure passes (None: not judged, with
    why)."""

    name: str
    measures: str
    severity: str
    threshold: float
    judge: Callable[[Sample, Sample | None, float, int], tuple[float | None, bool | None, str]] = (
        field(repr=False)
    )


def _ratio_rows(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    if not night.rows_in:
        return None, None, "no rows"
    recent = [r for r in (ref.recent_rows if ref else ()) if r][-7:]
    if not recent:
        return None, None, "no earlier nights to compare with"
    ratio = night.rows_kept / float(np.median(recent))
    return (
        ratio,
        1 / threshold <= ratio <= threshold,
        f"{night.rows_kept} rows kept against a median of {np.median(recent):.0f} on recent nights",
    )


# a night may set aside this much more than the recent nights' median share (plus sampling noise)
QUARANTINE_MARGIN = 0.15


def _quarantine(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    """The share clean set aside: at most `threshold`, and, once earlier nights are known, at most
    their median share plus QUARANTINE_MARGIN and three standard errors (a night whose rows collapse
    into duplicates and conflicts)."""
    if not night.rows_in:
        return 1.0, False, "the partition has no rows"
    if night.rows_in < min_rows:
        return None, None, f"too few rows ({night.rows_in} in)"
    rate = 1 - night.rows_kept / night.rows_in
    note = f"{night.rows_in - night.rows_kept} of {night.rows_in} rows quarantined by clean"
    recent = [q for q in (ref.recent_quarantine if ref else ()) if q is not None][-7:]
    if not recent:
        return rate, rate <= threshold, note
    base = float(np.median(recent))
    allowed = min(
        threshold,
        base + QUARANTINE_MARGIN + 3 * math.sqrt(max(base * (1 - base), 1e-4) / night.rows_in),
    )
    return (
        rate,
        rate <= allowed,
        f"{note}; allowed {allowed:.0%} (recent nights' median {base:.1%})",
    )


# tonight's rows shorter than the reference's 5th-percentile length: about 5% on an ordinary night
SHORT_QUANTILE = 0.05


def _short(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    """Degenerate text: the share of tonight's rows shorter than the reference's 5th-percentile
    length (text cut short, a broken export that keeps only a prefix)."""
    if ref is None or len(night.frame) < min_rows or len(ref.frame) < min_rows:
        return None, None, "no reference or too few rows"
    floor = float(np.quantile(ref.frame["text"].str.len(), SHORT_QUANTILE))
    lengths = night.frame["text"].str.len()
    share = float((lengths < floor).mean())
    return (
        share,
        share <= threshold,
        (
            f"{share:.0%} of rows shorter than {floor:.0f} characters, the reference's 5th "
            f"percentile (median {lengths.median():.0f}, reference "
            f"{ref.frame['text'].str.len().median():.0f})"
        ),
    )


# a reference whose labels a text model agrees with less than this cannot tell a shuffle from noise
MIN_KAPPA = 0.2


def _kappa(truth: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """Cohen's kappa of two labellings and its standard error (the large-sample approximation)."""
    n = len(truth)
    observed = float(np.mean(truth == pred))
    labels = np.union1d(truth, pred)
    expected = float(sum(np.mean(truth == k) * np.mean(pred == k) for k in labels))
    if expected >= 1:
        return 0.0, 1.0
    kappa = (observed - expected) / (1 - expected)
    se = math.sqrt(max(observed * (1 - observed), 1e-6) / (n * (1 - expected) ** 2))
    return kappa, se


def text_features():
    """The check's features: character 1-2-grams, TF-IDF (no segmentation: any script, any
    corpus)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(
        analyzer="char", ngram_range=(1, 2), sublinear_tf=True, min_df=2, max_features=50_000
    )


def text_classifier():
    """The check's model: a linear SVM (under a second on a few thousand rows, five folds
    included)."""
    from sklearn.svm import LinearSVC

    return LinearSVC(C=0.5)


def _agreement(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    """Whether tonight's labels say what its texts say: a text model trained on the reference labels
    tonight's rows; its agreement with tonight's labels (Cohen's kappa) against its cross-validated
    agreement on the reference. Shuffled, inverted or mislabelled rows keep any label shares but
    fall to chance agreement."""
    if (
        "label" not in night.frame
        or ref is None
        or "label" not in ref.frame
        or len(night.frame) < min_rows
        or len(ref.frame) < 2 * min_rows
    ):
        return None, None, "no labels, no reference or too few rows"
    from sklearn.model_selection import KFold, StratifiedKFold, cross_val_predict

    labels = ref.frame["label"].astype(str).to_numpy()
    counts = pd.Series(labels).value_counts()
    if len(counts) < 2:
        return None, None, "the reference has one label"
    folds = (
        StratifiedKFold(5, shuffle=True, random_state=0)
        if counts.min() >= 5
        else KFold(5, shuffle=True, random_state=0)
    )
    features = text_features()
    try:
        x = features.fit_transform(ref.frame["text"].astype(str))
        base, base_se = _kappa(labels, cross_val_predict(text_classifier(), x, labels, cv=folds))
    except ValueError as e:  # a fold with one class, an empty vocabulary
        return (
            None,
            None,
            f"the reference model could not be cross-validated ({str(e).splitlines()[0][:80]})",
        )
    if base < MIN_KAPPA:
        return (
            None,
            None,
            "the reference's labels are too hard to tell from text for this check (kappa "
            f"{base:.2f})",
        )
    model = text_classifier().fit(x, labels)
    predicted = model.predict(features.transform(night.frame["text"].astype(str)))
    tonight, se = _kappa(night.frame["label"].astype(str).to_numpy(), predicted)
    allowed = threshold + 2 * math.sqrt(base_se**2 + se**2)
    return (
        base - tonight,
        base - tonight <= allowed,
        (
            f"a text model trained on the reference agrees with tonight's "
            f"labels at kappa {tonight:.2f} (on the reference, "
            f"cross-validated: {base:.2f}); allowed drop {allowed:.2f}"
        ),
    )


def _labels(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    if (
        "label" not in night.frame
        or ref is None
        or "label" not in ref.frame
        or len(night.frame) < min_rows
        or ref.frame.empty
    ):
        return None, None, "no labels, no reference or too few rows"
    tonight = night.frame["label"].astype(str).value_counts(normalize=True)
    before = ref.frame["label"].astype(str).value_counts(normalize=True)
    # total variation: the share of rows to relabel
    distance = 0.5 * tonight.sub(before, fill_value=0).abs().sum()
    # plus what sampling alone moves on a small night
    allowed = threshold + 1 / math.sqrt(len(night.frame))
    shares = ", ".join(
        f"{k} {v:.0%} (was {before.get(k, 0):.0%})" for k, v in tonight.head(4).items()
    )
    return (
        float(distance),
        distance <= allowed,
        f"labels {shares}; allowed {allowed:.3f} at {len(night.frame)} rows",
    )


def _lengths(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    if ref is None or len(night.frame) < min_rows or ref.frame.empty:
        return None, None, "no reference or too few rows"
    a = np.sort(night.frame["text"].str.len().to_numpy())
    b = np.sort(ref.frame["text"].str.len().to_numpy())
    grid = np.union1d(a, b)
    ks = float(
        np.max(
            np.abs(
                np.searchsorted(a, grid, "right") / len(a)
                - np.searchsorted(b, grid, "right") / len(b)
            )
        )
    )
    return (
        ks,
        ks <= threshold,
        f"median length {np.median(a):.0f} characters (reference {np.median(b):.0f}); "
        f"Kolmogorov-Smirnov distance",
    )


def _raw(sample: Sample) -> pd.Series:
    frame = sample.frame
    return (frame["raw_text"] if "raw_text" in frame else frame["text"]).astype(str)


def _mojibake(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    if night.frame.empty:
        return None, None, "no rows"
    share = mojibake_share(_raw(night))
    example = next((t for t in _raw(night) if looks_mojibake(t)), "")
    return (
        share,
        share <= threshold,
        f"rows with UTF-8 read as Latin-1 (e.g. {example[:24]!r})"
        if example
        else "rows with UTF-8 read as Latin-1",
    )


def _cjk(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    if night.frame.empty or ref is None or ref.frame.empty:
        return None, None, "no rows or no reference (a first corpus may be in any script)"
    share = cjk_share(night.frame["text"])
    base = cjk_share(ref.frame["text"])
    return (
        base - share,
        base - share <= threshold,
        f"CJK {share:.0%} of letters (reference {base:.0%})",
    )


def _traditional(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    if len(night.frame) < min_rows:
        return None, None, "too few rows"
    share = traditional_share(night.frame["text"])
    base = traditional_share(ref.frame["text"]) if ref is not None and not ref.frame.empty else 0.0
    return (
        share - base,
        share - base <= threshold,
        (
            f"traditional characters in {share:.0%} of rows (reference "
            f"{base:.0%}); clean.traditional_to_simplified: "
            f"true converts them"
        ),
    )


def _oov(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    """Word OOV against the reference's vocabulary, less the OOV that as many reference rows of
    their own have (new text always brings some new words)."""
    if ref is None or len(night.frame) < min_rows or len(ref.frame) < 2 * min_rows:
        return None, None, "no reference or too few rows"
    held = min(len(night.frame), len(ref.frame) // 2)
    ref_words = words(ref.frame["text"])
    vocab_rest = {w for ws in ref_words[held:] for w in ws}
    base = oov_rate(ref_words[:held], vocab_rest)
    rate = oov_rate(words(night.frame["text"]), {w for ws in ref_words for w in ws})
    return (
        rate - base,
        rate - base <= threshold,
        f"word OOV {rate:.1%} against the reference vocabulary ({base:.1%} for reference rows)",
    )


def _near_duplicates(night: Sample, ref: Sample | None, threshold: float, min_rows: int):
    if len(night.frame) < min_rows:
        return None, None, "too few rows"
    keys = near_key(night.frame["text"])
    seen = set(near_key(ref.frame["text"])) if ref is not None else set()
    repeats = keys.isin(seen) | keys.duplicated()
    share = float(repeats.mean())
    return (
        share,
        share <= threshold,
        (
            "rows whose text, without punctuation and spaces, repeats a reference row or "
            "another row of tonight (they can land in different splits)"
        ),
    )


CHECKS: dict[str, Check] = {
    c.name: c
    for c in (
        Check(
            "rows",
            "rows kept against the median of the last 7 nights: at most `threshold` times more or "
            "fewer",
            "warn",
            20.0,
            _ratio_rows,
        ),
        Check(
            "quarantine",
            "share of the rows clean quarantined (empty, too short or long, duplicates, label "
            "conflicts): "
            "at most the threshold, and at most the recent nights' median + 0.15 (+ sampling "
            "noise); an "
            "empty partition fails",
            "block",
            0.5,
            _quarantine,
        ),
        Check(
            "labels",
            "total variation distance between tonight's label shares and the reference's "
            "(+1/sqrt(rows))",
            "block",
            0.15,
            _labels,
        ),
        Check(
            "agreement",
            "drop of Cohen's kappa between tonight's labels and a text model trained on the "
            "reference, "
            "against its cross-validated kappa on the reference (+ 2 standard errors): shuffled "
            "or wrong labels",
            "block",
            0.25,
            _agreement,
        ),
        Check(
            "short",
            "share of tonight's rows shorter than the reference's 5th-percentile length (about 5% "
            "on an "
            "ordinary night): text cut short",
            "block",
            0.3,
            _short,
        ),
        Check(
            "length",
            "Kolmogorov-Smirnov distance between tonight's and the reference's text lengths",
            "warn",
            0.3,
            _lengths,
        ),
        Check(
            "mojibake",
            "share of rows with UTF-8 text read as Latin-1 or cp1252 (è¿™ä¸ª...)",
            "block",
            0.02,
            _mojibake,
        ),
        Check(
            "script",
            "drop of the CJK share of letters against the reference (English or other scripts)",
            "block",
            0.3,
            _cjk,
        ),
        Check(
            "traditional",
            "rise of the share of rows in traditional characters against the reference",
            "warn",
            0.2,
            _traditional,
        ),
        Check(
            "oov",
            "rise of the word OOV rate (jieba) against the reference vocabulary, over the "
            "reference's own",
            "block",
            0.15,
            _oov,
        ),
        Check(
            "near_duplicates",
            "share of rows that repeat a reference row or each other up to punctuation and spaces",
            "warn",
            0.3,
            _near_duplicates,
        ),
    )
}


class Checks(Section):
    """The `checks:` section of a pipeline: each check's severity (block, warn, off) and threshold.
    Defaults on."""

    # fewer rows than this: distribution checks are not judged (noted as such)
    min_rows: int = Field(30, ge=1)
    # checks of the team's own, by name (docs/extending.md): judged after the built-in ones, on
    # every partition
    custom: dict[str, OwnCheck] = {}

    @field_validator("custom")
    @classmethod
    def _not_built_in(cls, value: dict[str, OwnCheck]) -> dict[str, OwnCheck]:
        taken = sorted(set(value) & set(CHECKS))
        if taken:
            raise ValueError(
                f"checks.custom.{taken[0]}: {taken[0]} is a built-in check's name; give yours "
                "another "
                f"(its setting is checks.{taken[0]})"
            )
        return value

    def user_code(self) -> list[CodeRef]:
        return [CodeRef.parse(c.function, f"checks.custom.{n}") for n, c in self.custom.items()]

    rows: CheckSetting = CheckSetting(
        severity=CHECKS["rows"].severity, threshold=CHECKS["rows"].threshold
    )
    quarantine: CheckSetting = CheckSetting(
        severity=CHECKS["quarantine"].severity, threshold=CHECKS["quarantine"].threshold
    )
    agreement: CheckSetting = CheckSetting(
        severity=CHECKS["agreement"].severity, threshold=CHECKS["agreement"].threshold
    )
    short: CheckSetting = CheckSetting(
        severity=CHECKS["short"].severity, threshold=CHECKS["short"].threshold
    )
    labels: CheckSetting = CheckSetting(
        severity=CHECKS["labels"].severity, threshold=CHECKS["labels"].threshold
    )
    length: CheckSetting = CheckSetting(
        severity=CHECKS["length"].severity, threshold=CHECKS["length"].threshold
    )
    mojibake: CheckSetting = CheckSetting(
        severity=CHECKS["mojibake"].severity, threshold=CHECKS["mojibake"].threshold
    )
    script: CheckSetting = CheckSetting(
        severity=CHECKS["script"].severity, threshold=CHECKS["script"].threshold
    )
    traditional: CheckSetting = CheckSetting(
        severity=CHECKS["traditional"].severity, threshold=CHECKS["traditional"].threshold
    )
    oov: CheckSetting = CheckSetting(
        severity=CHECKS["oov"].severity, threshold=CHECKS["oov"].threshold
    )
    near_duplicates: CheckSetting = CheckSetting(
        severity=CHECKS["near_duplicates"].severity, threshold=CHECKS["near_duplicates"].threshold
    )


def sample(frame: pd.DataFrame, rows: int = SAMPLE_ROWS, seed: int = 0) -> pd.DataFrame:
    return frame if len(frame) <= rows else frame.sample(rows, random_state=seed).sort_index()


def sample_positions(total: int, rows: int = SAMPLE_ROWS, seed: int = 0) -> np.ndarray:
    """The positions `sample` keeps of a `total`-row frame (its index 0..total-1), sorted: the same
    rows, so a sample read straight from a file (`tasks.util.io.read_rows`) is judged alike."""
    if total <= rows:
        return np.arange(total)
    return np.sort(np.random.RandomState(seed).choice(total, size=rows, replace=False))


def judge(
    night: Sample, reference: Sample | None, settings: Checks, root: Path | None = None
) -> list[Verdict]:
    """Every check that is not off, on tonight's rows against the reference (None: the first night),
    then the team's own (`settings.custom`, their modules found in the project folder `root`
    first)."""
    small_night = Sample(sample(night.frame), night.rows_in, night.rows_kept)
    small_ref = (
        Sample(
            sample(reference.frame),
            reference.rows_in,
            reference.rows_kept,
            reference.recent_rows,
            reference.recent_quarantine,
        )
        if reference
        else None
    )
    verdicts = []
    for name, check in CHECKS.items():
        setting: CheckSetting = getattr(settings, name)
        if setting.severity == "off":
            continue
        figure, passed, note = check.judge(
            small_night, small_ref, setting.threshold, settings.min_rows
        )
        verdicts.append(
            Verdict(
                name,
                setting.severity,
                None if figure is None else round(float(figure), 4),
                setting.threshold,
                None if passed is None else bool(passed),
                note,
            )
        )
    verdicts += [Verdict(*row) for row in judge_own(night.frame, settings.custom, root)]
    return verdicts


def to_json(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    return [asdict(v) for v in verdicts]


def from_json(rows: list[dict[str, Any]]) -> list[Verdict]:
    return [Verdict(**row) for row in rows]
