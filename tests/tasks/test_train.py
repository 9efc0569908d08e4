import numpy as np
import pytest
import pandas as pd
import torch
from gensim.models import KeyedVectors

from flows.config import TrainConfig
from flows.tracking import Tracker
from tasks.models import TextCNN, TextCNNConfig
from tasks.tfidf import train_tfidf_lr
from tasks.train import PREDICTORS, batches, encode, train_fasttext, train_network

POS = ["房间 很 干净 服务 好", "早餐 不错 位置 好", "服务 热情 房间 干净"]
NEG = ["房间 很 脏 服务 差", "早餐 太 差 了", "前台 态度 差 房间 吵"]


def frame(n=20):
    words = (POS + NEG) * n
    return pd.DataFrame({"words": words, "chars": [" ".join(w.replace(" ", "")) for w in words], "label": (["1"] * 3 + ["0"] * 3) * n})


def test_textcnn_loss_goes_down():
    torch.manual_seed(0)
    vocab = {t: i + 2 for i, t in enumerate(sorted({t for line in POS + NEG for t in line.split()}))}
    model = TextCNN(TextCNNConfig(vocab_size=len(vocab) + 2, num_classes=2, embed_dim=16, num_filters=8))
    ids = encode(pd.Series(POS + NEG), vocab, 50)
    y = np.array([1, 1, 1, 0, 0, 0])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        for _, x, yy in batches(ids, y, 6, shuffle=False):
            _, loss = model(x, yy)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.5


def test_batches_pad_and_keep_rows():
    ids = [[5, 6, 7], [8], [9, 10]]
    seen = []
    for chunk, x, _ in batches(ids, None, 2, shuffle=False):
        for row, i in enumerate(chunk):
            assert x[row, : len(ids[i])].tolist() == ids[i] and x[row, len(ids[i]) :].eq(0).all()
        seen += list(chunk)
    assert sorted(seen) == [0, 1, 2]


@pytest.mark.parametrize("kind", ["textcnn", "bilstm"])
def test_network_trains_saves_and_reloads_with_identical_predictions(kind, tmp_path, run_ctx):
    from tasks.vocab import build_vocab, count_tokens
    from flows.config import VocabConfig

    train, validation = frame(), frame(2)
    vocab = build_vocab(count_tokens(train["words"]), VocabConfig(min_freq=1))
    (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    kv = KeyedVectors(vector_size=16)
    kv.add_vectors(["房间", "干净"], np.ones((2, 16), dtype=np.float32))
    kv.save(str(tmp_path / "w.kv"))
    params = TrainConfig(epochs=6, patience=6, textcnn={"num_filters": 8, "batch_size": 16, "lr": 0.01},
                         bilstm={"hidden_size": 8, "batch_size": 16, "lr": 0.01})
    tracker = Tracker.start(run_ctx.experiment, "train-test", parent=run_ctx.parent_run_id)
    summary = train_network(kind, train, validation, ["0", "1"], params, tmp_path / "vocab.txt", tmp_path / "w.kv", tmp_path, tracker)
    assert summary["embedding_coverage"] == 2 / len(vocab)
    assert summary["history"][-1]["train_loss"] < summary["history"][0]["train_loss"]
    probs = PREDICTORS[kind](tmp_path / kind)(validation)
    again = PREDICTORS[kind](tmp_path / kind)(validation)
    assert np.array_equal(probs, again)
    assert (probs.argmax(1) == validation["label"].astype(int)).mean() == 1.0
    history = tracker.client.get_metric_history(tracker.run_id, f"{kind}_val_macro_f1")
    assert [m.step for m in history] == [h["epoch"] for h in summary["history"]]


def test_fasttext_classifier_round_trip(tmp_path):
    train = frame(30)
    params = TrainConfig(fasttext={"epoch": 20, "dim": 20, "bucket": 50000, "lr": 0.5})
    train_fasttext(train, ["0", "1"], params, tmp_path)
    probs = PREDICTORS["fasttext"](tmp_path / "fasttext")(frame(1))
    assert probs.shape == (6, 2) and np.allclose(probs.sum(1), 1, atol=1e-3)
    assert (probs.argmax(1) == frame(1)["label"].astype(int)).mean() == 1.0


def test_tfidf_lr_round_trip(tmp_path):
    train = frame(10).assign(text=lambda d: d["words"].str.replace(" ", ""))
    summary = train_tfidf_lr(train, ["0", "1"], TrainConfig().tfidf_lr, 0, tmp_path)
    assert summary["kind"] == "tfidf_lr"
    test = frame(1).assign(text=lambda d: d["words"].str.replace(" ", ""))
    probs = PREDICTORS["tfidf_lr"](tmp_path / "tfidf_lr")(test)
    assert probs.shape == (6, 2) and np.allclose(probs.sum(1), 1)
    assert (probs.argmax(1) == test["label"].astype(int)).mean() == 1.0
    assert np.array_equal(probs, PREDICTORS["tfidf_lr"](tmp_path / "tfidf_lr")(test))


def test_bilstm_ignores_padding():
    from tasks.models import BiLSTMAttention, BiLSTMConfig

    torch.manual_seed(0)
    model = BiLSTMAttention(BiLSTMConfig(vocab_size=20, num_classes=2, embed_dim=8, hidden_size=4)).eval()
    alone = model(torch.tensor([[5, 6, 7]]))[0]
    padded = model(torch.tensor([[5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 12, 13]]))[0][:1]
    assert torch.allclose(alone, padded, atol=1e-6)


def test_warmup_then_linear_decay_and_class_weights():
    from tasks.train import class_weight_tensor, warmup_linear_decay

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_linear_decay(opt, TrainConfig(epochs=1, warmup_ratio=0.2), steps_per_epoch=10)
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[:2] == [0.5, 1.0] and lrs[-1] == pytest.approx(0.125) and all(a >= b for a, b in zip(lrs[1:], lrs[2:]))
    w = class_weight_tensor(np.array([0, 0, 0, 1]), 2)
    assert w.tolist() == pytest.approx([4 / 6, 2.0])
