import json

import numpy as np
import pandas as pd
import pytest
import torch
from gensim.models import KeyedVectors

from flows.track.tracker import Tracker
from tasks.classification.models.networks import batches, encode
from tasks.classification.train import params as _train_params
from tasks.classification.vocab import Params as VocabConfig
from tasks.classification.vocab import count_tokens
from tasks.models import TrainInputs
from tasks.models.modules import TextCNN, TextCNNConfig
from tasks.stages import MODELS
from tasks.util.text import build_vocab
from tasks.util.vectors import keyed_word_vectors

TrainConfig = _train_params()

POS = ["房间 很 干净 服务 好", "早餐 不错 位置 好", "服务 热情 房间 干净"]
NEG = ["房间 很 脏 服务 差", "早餐 太 差 了", "前台 态度 差 房间 吵"]


def frame(n=20):
    words = (POS + NEG) * n
    return pd.DataFrame(
        {
            "words": words,
            "chars": [" ".join(w.replace(" ", "")) for w in words],
            "label": (["1"] * 3 + ["0"] * 3) * n,
        }
    )


def train_model(
    name, train, validation, params, out, vectors=None, scratch=None, sink=None, labels=("0", "1")
):
    """Train one registered model as the train stage would, with a word vocabulary built from
    `train`."""
    (out / "words").mkdir(parents=True, exist_ok=True)
    vocab = build_vocab(count_tokens(train["words"]), VocabConfig(min_freq=1))
    (out / "words" / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    inputs = TrainInputs(
        name,
        train,
        validation,
        list(labels),
        params,
        out,
        vectors,
        out,
        scratch or out / "ckpt",
        sink,
    )
    return MODELS[name].train(inputs), len(vocab)


def predict(name, folder, df):
    """Probabilities of a saved model through its registry entry."""
    return MODELS[name].load(folder / name)(df)


def tiny_vectors(dim=16):
    """Two words' vectors standing in for the embed stage's Word2Vec."""
    kv = KeyedVectors(vector_size=dim)
    kv.add_vectors(["房间", "干净"], np.ones((2, dim), dtype=np.float32))
    return keyed_word_vectors(kv)


def test_textcnn_loss_goes_down():
    torch.manual_seed(0)
    vocab = {
        t: i + 2 for i, t in enumerate(sorted({t for line in POS + NEG for t in line.split()}))
    }
    model = TextCNN(
        TextCNNConfig(vocab_size=len(vocab) + 2, num_classes=2, embed_dim=16, num_filters=8)
    )
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


@pytest.mark.parametrize("kind", ["textcnn", "bilstm", "transformer"])
def test_network_trains_saves_and_reloads_with_identical_predictions(
    kind, tmp_path, run_ctx, caplog
):
    train, validation = frame(), frame(2)
    params = TrainConfig(
        epochs=6,
        patience=6,
        textcnn={"num_filters": 8, "batch_size": 16, "lr": 0.01},
        bilstm={"hidden_size": 8, "batch_size": 16, "lr": 0.01},
        transformer={"num_heads": 2, "ff_dim": 32, "batch_size": 16, "lr": 0.003},
    )
    tracker = Tracker.start(run_ctx.experiment, "train-test", parent=run_ctx.parent_run_id)
    with caplog.at_level("INFO", logger="zhpipe.train"):
        summary, vocab_size = train_model(
            kind, train, validation, params, tmp_path, tiny_vectors(), sink=tracker
        )
    # said once, up front
    [estimate] = [r.getMessage() for r in caplog.records if "more to train" in r.getMessage()]
    assert estimate.startswith(f"{kind}: about ") and "6 epochs of" in estimate
    assert summary["embedding_coverage"] == 2 / vocab_size
    assert summary["history"][-1]["train_loss"] < summary["history"][0]["train_loss"]
    probs = predict(kind, tmp_path, validation)
    again = predict(kind, tmp_path, validation)
    assert np.array_equal(probs, again)
    assert (probs.argmax(1) == validation["label"].astype(int)).mean() == 1.0
    # the model run holds one model: no prefix
    history = tracker.client.get_metric_history(tracker.run_id, "val_macro_f1")
    assert [m.step for m in history] == [h["epoch"] for h in summary["history"]]


def test_the_training_estimate_reads_as_people_plan():
    from tasks.models.racing import estimate_line

    # 10 s a batch: 3,000 batches less the 5 done
    line = estimate_line("bilstm_crf", 50.0, 5, 300, 10)
    assert line.startswith(
        "bilstm_crf: about 8.3 h more to train (10 epochs of 300 batches at 10.00 s a batch, from "
        "its first 5)"
    )
    assert "about 49 s more" in estimate_line(
        "textcnn", 1.0, 10, 50, 10
    ) and "about 10 min" in estimate_line("x", 2.0, 2, 100, 6)


def test_fasttext_classifier_round_trip(tmp_path):
    train = frame(30)
    params = TrainConfig(fasttext={"epoch": 20, "dim": 20, "bucket": 50000, "lr": 0.5})
    train_model("fasttext", train, frame(1), params, tmp_path)
    probs = predict("fasttext", tmp_path, frame(1))
    assert probs.shape == (6, 2) and np.allclose(probs.sum(1), 1, atol=1e-3)
    assert (probs.argmax(1) == frame(1)["label"].astype(int)).mean() == 1.0


@pytest.mark.parametrize("name", ["tfidf_lr", "tfidf_wide"])
def test_tfidf_round_trip(tmp_path, name):
    """Trained through its registry entry, saved as data, rebuilt by its predictor with the settings
    it was trained with (tfidf_wide's wider n-grams included)."""
    train = frame(10).assign(text=lambda d: d["words"].str.replace(" ", ""))
    summary, _ = train_model(name, train, frame(1), TrainConfig(), tmp_path)
    assert summary["kind"] == name and (tmp_path / name / "weights.npz").is_file()
    config = json.loads((tmp_path / name / "config.json").read_text(encoding="utf-8"))
    assert config["char_ngrams"] == ([1, 5] if name == "tfidf_wide" else [1, 3])
    test = frame(1).assign(text=lambda d: d["words"].str.replace(" ", ""))
    probs = predict(name, tmp_path, test)
    assert probs.shape == (6, 2) and np.allclose(probs.sum(1), 1)
    assert (probs.argmax(1) == test["label"].astype(int)).mean() == 1.0
    assert np.array_equal(probs, predict(name, tmp_path, test))


def test_bilstm_ignores_padding():
    from tasks.models.modules import BiLSTMAttention, BiLSTMConfig

    torch.manual_seed(0)
    model = BiLSTMAttention(
        BiLSTMConfig(vocab_size=20, num_classes=2, embed_dim=8, hidden_size=4)
    ).eval()
    alone = model(torch.tensor([[5, 6, 7]]))[0]
    padded = model(torch.tensor([[5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 12, 13]]))[0][:1]
    assert torch.allclose(alone, padded, atol=1e-6)


def test_warmup_then_linear_decay_and_class_weights():
    from tasks.models.base import class_weight_tensor
    from tasks.models.trainer import warmup_linear_decay

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_linear_decay(opt, epochs=1, warmup_ratio=0.2, steps_per_epoch=10)
    lrs = []
    for _ in range(10):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert (
        lrs[:2] == [0.5, 1.0]
        and lrs[-1] == pytest.approx(0.125)
        and all(a >= b for a, b in zip(lrs[1:], lrs[2:]))
    )
    w = class_weight_tensor(np.array([0, 0, 0, 1]), 2)
    assert w.tolist() == pytest.approx([4 / 6, 2.0])


def test_killed_training_resumes_from_its_last_checkpoint_and_ends_identical(tmp_path):
    """SIGKILL a training process once it has checkpointed; the rerun resumes there and matches an
    uninterrupted run."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}

    from tests.helpers.train_child import train

    def child(ckpt, out):
        return subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.train_child", str(ckpt), str(out), "20"],
            cwd=root,
            env=env,
        )

    victim = child(tmp_path / "ckpt-b", tmp_path / "b1")
    deadline = time.time() + 240
    while not (tmp_path / "ckpt-b" / "last.pt").exists():
        assert victim.poll() is None and time.time() < deadline, (
            "the child ended before writing a checkpoint"
        )
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (tmp_path / "b1" / "probs.npy").exists()  # it really died mid-training
    resumed = child(tmp_path / "ckpt-b", tmp_path / "b2")
    # the reference, uninterrupted, here while the rerun resumes
    train(tmp_path / "ckpt-a", tmp_path / "a", 20)
    assert resumed.wait(timeout=300) == 0
    summary = json.loads((tmp_path / "b2" / "summary.json").read_text())
    assert 1 <= summary["resumed_from_epoch"] < 20
    assert np.array_equal(
        np.load(tmp_path / "a" / "probs.npy"), np.load(tmp_path / "b2" / "probs.npy")
    )


def test_device_auto_and_bf16_autocast_on_cpu(tmp_path, run_ctx):
    """`auto` is CPU here; bf16 autocast (the CUDA default) also runs on CPU and still learns."""
    from tasks.models.devices import amp_dtype, resolve_device

    assert resolve_device("auto").type == (
        "cuda" if torch.cuda.is_available() else resolve_device("auto").type
    )
    assert (
        amp_dtype(torch.device("cpu"), "auto") is None
        and amp_dtype(torch.device("cpu"), "bf16") == torch.bfloat16
    )
    train = frame()
    params = TrainConfig(
        epochs=4,
        patience=4,
        precision="bf16",
        device="cpu",
        textcnn={"num_filters": 8, "batch_size": 16, "lr": 0.01},
    )
    summary, _ = train_model("textcnn", train, frame(2), params, tmp_path, tiny_vectors())
    assert summary["bf16"] and summary["device"] == "cpu"
    assert summary["history"][-1]["train_loss"] < summary["history"][0]["train_loss"]


def test_transformer_masks_padding_and_scales_embeddings():
    from tasks.models.modules import TransformerClassifier, TransformerConfig, sinusoidal_positions

    torch.manual_seed(0)
    model = TransformerClassifier(
        TransformerConfig(vocab_size=20, num_classes=2, embed_dim=8, num_heads=2, ff_dim=16)
    ).eval()
    alone = model(torch.tensor([[5, 6, 7]]))[0]
    padded = model(torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]]))[0][:1]
    assert torch.allclose(alone, padded, atol=1e-5)
    table = sinusoidal_positions(4, 8)
    assert torch.allclose(table[0], torch.tensor([0.0, 1.0] * 4)) and torch.allclose(
        table[:, 0], torch.sin(torch.arange(4.0))
    )


def test_fp16_autocast_with_a_gradient_scaler_learns(tmp_path, run_ctx):
    """fp16 (what `auto` picks on CUDA without bf16: T4, V100) goes through a gradient scaler; here
    on CPU."""
    from tasks.models.devices import amp_dtype

    assert (
        amp_dtype(torch.device("cpu"), "auto") is None
        and amp_dtype(torch.device("cpu"), "fp16") == torch.float16
    )
    params = TrainConfig(
        epochs=4,
        patience=4,
        precision="fp16",
        device="cpu",
        textcnn={"num_filters": 8, "batch_size": 16, "lr": 0.01},
    )
    summary, _ = train_model("textcnn", frame(), frame(2), params, tmp_path, tiny_vectors())
    assert summary["history"][-1]["train_loss"] < summary["history"][0]["train_loss"]


def test_tfidf_streamed_from_the_split_file_learns_what_the_exact_fit_learns(tmp_path, monkeypatch):
    """fit: stream reads the split as a file batch by batch (hashed n-grams, SGD over shuffled
    batches); on three labels it agrees with the exact in-memory logistic regression, and auto picks
    by the split's size."""
    from tasks.classification.models.tfidf import Params, text_mb, train_tfidf_lr
    from tasks.util import io
    from tasks.util.io import Rows

    words = (POS + NEG + ["位置 一般 早餐 普通", "价格 一般 服务 普通"]) * 30
    labels = (["1"] * 3 + ["0"] * 3 + ["2"] * 2) * 30
    df = pd.DataFrame(
        {"words": words, "text": [w.replace(" ", "") for w in words], "label": labels}
    )
    # sorted by label, as corpora are
    df.sort_values("label").to_parquet(tmp_path / "train.parquet", row_group_size=16)
    monkeypatch.setattr(io, "BATCH_ROWS", 40)
    test = pd.DataFrame(
        {
            "words": POS[:1] + NEG[:1] + ["价格 一般 服务 普通"],
            "text": ["房间很干净服务好", "房间很脏服务差", "价格一般服务普通"],
        }
    )
    got = {}
    for fit in ("memory", "stream"):
        out = tmp_path / fit
        out.mkdir()
        summary = train_tfidf_lr(
            Rows(tmp_path / "train.parquet"), ["0", "1", "2"], Params(fit=fit, min_df=1), 0, out
        )
        assert summary["fit"] == fit
        got[fit] = MODELS["tfidf_lr"].load(out / "tfidf_lr")(test)
        assert np.allclose(got[fit].sum(1), 1, atol=1e-5)
    assert got["stream"].argmax(1).tolist() == got["memory"].argmax(1).tolist() == [1, 0, 2]
    assert not (tmp_path / "stream" / "vocabulary.json").exists() and not list(
        (tmp_path / "stream").glob(".*shuffle*")
    )
    assert text_mb(Rows(tmp_path / "train.parquet")) < 1
    assert 0.01 < text_mb(df) < 1  # a frame in memory is measured too (its string columns)
    auto = tmp_path / "auto"
    auto.mkdir()
    assert (
        train_tfidf_lr(
            Rows(tmp_path / "train.parquet"), ["0", "1", "2"], Params(memory_mb=0), 0, auto
        )["fit"]
        == "stream"
    )


def test_a_streamed_tfidf_fit_out_of_its_share_stops_inside_its_pass_and_is_a_model(
    tmp_path, monkeypatch
):
    """Under a training budget the streamed fit stops where its share runs out, inside its first
    pass (as a network's first epoch does); the model of the batches it saw is kept and answers."""
    from tasks.classification.models import tfidf
    from tasks.models.racing import Race, racing
    from tasks.util.io import Rows

    words = (POS + NEG) * 40
    labels = (["1"] * 3 + ["0"] * 3) * 40
    df = pd.DataFrame(
        {"words": words, "text": [w.replace(" ", "") for w in words], "label": labels}
    )
    df.to_parquet(tmp_path / "train.parquet", row_group_size=16)
    monkeypatch.setattr(tfidf, "STREAM_ROWS", 40)
    out = tmp_path / "model"
    out.mkdir()
    race = Race(0.001, first=True)  # spent before the first batch: that one batch is made
    with racing(race):
        summary = tfidf.train_tfidf_lr(
            Rows(tmp_path / "train.parquet"),
            ["0", "1"],
            tfidf.Params(fit="stream", min_df=1),
            0,
            out,
        )
    assert race.cut.startswith("stopped in epoch 1 after 40 of 240 rows: its share"), race.cut
    assert summary["fit"] == "stream"
    scores = MODELS["tfidf_lr"].load(out / "tfidf_lr")(
        pd.DataFrame({"words": POS[:1], "text": ["房间很干净服务好"]})
    )
    assert scores.shape == (1, 2) and np.allclose(scores.sum(1), 1, atol=1e-5)


def test_a_split_larger_than_a_bucket_is_shuffled_on_disk_without_losing_a_row(tmp_path):
    from tasks.util.io import Rows, shuffled, write_parquet

    df = pd.DataFrame({"id": range(1000), "label": ["a"] * 500 + ["b"] * 500})
    write_parquet(df, tmp_path / "split.parquet", row_group_rows=100)
    small = shuffled(df, tmp_path / "s0", seed=3)
    # one bucket: a seeded permutation
    assert small["id"].tolist() == df.sample(frac=1.0, random_state=3)["id"].tolist()
    big = shuffled(Rows(tmp_path / "split.parquet"), tmp_path / "s1", seed=3, bucket_rows=150)
    order = big.frame()["id"].tolist()
    assert sorted(order) == list(range(1000)) and order != list(range(1000))
    # the buckets are gone
    assert sorted(p.name for p in (tmp_path / "s1").iterdir()) == ["shuffled.parquet"]
    # labels mixed from the start
    assert pd.Series(order[:100]).map(lambda i: i < 500).mean() == pytest.approx(0.5, abs=0.2)
    again = (
        shuffled(Rows(tmp_path / "split.parquet"), tmp_path / "s2", seed=3, bucket_rows=150)
        .frame()["id"]
        .tolist()
    )
    assert again == order


def test_two_gloo_processes_train_the_model_one_process_trains(tmp_path, monkeypatch):
    """train.processes=2 on CPU: two processes (torch.distributed, gloo) each take half of every
    batch; the averaged gradients make every step the one-process step, so weights and losses match
    one process. Forked, as on CPUs, and spawned with the model and its task pickled, as on GPUs (a
    forked process cannot use CUDA)."""
    from tasks.models import trainer

    common = {
        "epochs": 3,
        "patience": 3,
        "device": "cpu",
        "precision": "fp32",
        "textcnn": {"num_filters": 8, "batch_size": 16, "lr": 0.01, "dropout": 0.0},
    }
    got = {}
    for run, processes in (("one", 1), ("fork", 2), ("spawn", 2)):
        out = tmp_path / run
        out.mkdir()
        monkeypatch.setattr(
            trainer, "start_method", lambda cuda, how=run: "spawn" if how == "spawn" else "fork"
        )
        summary, _ = train_model(
            "textcnn",
            frame(10),
            frame(2),
            TrainConfig(**common, processes=processes),
            out,
            tiny_vectors(),
        )
        got[run] = (
            summary,
            torch.load(out / "textcnn" / "model.pt", weights_only=True)["state_dict"],
        )
    one, w1 = got["one"]
    # it learned
    assert (
        "processes" not in one
        and one["history"][-1]["train_loss"] < one["history"][0]["train_loss"]
    )
    for run in ("fork", "spawn"):
        two, w2 = got[run]
        assert two.get("processes") == 2 and two.get("backend") == "gloo", run
        assert [h["train_loss"] for h in two["history"]] == pytest.approx(
            [h["train_loss"] for h in one["history"]], rel=1e-5
        ), run
        assert [h["val_macro_f1"] for h in two["history"]] == [
            h["val_macro_f1"] for h in one["history"]
        ], run
        for name, weight in w1.items():
            assert torch.allclose(weight, w2[name], atol=1e-5), (run, name)


def test_the_gpu_processes_are_spawned_and_the_cpu_processes_forked():
    from tasks.models import trainer

    assert trainer.start_method(cuda=True) == "spawn" and trainer.start_method(cuda=False) == "fork"
