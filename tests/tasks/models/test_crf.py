"""The CRF layer: the forward algorithm and Viterbi decoding against brute force on tiny
lattices."""

import itertools

import pytest
import torch

from tasks.models.crf import CRF
from tasks.ner.tagging import tag_set, transitions


def _crf(num_tags, allowed=None, seed=0):
    torch.manual_seed(seed)
    crf = CRF(num_tags, *(allowed or (None, None, None)))
    for p in crf.parameters():
        torch.nn.init.normal_(p)
    return crf


def _all_paths(crf, emissions, length):
    """Every tag path of one row with its score, by enumeration."""
    out = []
    for path in itertools.product(range(crf.num_tags), repeat=length):
        tags = torch.tensor([list(path) + [0] * (emissions.shape[1] - length)])
        mask = torch.arange(emissions.shape[1]).unsqueeze(0) < length
        out.append((list(path), crf.path_score(emissions, tags, mask).item()))
    return out


@pytest.mark.parametrize("length", [1, 3, 4])
def test_forward_algorithm_equals_brute_force_log_partition(length):
    crf = _crf(3)
    emissions = torch.randn(1, 4, 3)
    mask = torch.arange(4).unsqueeze(0) < length
    brute = torch.logsumexp(torch.tensor([s for _, s in _all_paths(crf, emissions, length)]), 0)
    assert crf.log_partition(emissions, mask).item() == pytest.approx(brute.item(), abs=1e-4)


def test_viterbi_finds_the_best_path_and_its_probability_per_row_of_a_padded_batch():
    crf = _crf(3, seed=1)
    emissions = torch.randn(2, 4, 3)
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    paths, probs = crf.decode(emissions, mask)
    for row, length in enumerate((4, 3)):
        scored = _all_paths(crf, emissions[row : row + 1], length)
        best, score = max(scored, key=lambda x: x[1])
        assert paths[row] == best
        log_z = torch.logsumexp(torch.tensor([s for _, s in scored]), 0).item()
        assert probs[row].item() == pytest.approx(
            float(torch.exp(torch.tensor(score - log_z))), rel=1e-4
        )


def test_nll_is_minus_log_probability_and_marginals_sum_to_one():
    crf = _crf(3, seed=2)
    emissions = torch.randn(1, 3, 3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    tags = torch.tensor([[0, 2, 1]])
    scored = dict((tuple(p), s) for p, s in _all_paths(crf, emissions, 3))
    log_z = torch.logsumexp(torch.tensor(list(scored.values())), 0).item()
    assert crf(emissions, tags, mask).item() == pytest.approx(log_z - scored[(0, 2, 1)], abs=1e-4)
    marginals = crf.marginals(emissions, mask)
    assert torch.allclose(marginals.sum(-1), torch.ones(1, 3), atol=1e-5)
    brute = sum(torch.exp(torch.tensor(s - log_z)) for p, s in scored.items() if p[1] == 2)
    assert marginals[0, 1, 2].item() == pytest.approx(brute.item(), abs=1e-4)


def test_forbidden_transitions_never_decode_into_ill_formed_spans():
    tags = tag_set(["A"])  # O, B-A, I-A, E-A, S-A
    crf = _crf(
        len(tags), tuple(torch.tensor(a, dtype=torch.bool) for a in transitions(tags)), seed=3
    )
    emissions = torch.zeros(1, 3, len(tags))
    # I-A everywhere is what the emissions want, and is ill formed
    emissions[0, :, tags.index("I-A")] = 10.0
    (path,), _ = crf.decode(emissions, torch.ones(1, 3, dtype=torch.bool))
    assert [tags[i] for i in path] == ["B-A", "I-A", "E-A"]


def test_constrained_viterbi_is_the_best_allowed_path_by_brute_force():
    import numpy as np

    from tasks.ner.tagged import constrained_viterbi

    tags = tag_set(["A"])
    allowed, starts, ends = (np.array(a, dtype=bool) for a in transitions(tags))
    rng = np.random.default_rng(0)
    log_probs = np.log(rng.dirichlet(np.ones(len(tags)), size=4))

    def ok(path):
        return (
            starts[path[0]]
            and ends[path[-1]]
            and all(allowed[a, b] for a, b in zip(path, path[1:]))
        )

    best = max(
        (p for p in itertools.product(range(len(tags)), repeat=4) if ok(p)),
        key=lambda p: sum(log_probs[i, t] for i, t in enumerate(p)),
    )
    assert constrained_viterbi(log_probs, allowed, starts, ends) == list(best)
