"""A linear-chain CRF layer for PyTorch taggers: the negative log-likelihood by the forward
algorithm, and Viterbi decoding. Emissions are (batch, length, tags); `mask` marks real positions,
which start each row."""

from __future__ import annotations

import torch
import torch.nn as nn


class CRF(nn.Module):
    """Transition scores between tags, plus start and end scores; `allowed` (tags x tags, bool)
    forbids the transitions a tag scheme never makes (O -> I-X, B-X -> B-Y, ...), and
    `allowed_start`/`allowed_end` the tags a sentence cannot start or end with, so decoding always
    yields well-formed spans."""

    def __init__(
        self,
        num_tags: int,
        allowed: torch.Tensor | None = None,
        allowed_start: torch.Tensor | None = None,
        allowed_end: torch.Tensor | None = None,
    ):
        super().__init__()
        self.num_tags = num_tags
        self.transitions = nn.Parameter(torch.zeros(num_tags, num_tags))  # [from, to]
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))
        ones = torch.ones(num_tags, dtype=torch.bool)
        self.register_buffer(
            "allowed",
            allowed if allowed is not None else torch.ones(num_tags, num_tags, dtype=torch.bool),
        )
        self.register_buffer(
            "allowed_start", allowed_start if allowed_start is not None else ones.clone()
        )
        self.register_buffer(
            "allowed_end", allowed_end if allowed_end is not None else ones.clone()
        )

    def _scores(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        never = -1e4
        trans = self.transitions.masked_fill(~self.allowed, never)
        return (
            trans,
            self.start.masked_fill(~self.allowed_start, never),
            self.end.masked_fill(~self.allowed_end, never),
        )

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log Z per row, by the forward algorithm."""
        trans, start, end = self._scores()
        alpha = start + emissions[:, 0]  # (batch, tags)
        for t in range(1, emissions.shape[1]):
            step = torch.logsumexp(alpha.unsqueeze(2) + trans.unsqueeze(0), dim=1) + emissions[:, t]
            alpha = torch.where(mask[:, t].unsqueeze(1), step, alpha)
        return torch.logsumexp(alpha + end, dim=1)

    def path_score(
        self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The unnormalised score of the given tag paths."""
        trans, start, end = self._scores()
        maskf = mask.to(emissions.dtype)
        emit = emissions.gather(2, tags.unsqueeze(2)).squeeze(2)  # (batch, length)
        score = start[tags[:, 0]] + (emit * maskf).sum(1)
        score = score + (trans[tags[:, :-1], tags[:, 1:]] * maskf[:, 1:]).sum(1)
        last = tags.gather(1, (mask.sum(1) - 1).unsqueeze(1)).squeeze(1)
        return score + end[last]

    def forward(
        self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Mean negative log-likelihood of the gold paths."""
        emissions = emissions.float()
        return (self.log_partition(emissions, mask) - self.path_score(emissions, tags, mask)).mean()

    @torch.no_grad()
    def decode(
        self, emissions: torch.Tensor, mask: torch.Tensor
    ) -> tuple[list[list[int]], torch.Tensor]:
        """The best tag path per row (Viterbi), and its probability under the model."""
        emissions = emissions.float()
        trans, start, end = self._scores()
        score = start + emissions[:, 0]
        back = []
        for t in range(1, emissions.shape[1]):
            best, idx = (score.unsqueeze(2) + trans.unsqueeze(0)).max(dim=1)
            step = best + emissions[:, t]
            keep = mask[:, t].unsqueeze(1)
            score = torch.where(keep, step, score)
            back.append(
                torch.where(
                    keep, idx, torch.arange(self.num_tags, device=idx.device).expand_as(idx)
                )
            )
        final = score + end
        best_score, last = final.max(dim=1)
        paths = [last]
        for idx in reversed(back):
            last = idx.gather(1, last.unsqueeze(1)).squeeze(1)
            paths.append(last)
        order = torch.stack(list(reversed(paths)), dim=1)
        lengths = mask.sum(1).tolist()
        prob = torch.exp(best_score - self.log_partition(emissions, mask))
        return [order[i, :n].tolist() for i, n in enumerate(lengths)], prob

    def marginals(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """P(tag at position t) per row, (batch, length, tags): the gradient of log Z by the
        emissions."""
        with torch.enable_grad():
            emissions = emissions.detach().float().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.log_partition(emissions, mask).sum(), emissions)
        return grad * mask.unsqueeze(2)
