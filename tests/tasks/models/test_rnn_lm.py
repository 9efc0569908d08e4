import pandas as pd

from tasks.models import TrainInputs
from tasks.models.rnn_lm import rnn_lm_perplexity, train_rnn_lm
from tasks.train import Params as TrainConfig
from tasks.vocab import Params as VocabConfig
from tasks.vocab import build_vocab, count_tokens
from tests.tasks.test_train import NEG, POS


def test_rnn_lm_learns_its_corpus_and_reloads(tmp_path):
    train = pd.DataFrame({"words": POS * 20, "aug_method": "original"})
    (tmp_path / "vocab" / "words").mkdir(parents=True)
    vocab = build_vocab(count_tokens(pd.Series(POS + NEG)), VocabConfig(min_freq=1))
    (tmp_path / "vocab" / "words" / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    params = TrainConfig(epochs=8, patience=8, rnn_lm={"embed_dim": 16, "hidden_size": 32, "batch_size": 8, "lr": 0.01})
    own, other = pd.DataFrame({"words": POS}), pd.DataFrame({"words": NEG})
    summary = train_rnn_lm(TrainInputs("rnn_lm", train, own, [], params, tmp_path / "vocab", None, tmp_path, tmp_path / "ckpt"))
    history = summary["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"] and history[-1]["val_perplexity"] < history[0]["val_perplexity"]
    assert summary["val_perplexity"] == min(h["val_perplexity"] for h in history)
    ppl = rnn_lm_perplexity(tmp_path / "rnn_lm", own, "cpu")
    assert abs(ppl - summary["val_perplexity"]) < 1e-3 * ppl  # the saved model is the best epoch's
    assert ppl < rnn_lm_perplexity(tmp_path / "rnn_lm", other, "cpu") / 3


def test_lm_distribution_sums_to_one_and_scores_targets_consistently():
    import pytest
    import torch

    from tasks.models.modules import LSTMLanguageModel, RNNLMConfig

    torch.manual_seed(0)
    for cutoffs in ([10, 30], []):  # adaptive softmax, and the plain output layer of a small vocabulary
        model = LSTMLanguageModel(RNNLMConfig(vocab_size=50, embed_dim=8, hidden_size=16, cutoffs=cutoffs)).eval()
        assert (model.softmax is not None) == bool(cutoffs)
        ids, targets = torch.tensor([[3, 12, 40, 7]]), torch.tensor([[12, 40, 7, 0]])
        logp, _ = model(ids)
        assert torch.allclose(logp.exp().sum(-1), torch.ones(1, 4), atol=1e-5)
        target_logp, loss = model(ids, targets)
        expected = logp[0, :3].gather(1, targets[0, :3].unsqueeze(1)).squeeze(1)  # padding target excluded
        assert torch.allclose(target_logp, expected, atol=1e-5) and loss.item() == pytest.approx(-expected.mean().item(), rel=1e-5)
