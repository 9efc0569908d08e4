"""The trainer's precision context on a CPU."""

import torch

from tasks.models.devices import autocast


def test_an_lstm_trains_under_bf16_autocast_on_any_cpu():
    """`precision: bf16` on a CPU: an LSTM's forward and backward passes run whether or not the
    CPU has native bf16 (without it oneDNN refuses a bf16 LSTM), and oneDNN's setting is as it was
    afterwards."""
    torch.manual_seed(0)
    lstm, head = torch.nn.LSTM(16, 32, batch_first=True), torch.nn.Linear(32, 5)
    x, y = torch.randn(4, 9, 16), torch.randint(0, 5, (4,))
    before = torch.backends.mkldnn.enabled
    with autocast(torch.device("cpu"), torch.bfloat16):
        out, _ = lstm(x)
        logits = head(out[:, -1])
    assert logits.dtype == torch.bfloat16  # the linear layer ran in bf16: autocast was on
    torch.nn.functional.cross_entropy(logits.float(), y).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in lstm.parameters())
    assert torch.backends.mkldnn.enabled == before
