"""The training budget: shares, the racing rule, and a real network stopped by it (its model still
saved and served)."""

import logging
import time

import pytest

from tasks.classification.train import params as _train_params
from tasks.models.racing import Budget, BudgetCut, Race, from_history, from_samples, racing, seconds
from tests.tasks.models.test_train import frame, predict, tiny_vectors, train_model

TrainConfig = _train_params()


def test_a_budget_reads_seconds_minutes_and_hours():
    assert (seconds(90), seconds("90s"), seconds("3min"), seconds("1.5h"), seconds(None)) == (
        90,
        90,
        180,
        5400,
        None,
    )
    for bad in ("soon", "-3s", "0", 0):
        with pytest.raises(ValueError, match="budget"):
            seconds(bad)
    assert TrainConfig(budget="2min").budget == 120


def test_each_racing_model_gets_an_even_share_of_what_is_left_capped_per_model():
    clock = Budget(100.0, None, ["textcnn", "bilstm"])
    first = clock.race("textcnn")
    assert first.share == pytest.approx(50, abs=0.5) and first.leader is None
    clock.finished("textcnn", {"val_accuracy": 0.8})
    second = clock.race("bilstm")  # the last: all that is left
    assert second.share == pytest.approx(100, abs=0.5) and second.leader == "textcnn"
    capped = Budget(100.0, 10.0, ["textcnn"]).race("textcnn")
    assert capped.share == 10.0
    assert Budget(None, None, ["textcnn"]).race("textcnn") is None  # no budget: no race


def test_the_leader_is_the_best_on_the_selection_metric():
    clock = Budget(100.0, None, ["textcnn"])
    clock.finished("fasttext", {"val_accuracy": 0.90, "val_macro_f1": 0.88})
    clock.finished("tfidf_lr", {"val_accuracy": 0.92, "val_macro_f1": 0.85})
    clock.finished("ngram_lm", {"val_perplexity": 40.0})  # no accuracy: never the leader
    race = clock.race("textcnn")
    assert race.leader == "tfidf_lr" and race.target("val_macro_f1", "max") == 0.85


def test_a_curve_that_cannot_reach_the_leader_in_the_epochs_left_is_hopeless():
    race = Race(60.0, "tfidf_lr", {"val_macro_f1": 0.90})
    assert race.hopeless([0.80], 5, "val_macro_f1", "max") == ""  # one point: no gain to judge by
    # 0.82 + 5 * 0.02 reaches 0.90
    assert race.hopeless([0.80, 0.82], 5, "val_macro_f1", "max") == ""
    why = race.hopeless([0.80, 0.82], 3, "val_macro_f1", "max")
    assert "cannot reach the leader tfidf_lr" in why and "0.9000" in why
    assert race.hopeless([0.80, 0.79], 9, "val_macro_f1", "max")  # no gain at all
    assert race.hopeless([0.80, 0.95], 1, "val_macro_f1", "max") == ""  # already ahead
    # a loss: lower is better, signed by the loop
    lower = Race(60.0, "ngram", {"val_perplexity": 50.0})
    assert lower.hopeless([-80.0, -70.0], 1, "val_perplexity", "min")
    assert lower.hopeless([-80.0, -70.0], 3, "val_perplexity", "min") == ""


def test_a_network_out_of_its_share_stops_inside_an_epoch_and_is_still_a_model(tmp_path, caplog):
    """The first model of a stage always trains (so that there is a model): cut inside its first
    epoch, it is kept."""
    params = TrainConfig(
        epochs=50,
        patience=50,
        device="cpu",
        precision="fp32",
        textcnn={"num_filters": 8, "batch_size": 4, "lr": 0.01},
    )
    race = Race(6.0, first=True)
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="zhpipe.train"), racing(race):
        summary, _ = train_model("textcnn", frame(1000), frame(4), params, tmp_path, tiny_vectors())
    assert time.monotonic() - t0 < 60  # 50 epochs of 1,500 batches unbudgeted
    assert (
        race.cut.startswith("stopped in epoch 1 after ")
        and "its share of the budget (6 s) ran out" in race.cut
    )
    assert len(summary["history"]) == 1
    # saved whole: it loads and answers
    assert predict("textcnn", tmp_path, frame(1)).shape == (6, 2)


def test_a_racing_models_estimate_says_its_share(caplog):
    """Said from the first batches; apart from the race above, where a busy machine can spend the
    whole share on the set-up before the estimate's batches (two busy-loop hogs did)."""
    from tasks.models.racing import say_estimate

    with caplog.at_level(logging.INFO, logger="zhpipe.train"):
        short = say_estimate("textcnn", 2.5, 25, 250, 1, None, {"epochs": 50, "race": Race(6.0)})
    assert "textcnn: about 21 min more to train (50 epochs of 250 batches" in caplog.text
    assert "its share of the budget is 6 s" in caplog.text and short == "about 21 min more to train"


def test_a_network_behind_the_leader_is_stopped_when_its_curve_cannot_catch_up(tmp_path):
    params = TrainConfig(
        epochs=30,
        patience=30,
        device="cpu",
        precision="fp32",
        # a rate too small to learn
        textcnn={"num_filters": 8, "batch_size": 8, "lr": 1e-6},
    )
    race = Race(600.0, "tfidf_lr", {"val_macro_f1": 1.01})  # a leader nobody reaches
    with racing(race):
        summary, _ = train_model("textcnn", frame(4), frame(2), params, tmp_path, tiny_vectors())
    assert race.cut.startswith("stopped after epoch 2: cannot reach the leader tfidf_lr"), race.cut
    assert len(summary["history"]) == 2


def test_fewer_epochs_are_planned_when_they_do_not_fit_and_the_rate_decays_over_them(tmp_path):
    from tasks.models import trainer

    plan = {}
    optimizer = __import__("torch").optim.SGD(
        [__import__("torch").zeros(1, requires_grad=True)], lr=1.0
    )
    scheduler = trainer.warmup_linear_decay(optimizer, 10, 0.0, 10, plan)
    assert plan["total"] == 100
    trainer.replan(plan, 2, 0.0, 10)  # two epochs of ten steps: the rate is 0 at step 20
    for _ in range(20):
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr()[0] == 0.0


def test_a_network_whose_first_epoch_cannot_fit_its_share_is_given_back_early(tmp_path):
    """Not the first model: estimated within a tenth of its share, its first epoch does not fit, so
    it is not trained (no chance-level model) and most of its share is left to the models after
    it."""
    params = TrainConfig(
        epochs=50,
        patience=50,
        device="cpu",
        precision="fp32",
        textcnn={"num_filters": 8, "batch_size": 4, "lr": 0.01},
    )
    race = Race(6.0)
    t0 = time.monotonic()
    with racing(race), pytest.raises(BudgetCut, match="not trained: the budget left it no time"):
        train_model("textcnn", frame(1000), frame(4), params, tmp_path, tiny_vectors())
    assert time.monotonic() - t0 < 6


def test_a_model_starts_only_when_its_estimate_fits_what_is_left():
    clock = Budget(100.0, None, ["textcnn"])
    first = clock.race("tfidf_lr", races=False, estimate=500.0)
    assert first.first and first.share == pytest.approx(100, abs=0.5)
    first.admit()  # the first always trains, whatever its estimate
    clock.finished("tfidf_lr", {"val_accuracy": 0.8})
    later = clock.race("fasttext", races=False, estimate=500.0)
    # not racing: all that is left
    assert not later.first and later.share == pytest.approx(100, abs=0.5)
    with pytest.raises(BudgetCut, match=r"it would take about 500 s; 100 s of its share were left"):
        later.admit()
    clock.skipped("fasttext", "not trained: the budget left it no time")
    clock.race("fasttext", races=False, estimate=50.0).admit()  # fits
    assert clock.said() == "fasttext not trained: the budget left it no time"
    with pytest.raises(BudgetCut, match="s of the budget left"):
        Race(0.5).admit()  # nearly nothing left: never a 0-second start


def test_a_models_cost_is_estimated_from_its_history_or_two_samples():
    # the newest, per row
    assert from_history([(30.0, 10_000), (99.0, 5_000)], 60_000) == pytest.approx(180.0)
    assert from_history([(30.0, None)], 60_000) is None
    # 1 s fixed and 1 ms a row: the line through two timed samples
    assert from_samples([(1000, 2.0), (3000, 4.0)], 50_000) == pytest.approx(51.0)
    # noise: never a negative slope
    assert from_samples([(1000, 2.0), (3000, 1.5)], 50_000) == pytest.approx(25.0)


def test_the_first_model_whose_split_does_not_fit_the_budget_trains_on_the_rows_that_do(tmp_path):
    """It always trains (so that there is a model), on the share of rows its estimate says fits, and
    says so."""
    from tasks.classification.train import TrainInputs, within_budget

    inputs = TrainInputs(
        "tfidf_lr", frame(5000), frame(10), ["0", "1"], None, tmp_path, None, tmp_path, tmp_path
    )
    fitted, why = within_budget(inputs, 200.0, 90.0, " (timed on samples)", 7)
    assert len(fitted.train) == int(len(inputs.train) * 0.85 * 90 / 200)
    assert why.startswith(
        f"trained on {len(fitted.train):,} of {len(inputs.train):,} rows: all of them would take "
        "about 200 s (timed on samples), over the budget (90 s)"
    )
