"""Two runs writing the same thing to one store at once: the write that loses the race is tried
again, not lost (eight overlapping runs on a team's PostgreSQL store met this one)."""

import threading

import pandas as pd
from sqlalchemy import event

from flows.track.tracker import Tracker, client


def test_a_dataset_logged_by_two_runs_at_once_is_recorded_for_both():
    """MLflow looks a dataset up and inserts it when missing. Another run inserts the same dataset
    between the lookup and the insert of this one (a listener on the store's own engine makes it
    happen there, every time); this run's insert then breaks the store's unique key, and is tried
    again."""
    df = pd.DataFrame({"id": [1, 2], "text": ["很好", "太差"], "label": ["1", "0"]})
    source = "/data/split/raced/validation.parquet"
    mine, other = (Tracker.start("zhpipe-races", name) for name in ("mine", "other"))
    engine = client()._tracking_client.store.engine
    raced = []

    def other_run_first(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("INSERT INTO DATASETS") and not raced:
            raced.append(statement)
            beside = threading.Thread(target=other.dataset, args=(df, source, "raced", "eval"))
            beside.start()
            beside.join(30)

    event.listen(engine, "before_cursor_execute", other_run_first)
    try:
        mine.dataset(df, source, "raced", "eval")
    finally:
        event.remove(engine, "before_cursor_execute", other_run_first)
    assert raced, "the race was not staged: MLflow inserted no dataset"
    for run in (mine, other):
        inputs = client().get_run(run.run_id).inputs.dataset_inputs
        assert [d.dataset.name for d in inputs] == ["raced"], run.run_id
    # one dataset, shared by both runs
    assert (
        len(
            {
                d.dataset.digest
                for r in (mine, other)
                for d in client().get_run(r.run_id).inputs.dataset_inputs
            }
        )
        == 1
    )
    mine.finish(), other.finish()
