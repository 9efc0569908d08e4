import pandas as pd

from tasks.classification.models.rnn_lm import rnn_lm_perplexity, train_rnn_lm
from tasks.classification.train import params as _train_params
from tasks.classification.vocab import Params as VocabConfig
from tasks.classification.vocab import count_tokens
from tasks.models import TrainInputs
from tasks.util.text import build_vocab
from tests.tasks.models.test_train import NEG, POS

TrainConfig = _train_params()


def test_rnn_lm_learns_its_corpus_and_reloads(tmp_path):
    train = pd.DataFrame({"words": POS * 20, "aug_method": "original"})
    (tmp_path / "vocab" / "words").mkdir(parents=True)
    vocab = build_vocab(count_tokens(pd.Series(POS + NEG)), VocabConfig(min_freq=1))
    (tmp_path / "vocab" / "words" / "vocab.txt").write_text(
        "".join(f"{t}\n" for t in vocab), encoding="utf-8"
    )
    params = TrainConfig(
        epochs=8,
        patience=8,
        rnn_lm={"embed_dim": 16, "hidden_size": 32, "batch_size": 8, "lr": 0.01},
    )
    own, other = pd.DataFrame({"words": POS}), pd.DataFrame({"words": NEG})
    summary = train_rnn_lm(
        TrainInputs(
            "rnn_lm", train, own, [], params, tmp_path / "vocab", None, tmp_path, tmp_path / "ckpt"
        )
    )
    history = summary["history"]
    assert (
        history[-1]["train_loss"] < history[0]["train_loss"]
        and history[-1]["val_perplexity"] < history[0]["val_perplexity"]
    )
    assert summary["val_perplexity"] == min(h["val_perplexity"] for h in history)
    ppl = rnn_lm_perplexity(tmp_path / "rnn_lm", own, "cpu")
    assert abs(ppl - summary["val_perplexity"]) < 1e-3 * ppl  # the saved model is the best epoch's
    assert ppl < rnn_lm_perplexity(tmp_path / "rnn_lm", other, "cpu") / 3


def test_lm_distribution_sums_to_one_and_scores_targets_consistently():
    import pytest
    import torch

    from tasks.models.modules import LSTMLanguageModel, RNNLMConfig

    torch.manual_seed(0)
    # adaptive softmax, and the plain output layer of a small vocabulary
    for cutoffs in ([10, 30], []):
        model = LSTMLanguageModel(
            RNNLMConfig(vocab_size=50, embed_dim=8, hidden_size=16, cutoffs=cutoffs)
        ).eval()
        assert (model.softmax is not None) == bool(cutoffs)
        ids, targets = torch.tensor([[3, 12, 40, 7]]), torch.tensor([[12, 40, 7, 0]])
        logp, _ = model(ids)
        assert torch.allclose(logp.exp().sum(-1), torch.ones(1, 4), atol=1e-5)
        target_logp, loss = model(ids, targets)
        # padding target excluded
        expected = logp[0, :3].gather(1, targets[0, :3].unsqueeze(1)).squeeze(1)
        assert torch.allclose(target_logp, expected, atol=1e-5) and loss.item() == pytest.approx(
            -expected.mean().item(), rel=1e-5
        )


def test_rnn_lm_classifier_tells_the_classes_apart_by_likelihood(tmp_path):
    import numpy as np

    from tasks.classification.models.rnn_lm import lm_classifier_predictor, train_lm_classifier

    train = pd.DataFrame(
        {
            "words": POS * 15 + NEG * 15,
            "label": ["pos"] * 15 * len(POS) + ["neg"] * 15 * len(NEG),
            "aug_method": "original",
        }
    )
    validation = pd.DataFrame(
        {"words": POS + NEG, "label": ["pos"] * len(POS) + ["neg"] * len(NEG)}
    )
    (tmp_path / "vocab" / "words").mkdir(parents=True)
    vocab = build_vocab(count_tokens(pd.Series(POS + NEG)), VocabConfig(min_freq=1))
    (tmp_path / "vocab" / "words" / "vocab.txt").write_text(
        "".join(f"{t}\n" for t in vocab), encoding="utf-8"
    )
    params = TrainConfig(
        epochs=6,
        patience=6,
        rnn_lm_classifier={"embed_dim": 16, "hidden_size": 32, "batch_size": 8, "lr": 0.01},
    )
    summary = train_lm_classifier(
        TrainInputs(
            "rnn_lm_classifier",
            train,
            validation,
            ["neg", "pos"],
            params,
            tmp_path / "vocab",
            None,
            tmp_path,
            tmp_path / "ckpt",
        )
    )
    assert [c["label"] for c in summary["per_class"]] == ["neg", "pos"]
    probs = lm_classifier_predictor(tmp_path / "rnn_lm_classifier", "cpu")(validation)
    assert (
        np.allclose(probs.sum(1), 1)
        and (probs.argmax(1) == np.array([1] * len(POS) + [0] * len(NEG))).mean() == 1.0
    )


def test_text_log_likelihoods_add_up_each_texts_tokens():
    import torch

    from tasks.classification.models.rnn_lm import text_log_likelihoods
    from tasks.models.modules import LSTMLanguageModel, RNNLMConfig

    torch.manual_seed(0)
    model = LSTMLanguageModel(
        RNNLMConfig(vocab_size=30, embed_dim=8, hidden_size=16, cutoffs=[])
    ).eval()
    seqs = [[3, 5, 7, 3], [3, 9, 3]]
    joint = text_log_likelihoods(model, seqs)
    for seq, value in zip(seqs, joint):
        ids, targets = torch.tensor([seq[:-1]]), torch.tensor([seq[1:]])
        logp, _ = model(ids, targets)
        assert abs(logp.sum().item() - value) < 1e-4


def test_the_adaptive_softmax_stays_fp32_under_autocast():
    """Under autocast the LSTM's output comes in a low precision (fp16 under CUDA autocast) while
    the adaptive softmax copies fp32 log-softmaxes into a tensor of its input's type: on a GPU that
    mix failed (index_copy_). The softmax runs in fp32 whatever the autocast, and scores as it does
    without one. The autocast is the trainer's, which also runs on a CPU without native bf16 (where
    oneDNN has no bf16 LSTM)."""
    import torch

    from tasks.models.devices import autocast
    from tasks.models.modules import LSTMLanguageModel, RNNLMConfig

    torch.manual_seed(0)
    model = LSTMLanguageModel(
        RNNLMConfig(
            vocab_size=300,
            embed_dim=16,
            hidden_size=32,
            num_layers=1,
            dropout=0.0,
            cutoffs=[40, 150],
        )
    ).eval()
    ids, targets = torch.randint(1, 300, (4, 9)), torch.randint(1, 300, (4, 9))
    with torch.no_grad():
        _, plain_loss = model(ids, targets)
        with autocast(torch.device("cpu"), torch.bfloat16):
            logp, loss = model(ids, targets)
            full, _ = model(ids)
    assert logp.dtype == loss.dtype == full.dtype == torch.float32
    assert abs(loss.item() - plain_loss.item()) < 0.05 * plain_loss.item()
