"""Train a tiny TextCNN (the resume-after-kill test kills it mid-training in a child process).

usage: python -m tests.helpers.train_child CHECKPOINTS OUT EPOCHS
Writes OUT/probs.npy and OUT/summary.json when training finishes.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from tasks.classification.train import params as _train_params
from tests.tasks.models.test_train import frame, predict, tiny_vectors, train_model

TrainConfig = _train_params()


def train(checkpoints: Path, out: Path, epochs: int) -> None:
    """One thread, whatever the caller's: the same thread count in every run, so runs are
    bit-identical."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out.mkdir(parents=True)
        train, validation = frame(20), frame(2)
        params = TrainConfig(
            epochs=epochs, patience=epochs, textcnn={"num_filters": 8, "batch_size": 8, "lr": 0.001}
        )
        summary, _ = train_model(
            "textcnn", train, validation, params, out, tiny_vectors(), scratch=checkpoints
        )
        np.save(out / "probs.npy", predict("textcnn", out, validation))
        (out / "summary.json").write_text(
            json.dumps({k: v for k, v in summary.items() if k != "history"})
        )
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    train(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
