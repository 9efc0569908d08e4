"""Long work shows progress: a bar on a terminal, and in a log (a cron job's, a worker's) a line
every `LOG_EVERY` seconds; the CRF's L-BFGS iterations move it as a network's batches do."""

import logging

from tasks.util import progress


def test_a_log_gets_a_line_every_interval_with_the_count_and_share(monkeypatch, caplog):
    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    # stderr is not a terminal here
    bar = progress.progress(total=4, desc="crf L-BFGS", unit="iteration")
    assert isinstance(bar, progress.LogLines)
    with caplog.at_level(logging.INFO, logger="zhpipe.progress"):
        bar.set_postfix_str("loss 12.5")
        bar.update(1)
        bar.update(1)
    assert [r.getMessage().split(" after ")[0] for r in caplog.records] == [
        "crf L-BFGS: 1/4 iteration (25%)",
        "crf L-BFGS: 2/4 iteration (50%)",
    ]
    assert caplog.records[-1].getMessage().endswith(", loss 12.5")


def test_short_work_writes_no_line(caplog):
    with (
        caplog.at_level(logging.INFO, logger="zhpipe.progress"),
        progress.progress(total=3, desc="quick") as bar,
    ):
        for _ in range(3):
            bar.update(1)
    assert caplog.records == []  # under LOG_EVERY (30 s): nothing to report


def test_the_crf_iterations_move_the_bar(monkeypatch, caplog, tmp_path):
    from tasks.ner.crf_tagger import _trainer

    monkeypatch.setattr(progress, "LOG_EVERY", 0.0)
    bar = progress.progress(total=5, desc="crf L-BFGS", unit="iteration")
    trainer = _trainer(bar)
    for i in range(30):
        trainer.append([{"c0": str(i % 3)}, {"c0": "x"}], ["B-ORG" if i % 3 else "O", "O"])
    trainer.set_params({"max_iterations": 5})
    with caplog.at_level(logging.INFO, logger="zhpipe.progress"):
        trainer.train(str(tmp_path / "crf.model"))
    lines = [r.getMessage() for r in caplog.records]
    assert (
        len(lines) >= 3 and lines[0].startswith("crf L-BFGS: 1/5 iteration") and "loss" in lines[-1]
    )
