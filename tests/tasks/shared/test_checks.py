"""The declared data checks on real reviews (the smoke corpus): an ordinary night passes every
check, and each kind of bad night fails the check made for it (one class, mojibake, English,
traditional script, a re-sent night, an empty file)."""

from pathlib import Path

import pandas as pd
import pytest

from tasks.shared.checks import CHECKS, Checks, Sample, judge
from tasks.shared.measures import cjk_share, looks_mojibake
from tasks.shared.normalise import Normalise, clean_text

ROOT = Path(__file__).resolve().parents[3]


def cleaned(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(text=[clean_text(t, Normalise()) for t in frame["text"]])


@pytest.fixture(scope="module")
def reviews():
    rows = (
        pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str)
        .rename(columns={"review": "text"})
        .dropna()
    )
    rows = rows.sample(frac=1, random_state=3).reset_index(drop=True)
    return cleaned(rows.iloc[:200]), rows.iloc[200:]


def verdicts(
    night: pd.DataFrame, reference: pd.DataFrame, rows_in: int | None = None, **settings
) -> dict:
    frame = cleaned(night)
    found = judge(
        Sample(frame, len(night) if rows_in is None else rows_in, len(frame)),
        Sample(reference, len(reference), len(reference), (len(reference),)),
        Checks(**settings),
    )
    return {v.check: v for v in found}


def failed(result: dict) -> set[str]:
    return {name for name, v in result.items() if v.passed is False}


def test_an_ordinary_night_passes_every_check(reviews):
    reference, rest = reviews
    result = verdicts(rest.head(60), reference)
    assert failed(result) == set()
    assert {name for name, v in result.items() if v.passed} >= {
        "quarantine",
        "labels",
        "mojibake",
        "script",
        "oov",
    }


def test_a_night_of_one_class_fails_the_label_check(reviews):
    reference, rest = reviews
    night = rest.head(90).assign(label=reference["label"].value_counts().index[0])
    result = verdicts(night, reference)
    assert {"labels"} <= failed(result) <= {"labels", "agreement"} and result["labels"].blocks


def test_mojibake_fails_the_mojibake_and_script_checks(reviews):
    reference, rest = reviews
    night = rest.head(60).assign(
        text=[t.encode("utf-8").decode("latin-1") for t in rest.head(60)["text"]]
    )
    result = verdicts(night, reference)
    assert {"mojibake", "script"} <= failed(result) and result["mojibake"].blocks
    assert looks_mojibake(
        clean_text("这个酒店很好".encode().decode("cp1252", errors="replace"), Normalise())
    )
    # French is not mojibake
    assert not looks_mojibake("Très bon hôtel, près de la gare, café à côté")


def test_english_fails_the_script_check(reviews):
    reference, _ = reviews
    night = pd.DataFrame(
        {
            "text": [f"The room was clean and the staff were friendly {i}" for i in range(40)],
            "label": reference["label"].iloc[:40].to_numpy(),
        }
    )
    result = verdicts(night, reference)
    assert "script" in failed(result) and result["script"].figure > 0.9
    assert cjk_share(pd.Series(["酒店 good"])) == pytest.approx(2 / 6)


def test_traditional_script_warns_and_its_words_are_out_of_vocabulary(reviews):
    import opencc

    reference, rest = reviews
    to_traditional = opencc.OpenCC("s2t").convert
    night = rest.head(60).assign(text=[to_traditional(t) for t in rest.head(60)["text"]])
    result = verdicts(night, reference)
    # a warning by default
    assert result["traditional"].passed is False and not result["traditional"].blocks
    assert result["oov"].figure > result["oov"].threshold


def test_a_resent_or_empty_night_fails_the_quarantine_check(reviews):
    reference, rest = reviews
    resent = verdicts(rest.head(60), reference, rows_in=60)  # all 60 rows in, as many kept: passes
    assert resent["quarantine"].passed
    frame = cleaned(rest.head(0))
    empty = {
        v.check: v
        for v in judge(Sample(frame, 0, 0), Sample(reference, 200, 200, (200,)), Checks())
    }
    assert empty["quarantine"].passed is False and empty["quarantine"].blocks
    all_dropped = {
        v.check: v
        for v in judge(Sample(frame, 60, 0), Sample(reference, 200, 200, (200,)), Checks())
    }
    assert all_dropped["quarantine"].figure == 1.0 and all_dropped["rows"].passed is False


def test_a_check_turned_off_is_not_judged_and_a_small_night_is_not_judged_on_distributions(reviews):
    reference, rest = reviews
    result = verdicts(
        rest.head(60).assign(label="1"), reference, labels={"severity": "off", "threshold": 0.15}
    )
    assert "labels" not in result
    small = verdicts(rest.head(10).assign(label="1"), reference)
    assert small["labels"].passed is None and "too few rows" in small["labels"].note
    # every declared check has a setting
    assert set(CHECKS) == set(Checks.model_fields) - {"min_rows", "custom"}


@pytest.fixture(scope="module")
def hotel():
    """The bundled reviews: a reference of 3,000 rows and ordinary nights of 400 after it."""
    rows = (
        pd.read_csv(ROOT / "data/raw/ChnSentiCorp_htl_all.csv", dtype=str)
        .rename(columns={"review": "text"})
        .dropna()
    )
    rows = cleaned(rows.sample(frac=1, random_state=11).reset_index(drop=True).iloc[:5400])
    reference = Sample(rows.iloc[:3000], 3000, 3000, (3000, 400, 400), (0.02, 0.03, 0.02))
    return reference, [rows.iloc[i : i + 400] for i in range(3000, 5400, 400)]


def judged(night: pd.DataFrame, reference: Sample, rows_in: int | None = None) -> dict:
    return {
        v.check: v
        for v in judge(Sample(night, rows_in or len(night), len(night)), reference, Checks())
    }


def test_ordinary_nights_of_the_bundled_corpus_pass_agreement_short_and_quarantine(hotel):
    reference, nights = hotel
    for night in nights:
        result = judged(night, reference, rows_in=int(len(night) / 0.97))
        assert failed(result) == set(), {
            k: v.line("night") for k, v in result.items() if v.passed is False
        }
        assert result["agreement"].passed and result["short"].passed and result["quarantine"].passed


def test_shuffled_labels_keep_their_shares_and_fail_the_agreement_check(hotel):
    import numpy as np

    reference, nights = hotel
    night = nights[0].assign(
        label=np.random.default_rng(0).permutation(nights[0]["label"].to_numpy())
    )
    result = judged(night, reference)
    assert failed(result) == {"agreement"} and result["agreement"].blocks, result["agreement"].line(
        "night"
    )
    assert result["labels"].passed  # the shares did not move


def test_five_percent_of_labels_flipped_is_ordinary_noise(hotel):
    reference, nights = hotel
    night = nights[1].assign(
        label=[
            ("1" if v == "0" else "0") if i % 20 == 0 else v
            for i, v in enumerate(nights[1]["label"])
        ]
    )
    assert judged(night, reference)["agreement"].passed


def test_text_cut_to_three_characters_fails_the_short_check_and_recent_nights_hold(hotel):
    reference, nights = hotel
    cut = nights[2].assign(text=nights[2]["text"].str[:3])
    result = judged(cut, reference)
    assert (
        result["short"].passed is False and result["short"].blocks and result["short"].figure > 0.9
    )
    # 35% set aside: under 0.5, far above ~2%
    collapsed = judged(cut.drop_duplicates("text"), reference, rows_in=len(cut))
    assert (
        collapsed["quarantine"].passed is False
        and "recent nights' median" in collapsed["quarantine"].note
    )


def test_a_sample_read_from_the_file_is_the_rows_the_checks_would_draw(tmp_path, hotel):
    """The run reads the checked sample straight from the stage's file (row group by row group);
    it must be the very rows `sample` draws from the whole frame, so verdicts do not move."""
    from tasks.shared.checks import REFERENCE_ROWS, sample, sample_positions
    from tasks.util.io import read_rows, write_parquet

    path = tmp_path / "data.parquet"
    write_parquet(hotel[0].frame.reset_index(drop=True), path)
    whole = pd.read_parquet(path)
    assert len(whole) > 2000
    for rows in (1500, 2000, len(whole) - 1, REFERENCE_ROWS):
        read = read_rows(path, sample_positions(len(whole), rows))
        pd.testing.assert_frame_equal(read, sample(whole, rows), check_index_type=False)
    assert read_rows(path, sample_positions(0)).empty
