"""Model code (no I/O): a config dataclass plus an `nn.Module` whose forward returns logits (and
loss)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


def token_embedding(config, embeddings: torch.Tensor | None) -> nn.Embedding:
    """The embedding layer: pretrained vectors when given (e.g. Word2Vec), frozen when the config
    says so."""
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
        self.convs = nn.ModuleList(
            nn.Conv1d(config.embed_dim, config.num_filters, k) for k in config.kernel_sizes
        )
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.num_filters * len(config.kernel_sizes), config.num_classes)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None):
        """ids: (batch, time) -> logits (batch, classes), plus the cross-entropy loss when labels
        are given."""
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
        self.lstm = nn.LSTM(
            config.embed_dim,
            config.hidden_size,
            num_layers=config.num_layers,
            batch_first=True,
            bidirectional=True,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
        )
        self.attention = nn.Sequential(
            nn.Linear(2 * config.hidden_size, config.hidden_size),
            nn.Tanh(),
            nn.Linear(config.hidden_size, 1, bias=False),
        )
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(2 * config.hidden_size, config.num_classes)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None):
        """ids: (batch, time) -> logits (batch, classes), plus the cross-entropy loss when labels
        are given."""
        mask = ids != self.config.pad_id
        lengths = mask.sum(1).clamp(min=1).cpu()
        # 1. packed sequences, so the backward direction starts at each row's last real token
        packed = nn.utils.rnn.pack_padded_sequence(
            self.embedding(ids), lengths, batch_first=True, enforce_sorted=False
        )
        states, _ = self.lstm(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(
            states, batch_first=True, total_length=ids.size(1)
        )
        # 2. attention weights over real tokens only
        scores = self.attention(states).squeeze(-1).masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=1).nan_to_num(0.0)
        pooled = (weights.unsqueeze(-1) * states).sum(1)
        logits = self.head(self.dropout(pooled))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return logits, loss


@dataclass
class TransformerConfig:
    vocab_size: int
    num_classes: int
    embed_dim: int = 128  # d_model
    num_heads: int = 4
    num_layers: int = 2
    ff_dim: int = 256
    dropout: float = 0.1
    max_len: int = 512  # positions (the [CLS] included)
    freeze_embeddings: bool = False
    pad_id: int = 0
    cls_id: int = 2


def sinusoidal_positions(length: int, dim: int) -> torch.Tensor:
    """Vaswani et al. (2017): sin on even, cos on odd dimensions, wavelengths from 2*pi to
    10000*2*pi."""
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table


class TransformerClassifier(nn.Module):
    """Transformer encoder over tokens with a [CLS] token prepended; the [CLS] state is
    classified."""

    def __init__(self, config: TransformerConfig, embeddings: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.embedding = token_embedding(config, embeddings)
        self.register_buffer(
            "positions", sinusoidal_positions(config.max_len, config.embed_dim), persistent=False
        )
        layer = nn.TransformerEncoderLayer(
            config.embed_dim,
            config.num_heads,
            config.ff_dim,
            config.dropout,
            # pre-norm trains stably without tuning
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, config.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.embed_dim)
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.embed_dim, config.num_classes)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None):
        """ids: (batch, time) without [CLS] -> logits (batch, classes), plus the loss when labels
        are given."""
        cls = torch.full((ids.size(0), 1), self.config.cls_id, dtype=ids.dtype, device=ids.device)
        ids = torch.cat([cls, ids[:, : self.config.max_len - 1]], dim=1)
        # 1. embeddings scaled by sqrt(d_model) so they are not drowned by the unit-scale positions
        x = self.embedding(ids) * math.sqrt(self.config.embed_dim) + self.positions[: ids.size(1)]
        # 2. self-attention never looks at padding
        states = self.encoder(self.dropout(x), src_key_padding_mask=ids == self.config.pad_id)
        logits = self.head(self.dropout(self.norm(states[:, 0])))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return logits, loss


@dataclass
class RNNLMConfig:
    vocab_size: int
    embed_dim: int = 128
    hidden_size: int = 256
    num_layers: int = 1
    dropout: float = 0.3
    # adaptive softmax clusters by frequency rank
    cutoffs: list[int] = field(default_factory=lambda: [2000, 10000])
    pad_id: int = 0


def _full_precision(x: torch.Tensor):
    """Autocast off: the adaptive softmax mixes its clusters' fp32 log-softmaxes into a tensor of
    its input's type, which CUDA autocast makes fp16 (the LSTM's output), and index_copy_ refuses
    the mix."""
    return torch.autocast(x.device.type, enabled=False)


class LSTMLanguageModel(nn.Module):
    """Next-token LSTM language model with an adaptive softmax (Grave et al., 2017): frequent words
    get the full output layer, rare ones share smaller clusters, so a 25k-word vocabulary trains
    several times faster."""

    def __init__(self, config: RNNLMConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(
            config.vocab_size, config.embed_dim, padding_idx=config.pad_id
        )
        self.lstm = nn.LSTM(
            config.embed_dim,
            config.hidden_size,
            num_layers=config.num_layers,
            batch_first=True,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(config.dropout)
        # a small vocabulary needs no clusters
        cutoffs = [c for c in config.cutoffs if c < config.vocab_size - 1]
        self.softmax = (
            nn.AdaptiveLogSoftmaxWithLoss(
                config.hidden_size, config.vocab_size, cutoffs, div_value=4.0
            )
            if cutoffs
            else None
        )
        self.head = None if cutoffs else nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None):
        """ids (batch, time) -> log-probabilities (batch, time, vocab); with targets: the
        log-probability of each real (non-padding) target, flattened, and the mean negative
        log-likelihood."""
        states = self.dropout(self.lstm(self.dropout(self.embedding(ids)))[0])
        if targets is None:
            flat = states.flatten(0, 1)
            if self.softmax is None:
                return F.log_softmax(self.head(flat), dim=-1).view(*ids.shape, -1), None
            with _full_precision(flat):
                return self.softmax.log_prob(flat.float()).view(*ids.shape, -1), None
        real = targets != self.config.pad_id
        if self.softmax is not None:
            # its head and clusters' log-softmaxes are copied into one output tensor
            with _full_precision(states):
                out = self.softmax(states[real].float(), targets[real])
            return out.output, out.loss
        logp = (
            F.log_softmax(self.head(states[real]), dim=-1)
            .gather(1, targets[real].unsqueeze(1))
            .squeeze(1)
        )
        return logp, -logp.mean()


class LexiconAdapter(nn.Module):
    """LEBERT-style lexicon adapter (Liu et al., 2021): each character attends over the vectors of
    the words that cover it (bilinear attention), and the weighted word vector is added to its
    hidden state."""

    def __init__(self, word_vectors: torch.Tensor, hidden_size: int, dropout: float = 0.1):
        super().__init__()
        self.words = nn.Embedding.from_pretrained(word_vectors, freeze=True, padding_idx=0)
        self.project = nn.Sequential(
            nn.Linear(word_vectors.size(1), hidden_size),
            nn.Tanh(),
            nn.Linear(hidden_size, hidden_size),
        )
        self.bilinear = nn.Linear(hidden_size, hidden_size, bias=False)
        self.norm = nn.LayerNorm(hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden: torch.Tensor, word_ids: torch.Tensor) -> torch.Tensor:
        """hidden (batch, time, hidden), word_ids (batch, time, words; 0 = none) -> hidden with
        words added."""
        words = self.project(self.words(word_ids))  # (batch, time, words, hidden)
        scores = torch.einsum("bth,btwh->btw", self.bilinear(hidden), words).masked_fill(
            word_ids == 0, float("-inf")
        )
        # a character no word covers gets nothing
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        return self.norm(hidden + self.dropout(torch.einsum("btw,btwh->bth", weights, words)))


class LexiconBert(nn.Module):
    """A transformers sequence classifier, optionally with a `LexiconAdapter` after encoder layer
    `adapter_layer` (a forward hook adds the covering words' vectors to that layer's output)."""

    def __init__(
        self, classifier: nn.Module, adapter: LexiconAdapter | None = None, adapter_layer: int = 1
    ):
        super().__init__()
        self.classifier = classifier
        self.adapter = adapter
        self._word_ids: torch.Tensor | None = None
        if adapter is not None:
            layers = classifier.base_model.encoder.layer
            # after the last layer the words could never reach [CLS], which is what gets classified
            if not 0 <= adapter_layer < len(layers) - 1:
                raise ValueError(
                    f"adapter_layer must be below the last encoder layer ({len(layers) - 1}; a "
                    "later "
                    f"layer has to carry the words to [CLS]), got {adapter_layer}"
                )
            layers[adapter_layer].register_forward_hook(self._inject)

    def _inject(self, module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = self.adapter(hidden, self._word_ids)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        word_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ):
        """input_ids (batch, time), word_ids (batch, time, words) -> logits, plus the loss when
        labels are given."""
        if self.adapter is not None and word_ids is None:
            raise ValueError("this model has a word adapter: word_ids are required")
        self._word_ids = word_ids
        try:
            out = self.classifier(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        finally:
            self._word_ids = None
        return out.logits, out.loss
