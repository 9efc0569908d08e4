"""Encoded splits (tasks.classification.models.encoded): ids on disk, read back exactly, every row
once per epoch whatever the buffer, batched as a split held whole when it fits one buffer, and a
network trained through many buffers.
"""

import numpy as np
import pandas as pd
import pytest

from tasks.classification.models import encoded
from tasks.classification.models.encoded import Encoded, encode_split
from tasks.models.batching import length_buckets
from tasks.util.io import Rows, write_parquet


def corpus(n=30):
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(2, 50, size=rng.integers(1, 9))) for _ in range(n)]
    return pd.DataFrame(
        {
            "ids": [" ".join(map(str, s)) for s in seqs],
            "label": ["a", "b", "c"] * (n // 3),
            "aug_method": ["original", "eda"] * (n // 2),
        }
    ), seqs


def as_ids(batch):
    return [[int(t) for t in line.split()] for line in batch["ids"]]


@pytest.mark.parametrize("source", ["frame", "file"])
def test_rows_and_labels_come_back_as_written(tmp_path, source):
    df, seqs = corpus()
    data = df
    if source == "file":
        write_parquet(df, tmp_path / "train.parquet", row_group_rows=7)
        data = Rows(tmp_path / "train.parquet")
    enc = encode_split(data, tmp_path / "enc", as_ids, ["a", "b", "c"], columns=["ids"])
    assert len(enc) == 30 and [r.tolist() for r in enc.rows(0, 30)] == seqs
    assert [r.tolist() for r in enc.rows(11, 14)] == seqs[11:14]
    assert enc.labels.tolist() == [0, 1, 2] * 10
    kept = encode_split(
        data,
        tmp_path / "kept",
        as_ids,
        ["a", "b", "c"],
        keep=lambda b: b["aug_method"] == "original",
        columns=["ids"],
    )
    assert [r.tolist() for r in kept.rows(0, len(kept))] == seqs[::2] and kept.labels.tolist() == [
        0,
        2,
        1,
    ] * 5


def test_an_epoch_over_many_buffers_sees_every_row_once(tmp_path):
    df, seqs = corpus(30)
    enc = Encoded(
        encode_split(df, tmp_path / "enc", as_ids, ["a", "b", "c"]).folder,
        buffer_rows=8,
        block_rows=4,
    )
    rng = np.random.default_rng(3)
    orders = []
    for _ in range(2):
        seen, batches = [], 0
        for buffer_seqs, labels, rows in enc.buffers(rng):
            assert len(buffer_seqs) <= 8 and [s.tolist() for s in buffer_seqs] == [
                seqs[r] for r in rows
            ]
            assert labels.tolist() == [[0, 1, 2][r % 3] for r in rows]
            seen += rows.tolist()
        orders.append(seen)
        assert sorted(seen) == list(range(30))
        batches = sum(1 for _ in enc.epoch(3, rng))
        assert batches == enc.steps(3) == 3 * 3 + 2  # buffers of 8, 8, 8 and 6 rows in batches of 3
    assert orders[0] != orders[1]  # blocks are drawn anew each epoch
    assert orders[0][-2:] == [28, 29]  # the partial block closes the epoch


def test_a_split_that_fits_one_buffer_is_batched_as_if_held_whole(tmp_path):
    df, seqs = corpus(30)
    enc = encode_split(df, tmp_path / "enc", as_ids, ["a", "b", "c"])
    ours, whole = np.random.default_rng(5), np.random.default_rng(5)
    got = [(chunk.tolist(), y.tolist()) for _, chunk, y in enc.epoch(4, ours)]
    want = [
        (chunk.tolist(), [[0, 1, 2][i % 3] for i in chunk])
        for chunk in length_buckets(seqs, 4, whole)
    ]
    assert got == want and ours.bit_generator.state == whole.bit_generator.state


def test_a_network_trains_through_many_buffers(tmp_path, monkeypatch):
    from tasks.classification.train import params as _train_params

    TrainConfig = _train_params()
    from tests.tasks.models.test_train import frame, predict, tiny_vectors, train_model

    monkeypatch.setattr(encoded, "BUFFER_ROWS", 32)
    monkeypatch.setattr(encoded, "BLOCK_ROWS", 16)
    train, validation = frame(20), frame(2)  # 120 rows: four buffers, the last one partial
    params = TrainConfig(
        epochs=6, patience=6, textcnn={"num_filters": 8, "batch_size": 16, "lr": 0.01}
    )
    summary, _ = train_model("textcnn", train, validation, params, tmp_path, tiny_vectors())
    assert summary["history"][-1]["train_loss"] < summary["history"][0]["train_loss"]
    assert summary["history"][summary["best_epoch"] - 1]["val_macro_f1"] == 1.0
    probs = predict("textcnn", tmp_path, validation)
    assert (probs.argmax(1) == validation["label"].astype(int).to_numpy()).all()
