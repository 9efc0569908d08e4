"""Model code (no I/O): a config dataclass plus an `nn.Module` whose forward returns logits (and loss)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


def token_embedding(config, embeddings: torch.Tensor | None) -> nn.Embedding:
    """The embedding layer: pretrained vectors when given (e.g. Word2Vec), frozen when the config says so."""
    layer = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_id)
    if embeddings is not None:
        layer.weight.data.copy_(embeddings)
    layer.weight.requires_grad = not config.freeze_embeddings
    return layer


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
        self.embedding = token_embedding(config, embeddings)
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


@dataclass
class BiLSTMConfig:
    vocab_size: int
    num_classes: int
    embed_dim: int = 128
    hidden_size: int = 128  # per direction
    num_layers: int = 1
    dropout: float = 0.3
    freeze_embeddings: bool = False
    pad_id: int = 0


class BiLSTMAttention(nn.Module):
    """Bidirectional LSTM whose states are pooled by additive attention (padding masked out)."""

    def __init__(self, config: BiLSTMConfig, embeddings: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.embedding = token_embedding(config, embeddings)
        self.lstm = nn.LSTM(config.embed_dim, config.hidden_size, num_layers=config.num_layers, batch_first=True,
                            bidirectional=True, dropout=config.dropout if config.num_layers > 1 else 0.0)
        self.attention = nn.Sequential(nn.Linear(2 * config.hidden_size, config.hidden_size), nn.Tanh(),
                                       nn.Linear(config.hidden_size, 1, bias=False))
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(2 * config.hidden_size, config.num_classes)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None):
        """ids: (batch, time) -> logits (batch, classes), plus the cross-entropy loss when labels are given."""
        mask = ids != self.config.pad_id
        lengths = mask.sum(1).clamp(min=1).cpu()
        # 1. packed sequences, so the backward direction starts at each row's last real token
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(ids), lengths, batch_first=True, enforce_sorted=False)
        states, _ = self.lstm(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=ids.size(1))
        # 2. attention weights over real tokens only
        scores = self.attention(states).squeeze(-1).masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=1).nan_to_num(0.0)
        pooled = (weights.unsqueeze(-1) * states).sum(1)
        logits = self.head(self.dropout(pooled))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return logits, loss
