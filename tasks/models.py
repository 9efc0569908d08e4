"""Model code (no I/O): a config dataclass plus an `nn.Module` whose forward returns logits (and loss)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class TextCNNConfig:
    vocab_size: int
    num_classes: int
    embed_dim: int = 128
    kernel_sizes: list[int] = field(default_factory=lambda: [2, 3, 4])
    num_filters: int = 128
    dropout: float = 0.5
    freeze_embeddings: bool = False  # True keeps the Word2Vec vectors as they are
    pad_id: int = 0


class TextCNN(nn.Module):
    """Kim (2014): parallel 1-D convolutions over token embeddings, max-pooled over time."""

    def __init__(self, config: TextCNNConfig, embeddings: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_id)
        if embeddings is not None:
            self.embedding.weight.data.copy_(embeddings)
        self.embedding.weight.requires_grad = not config.freeze_embeddings
        self.convs = nn.ModuleList(nn.Conv1d(config.embed_dim, config.num_filters, k) for k in config.kernel_sizes)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.num_filters * len(config.kernel_sizes), config.num_classes)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None):
        """ids: (batch, time) -> logits (batch, classes), plus the cross-entropy loss when labels are given."""
        x = self.embedding(ids).transpose(1, 2)  # (batch, embed, time)
        min_len = max(self.config.kernel_sizes)
        if x.size(2) < min_len:  # a convolution needs at least kernel-size steps
            x = F.pad(x, (0, min_len - x.size(2)))
        pooled = [F.relu(conv(x)).amax(dim=2) for conv in self.convs]
        logits = self.head(self.dropout(torch.cat(pooled, dim=1)))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return logits, loss
