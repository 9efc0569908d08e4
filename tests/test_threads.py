"""The suite's own set-up: pytest-xdist workers split the cores between them (tests/conftest.py)."""

import os

import pytest


def test_each_worker_runs_pytorch_on_its_share_of_the_cores():
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        pytest.skip("one process: PyTorch keeps its default of one thread per core")
    import torch

    assert torch.get_num_threads() == max(1, (os.cpu_count() or 1) // workers)
