"""Sequence-to-sequence networks (no I/O): a GRU encoder-decoder without attention (Cho et al.,
2014), the same with Bahdanau attention (Bahdanau et al., 2015), and a Transformer encoder-decoder
(Vaswani et al., 2017); and the decoding both share, greedy and beam search.

Every network has the same decoding interface, so one search serves all three:
- `encode(src) -> Memory`: what the decoder reads (encoder states, the source padding mask, ...);
- `step(memory, prefix, cache) -> (log-probabilities of the next token, cache, attention over the
  source)`;
- `forward(src, tgt_in) -> logits` for teacher-forced training (every target position at once where
  it can). Id 0 is padding on both sides; `prefix` starts with the target's BOS id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tasks.models.modules import sinusoidal_positions

PAD = 0


@dataclass
class Seq2SeqConfig:
    src_vocab: int
    tgt_vocab: int
    embed_dim: int = 256
    # the decoder's; the bidirectional encoder has hidden_size // 2 per direction
    hidden_size: int = 256
    num_layers: int = 1
    dropout: float = 0.2
    attention: bool = True  # Bahdanau attention; False = the encoder's summary vector only


@dataclass
class Memory:
    states: torch.Tensor  # (batch, source, hidden) encoder outputs
    mask: torch.Tensor  # (batch, source) True at real tokens
    # (batch, hidden) the encoder's final states, projected: the context without attention
    summary: torch.Tensor

    def repeat(self, k: int) -> Memory:
        return Memory(
            self.states.repeat_interleave(k, 0),
            self.mask.repeat_interleave(k, 0),
            self.summary.repeat_interleave(k, 0),
        )


class BahdanauAttention(nn.Module):
    """Additive attention: score(s, h_j) = v^T tanh(W_s s + W_h h_j); padding positions get no
    weight."""

    def __init__(self, hidden: int):
        super().__init__()
        self.query = nn.Linear(hidden, hidden, bias=False)
        self.key = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, 1, bias=False)

    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, states: torch.Tensor, mask: torch.Tensor
    ):
        """query (batch, hidden); keys = self.key(states), precomputed once per sentence ->
        (context, weights)."""
        # (batch, source)
        scores = self.v(torch.tanh(self.query(query).unsqueeze(1) + keys)).squeeze(2)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=1)
        return torch.bmm(weights.unsqueeze(1), states).squeeze(1), weights


class GRUSeq2Seq(nn.Module):
    """Bidirectional GRU encoder; a GRU decoder fed with the previous token and a context vector:
    the encoder's summary (no attention) or an attention-weighted sum of its states recomputed at
    every step."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = config
        h, e = config.hidden_size, config.embed_dim
        if h % 2:
            raise ValueError(
                "hidden_size must be even (two encoder directions of hidden_size // 2)"
            )
        self.src_embedding = nn.Embedding(config.src_vocab, e, padding_idx=PAD)
        self.tgt_embedding = nn.Embedding(config.tgt_vocab, e, padding_idx=PAD)
        drop = config.dropout if config.num_layers > 1 else 0.0
        self.encoder = nn.GRU(
            e, h // 2, config.num_layers, batch_first=True, bidirectional=True, dropout=drop
        )
        # the encoder's last states (both directions) -> the decoder's first state
        self.bridge = nn.Linear(h, h)
        self.decoder = nn.GRU(e + h, h, config.num_layers, batch_first=True, dropout=drop)
        self.attention = BahdanauAttention(h) if config.attention else None
        self.dropout = nn.Dropout(config.dropout)
        # [decoder state; context; previous token]
        self.out = nn.Linear(h + h + e, config.tgt_vocab)

    def encode(self, src: torch.Tensor) -> Memory:
        mask = src != PAD
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            self.dropout(self.src_embedding(src)), lengths, batch_first=True, enforce_sorted=False
        )
        outputs, last = self.encoder(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(
            outputs, batch_first=True, total_length=src.size(1)
        )
        # top layer, both directions
        summary = torch.tanh(self.bridge(torch.cat([last[-2], last[-1]], dim=1)))
        return Memory(states, mask, summary)

    def _start(self, memory: Memory) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = memory.summary.unsqueeze(0).repeat(self.config.num_layers, 1, 1).contiguous()
        keys = self.attention.key(memory.states) if self.attention is not None else None
        return hidden, keys

    def _step(
        self, memory: Memory, token: torch.Tensor, hidden: torch.Tensor, keys: torch.Tensor | None
    ):
        """One decoder step from the previous token -> (logits, new hidden, attention weights or
        None)."""
        emb = self.dropout(self.tgt_embedding(token))  # (batch, embed)
        if self.attention is not None:
            context, weights = self.attention(hidden[-1], keys, memory.states, memory.mask)
        else:
            context, weights = memory.summary, None
        output, hidden = self.decoder(torch.cat([emb, context], dim=1).unsqueeze(1), hidden)
        logits = self.out(self.dropout(torch.cat([output.squeeze(1), context, emb], dim=1)))
        return logits, hidden, weights

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: the gold previous token at every step -> logits (batch, target,
        vocab)."""
        memory = self.encode(src)
        hidden, keys = self._start(memory)
        # the context is the same at every step: one GRU call over the whole target
        if self.attention is None:
            emb = self.dropout(self.tgt_embedding(tgt_in))
            context = memory.summary.unsqueeze(1).expand(-1, tgt_in.size(1), -1)
            output, _ = self.decoder(torch.cat([emb, context], dim=2), hidden)
            return self.out(self.dropout(torch.cat([output, context, emb], dim=2)))
        steps = []
        for t in range(tgt_in.size(1)):
            logits, hidden, _ = self._step(memory, tgt_in[:, t], hidden, keys)
            steps.append(logits)
        return torch.stack(steps, dim=1)

    def step(self, memory: Memory, prefix: torch.Tensor, cache):
        if cache is None:
            cache = self._start(memory)
        hidden, keys = cache
        logits, hidden, weights = self._step(memory, prefix[:, -1], hidden, keys)
        return F.log_softmax(logits.float(), dim=-1), (hidden, keys), weights

    @staticmethod
    def reorder(cache, rows: torch.Tensor):
        hidden, keys = cache
        return hidden[:, rows], (keys[rows] if keys is not None else None)


@dataclass
class TransformerMTConfig:
    src_vocab: int
    tgt_vocab: int
    d_model: int = 256
    num_heads: int = 4
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    ff_dim: int = 1024
    dropout: float = 0.1
    max_len: int = 256  # positions
    tie_embeddings: bool = True  # the output layer shares the target embedding's weights


class TransformerMT(nn.Module):
    """A Transformer encoder-decoder: token embeddings scaled by sqrt(d_model) plus sinusoidal
    positions, pre-norm layers, padding masks on both sides and a causal mask on the target."""

    def __init__(self, config: TransformerMTConfig):
        super().__init__()
        self.config = config
        d = config.d_model
        self.src_embedding = nn.Embedding(config.src_vocab, d, padding_idx=PAD)
        self.tgt_embedding = nn.Embedding(config.tgt_vocab, d, padding_idx=PAD)
        self.register_buffer("positions", sinusoidal_positions(config.max_len, d), persistent=False)
        layer = nn.TransformerEncoderLayer(
            d, config.num_heads, config.ff_dim, config.dropout, batch_first=True, norm_first=True
        )
        # nested tensors do not apply to pre-norm layers: asked for, they only warn
        encoder = nn.TransformerEncoder(
            layer, config.num_encoder_layers, nn.LayerNorm(d), enable_nested_tensor=False
        )
        self.transformer = nn.Transformer(
            d,
            config.num_heads,
            config.num_encoder_layers,
            config.num_decoder_layers,
            config.ff_dim,
            config.dropout,
            custom_encoder=encoder,
            batch_first=True,
            norm_first=True,
        )
        self.dropout = nn.Dropout(config.dropout)
        self.out = nn.Linear(d, config.tgt_vocab, bias=False)
        # N(0, 1/d): times sqrt(d), unit variance (Vaswani et al.)
        for embedding in (self.src_embedding, self.tgt_embedding):
            nn.init.normal_(embedding.weight, std=d**-0.5)
            with torch.no_grad():
                embedding.weight[PAD].zero_()
        # the output layer is the target embedding: logits start small, not ~sqrt(d)
        if config.tie_embeddings:
            self.out.weight = self.tgt_embedding.weight
        self._attention: list[torch.Tensor] | None = None  # filled while attention is recorded

    def _embed(self, layer: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        if ids.size(1) > self.config.max_len:
            raise ValueError(
                f"{ids.size(1)} tokens; the model has {self.config.max_len} positions (max_len)"
            )
        return self.dropout(
            layer(ids) * math.sqrt(self.config.d_model) + self.positions[: ids.size(1)]
        )

    def encode(self, src: torch.Tensor) -> Memory:
        mask = src != PAD
        states = self.transformer.encoder(
            self._embed(self.src_embedding, src), src_key_padding_mask=~mask
        )
        return Memory(states, mask, states[:, 0])

    def _decode(self, memory: Memory, tgt_in: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(
            tgt_in.size(1), device=tgt_in.device, dtype=torch.bool
        )
        hidden = self.transformer.decoder(
            self._embed(self.tgt_embedding, tgt_in),
            memory.states,
            tgt_mask=causal,
            tgt_is_causal=True,
            tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=~memory.mask,
        )
        return self.out(hidden)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self._decode(self.encode(src), tgt_in)

    def step(self, memory: Memory, prefix: torch.Tensor, cache):
        """The whole prefix is decoded again (sentences are short; no key-value cache to
        reorder)."""
        logits = self._decode(memory, prefix)[:, -1]
        weights = self._attention.pop() if self._attention else None
        return F.log_softmax(logits.float(), dim=-1), None, weights

    @staticmethod
    def reorder(cache, rows: torch.Tensor):
        return None

    def record_attention(self, on: bool) -> None:
        """Keep the last decoder layer's cross-attention (averaged over heads) of each step's newest
        position, for the heat maps; off, the layer runs its fast path."""
        layer = self.transformer.decoder.layers[-1].multihead_attn
        if not on:
            layer.__dict__.pop("forward", None)  # the class's forward again
            self._attention = None
            return
        self._attention = []
        plain = type(layer).forward.__get__(layer)

        def forward(query, key, value, **kwargs):
            kwargs.update(need_weights=True, average_attn_weights=True)
            out, weights = plain(query, key, value, **kwargs)
            self._attention.append(weights[:, -1])
            return out, weights

        layer.forward = forward


def _next(model: nn.Module, memory: Memory, prefix: torch.Tensor, cache, bos: int):
    """One decoding step; padding and BOS are never a next token."""
    logp, cache, weights = model.step(memory, prefix, cache)
    logp[:, PAD] = float("-inf")
    logp[:, bos] = float("-inf")
    return logp, cache, weights


def greedy(
    model: nn.Module, src: torch.Tensor, bos: int, eos: int, max_len: int, attention: bool = False
):
    """The most likely next token at every step -> (token ids per row without BOS/EOS, attention per
    row or None)."""
    memory = model.encode(src)
    prefix = torch.full((src.size(0), 1), bos, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    cache, maps = None, []
    for _ in range(max_len):
        logp, cache, weights = _next(model, memory, prefix, cache, bos)
        token = logp.argmax(-1).masked_fill(done, eos)
        prefix = torch.cat([prefix, token.unsqueeze(1)], dim=1)
        if attention and weights is not None:
            maps.append(weights)
        done |= token == eos
        if done.all():
            break
    rows = [_strip(row, eos) for row in prefix[:, 1:].tolist()]
    if not attention or not maps:
        return rows, None
    stacked = torch.stack(maps, dim=1)  # (batch, steps, source)
    return rows, [
        stacked[i, : len(r) + 1, : int(memory.mask[i].sum())].detach().cpu().numpy()
        for i, r in enumerate(rows)
    ]


def beam_search(
    model: nn.Module,
    src: torch.Tensor,
    bos: int,
    eos: int,
    max_len: int,
    beam: int = 4,
    length_penalty: float = 1.0,
) -> list[list[int]]:
    """Beam search over the batch at once (batch x beam hypotheses); a finished hypothesis stays as
    it is. The best hypothesis per row by log-probability / length^length_penalty, as token ids
    without BOS/EOS. At beam 1 it is greedy search exactly."""
    batch = src.size(0)
    memory = model.encode(src).repeat(beam)
    prefix = torch.full((batch * beam, 1), bos, dtype=torch.long, device=src.device)
    scores = torch.zeros(batch, beam, device=src.device)
    scores[:, 1:] = float("-inf")  # the beams start as one hypothesis
    done = torch.zeros(batch * beam, dtype=torch.bool, device=src.device)
    lengths = torch.zeros(batch * beam, device=src.device)
    base = (torch.arange(batch, device=src.device) * beam).unsqueeze(1)
    cache = None
    for _ in range(max_len):
        logp, cache, _ = _next(model, memory, prefix, cache, bos)
        vocab = logp.size(-1)
        # a finished hypothesis is extended by EOS at no cost, so it keeps its score and its place
        logp = torch.where(done.unsqueeze(1), torch.full_like(logp, float("-inf")), logp)
        logp[done, eos] = 0.0
        top, index = (scores.view(-1, 1) + logp).view(batch, beam * vocab).topk(beam, dim=1)
        rows = (base + index // vocab).view(-1)
        token = (index % vocab).view(-1)
        prefix = torch.cat([prefix[rows], token.unsqueeze(1)], dim=1)
        cache = model.reorder(cache, rows) if cache is not None else None
        lengths = lengths[rows] + (~done[rows]).float()
        done = done[rows] | (token == eos)
        scores = top
        if done.all():
            break
    normalised = scores.view(-1) / lengths.clamp(min=1) ** length_penalty
    best = normalised.view(batch, beam).argmax(1) + base.squeeze(1)
    return [_strip(row, eos) for row in prefix[best, 1:].tolist()]


def _strip(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos)] if eos in row else row
