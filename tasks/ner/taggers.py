"""The neural sequence taggers: character and bigram embeddings, an optional lexicon adapter (each
character attends over the vectors of the lexicon words that cover it, with the character's place in
each word), a BiLSTM or Transformer encoder, or a pretrained BERT whose character states are joined
with those features, and a CRF on top."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from tasks.models.crf import CRF
from tasks.ner.tagging import POSITIONS


class Tagger(nn.Module):
    def __init__(
        self,
        num_chars: int,
        num_bigrams: int,
        num_words: int,
        num_tags: int,
        char_dim: int,
        bigram_dim: int,
        word_dim: int,
        lexicon: bool,
        encoder: str,
        hidden: int,
        layers: int,
        heads: int,
        dropout: float,
        allowed: tuple[list[list[bool]], list[bool], list[bool]],
        num_pos: int = 0,
        seg_dim: int = 0,
        bert: nn.Module | None = None,
    ):
        super().__init__()
        self.char = nn.Embedding(num_chars, char_dim, padding_idx=0)
        self.bigram = nn.Embedding(num_bigrams, bigram_dim, padding_idx=0)
        width = char_dim + 2 * bigram_dim
        self.segmented = seg_dim > 0
        # jieba's word boundaries (B/M/E/S of the word holding each character) and POS tags
        if self.segmented:
            self.seg = nn.Embedding(5, seg_dim, padding_idx=0)
            self.pos = nn.Embedding(num_pos, seg_dim, padding_idx=0)
            width += 2 * seg_dim
        self.lexicon = lexicon
        if lexicon:
            self.word = nn.Embedding(num_words, word_dim, padding_idx=0)
            self.place = nn.Embedding(len(POSITIONS) + 1, word_dim, padding_idx=0)
            self.query = nn.Linear(width, word_dim, bias=False)
            width += word_dim
        self.dropout = nn.Dropout(dropout)
        self.encoder_kind = encoder
        if encoder == "bert":  # a pretrained character encoder; the features above join its output
            self.encoder = bert
            out = bert.config.hidden_size + width
        elif encoder == "bilstm":
            self.encoder = nn.LSTM(
                width,
                hidden,
                num_layers=layers,
                batch_first=True,
                bidirectional=True,
                dropout=dropout if layers > 1 else 0.0,
            )
            out = 2 * hidden
        else:
            self.project = nn.Linear(width, hidden)
            self.positions = nn.Embedding(512, hidden)
            layer = nn.TransformerEncoderLayer(
                hidden, heads, 4 * hidden, dropout, batch_first=True, norm_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            out = hidden
        self.emit = nn.Linear(out, num_tags)
        allow, start, end = (torch.tensor(a, dtype=torch.bool) for a in allowed)
        self.crf = CRF(num_tags, allow, start, end)

    def adapter(self, x: torch.Tensor, words: torch.Tensor, places: torch.Tensor) -> torch.Tensor:
        """Per character, the attention-weighted sum of its covering words' vectors (zero when none
        covers it)."""
        values = self.word(words) + self.place(places)  # (batch, length, k, dim)
        scores = (values @ self.query(x).unsqueeze(-1)).squeeze(-1) / math.sqrt(values.shape[-1])
        present = words > 0
        scores = scores.masked_fill(~present, -1e4)
        weights = torch.softmax(scores, dim=-1) * present.any(-1, keepdim=True)
        return (weights.unsqueeze(-1) * values).sum(2)

    def emissions(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.cat(
            [self.char(batch["chars"]), self.bigram(batch["next"]), self.bigram(batch["prev"])],
            dim=-1,
        )
        if self.segmented:
            x = torch.cat([x, self.seg(batch["seg"]), self.pos(batch["pos"])], dim=-1)
        if self.lexicon:
            x = torch.cat([x, self.adapter(x, batch["words"], batch["places"])], dim=-1)
        x = self.dropout(x)
        mask = batch["chars"] > 0
        if self.encoder_kind == "bert":
            states = self.encoder(
                input_ids=batch["bert_ids"], attention_mask=mask.long()
            ).last_hidden_state
            h = torch.cat([states, x], dim=-1)
        elif self.encoder_kind == "bilstm":
            lengths = mask.sum(1).cpu()
            packed = nn.utils.rnn.pack_padded_sequence(
                x, lengths, batch_first=True, enforce_sorted=False
            )
            h, _ = self.encoder(packed)
            h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=x.shape[1])
        else:
            steps = torch.arange(x.shape[1], device=x.device).clamp(
                max=self.positions.num_embeddings - 1
            )
            h = self.encoder(self.project(x) + self.positions(steps), src_key_padding_mask=~mask)
        return self.emit(self.dropout(h))

    def optimizer_groups(self, lr: float, encoder_lr: float | None) -> list[dict]:
        """A pretrained encoder learns at its own (smaller) rate; everything else at `lr`."""
        if self.encoder_kind != "bert" or encoder_lr is None:
            return [{"params": [w for w in self.parameters() if w.requires_grad]}]
        inner = {id(w) for w in self.encoder.parameters()}
        return [
            {"params": [w for w in self.encoder.parameters() if w.requires_grad], "lr": encoder_lr},
            {"params": [w for w in self.parameters() if w.requires_grad and id(w) not in inner]},
        ]

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.crf(self.emissions(batch), batch["tags"], batch["chars"] > 0)

    def decode(self, batch: dict[str, torch.Tensor]) -> tuple[list[list[int]], torch.Tensor]:
        return self.crf.decode(self.emissions(batch), batch["chars"] > 0)
