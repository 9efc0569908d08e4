import numpy as np
import pandas as pd
import pytest
import torch

from tasks.classification.models.bert import (
    bert_predictor,
    char_tokenizer,
    encode_chars,
    lexicon_word_ids,
    train_bert,
)
from tasks.classification.train import params as _train_params
from tasks.classification.vocab import Params as VocabConfig
from tasks.classification.vocab import count_tokens
from tasks.errors import ConfigError
from tasks.models import TrainInputs
from tasks.util.hub import ModelMissingError
from tasks.util.text import build_vocab
from tasks.util.vectors import keyed_word_vectors
from tests.tasks.models.test_train import frame

TrainConfig = _train_params()

TINY = {
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 64,
    "batch_size": 16,
    "lr": 3e-3,
    "max_len": 32,
}


@pytest.fixture
def corpus(tmp_path):
    """Train/validation frames and the vocab and embed stages' files for them."""
    from gensim.models import KeyedVectors

    train, validation = frame().assign(aug_method="original"), frame(2)
    for kind in ("words", "chars"):
        vocab = build_vocab(count_tokens(train[kind]), VocabConfig(min_freq=1))
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "vocab.txt").write_text(
            "".join(f"{t}\n" for t in vocab), encoding="utf-8"
        )
    kv = KeyedVectors(vector_size=16)
    kv.add_vectors(
        ["房间", "干净", "服务", "热情", "态度"],
        np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32),
    )
    return train, validation, tmp_path, keyed_word_vectors(kv)


def run_bert(corpus, class_weights=False, **section):
    train, validation, d, vectors = corpus
    params = TrainConfig(
        epochs=10, patience=10, class_weights=class_weights, bert={**TINY, **section}
    )
    return train_bert(
        TrainInputs("bert", train, validation, ["0", "1"], params, d, vectors, d, d / "ckpt")
    )


def test_lexicon_words_cover_their_characters():
    lexicon = {"房间": 1, "干净": 2, "很干净": 3}
    ids = lexicon_word_ids(pd.Series(["房 间 很 干 净"]), lexicon, max_len=32, per_char=4)[0]
    assert ids.shape == (7, 4)  # [CLS] 5 characters [SEP]
    assert ids[0].sum() == 0 and ids[-1].sum() == 0
    assert ids[1].tolist() == [1, 0, 0, 0] and ids[3].tolist() == [3, 0, 0, 0]  # 很 only in 很干净
    assert ids[4].tolist() == [3, 2, 0, 0]  # 干: the longer word first


def test_char_tokenizer_gives_one_id_per_character(corpus):
    tokenizer = char_tokenizer(corpus[2] / "chars" / "vocab.txt")
    ids = encode_chars(tokenizer, pd.Series(["房 间 很 干 净", "x y"]), 32)
    assert (
        len(ids[0]) == 7
        and ids[0][0] == tokenizer.cls_token_id
        and ids[0][-1] == tokenizer.sep_token_id
    )
    assert ids[1][1:3] == [tokenizer.unk_token_id] * 2


def test_bert_pretrains_fine_tunes_and_round_trips_with_word_adapter(corpus):
    summary = run_bert(corpus, pretrain_epochs=2, word_adapter=True, adapter_layer=0)
    pre = summary["pretrain_history"]
    assert len(pre) == 2 and pre[-1]["train_loss"] < pre[0]["train_loss"]
    assert summary["history"][-1]["train_loss"] < summary["history"][0]["train_loss"] * 0.5
    validation = corpus[1]
    probs = bert_predictor(corpus[2] / "bert")(validation)
    assert np.array_equal(probs, bert_predictor(corpus[2] / "bert")(validation))
    assert (probs.argmax(1) == validation["label"].astype(int)).mean() == 1.0
    assert (corpus[2] / "bert" / "adapter.pt").is_file()


def test_word_adapter_uses_the_words(corpus):
    from tasks.classification.models.bert import load_bert

    run_bert(corpus, pretrain_epochs=0, word_adapter=True, adapter_layer=0)
    model, tokenizer, meta, lexicon = load_bert(corpus[2] / "bert", "cpu")
    chars = pd.Series(["房 间 很 干 净"])
    ids = torch.tensor(encode_chars(tokenizer, chars, 32))
    words = torch.from_numpy(
        lexicon_word_ids(chars, lexicon, 32, meta["max_words_per_char"])[0]
    ).unsqueeze(0)
    with torch.no_grad():
        with_words = model(ids, word_ids=words)[0]
        without = model(ids, word_ids=torch.zeros_like(words))[0]
    assert words.count_nonzero() > 0 and not torch.allclose(with_words, without)
    with pytest.raises(ValueError, match="word_ids are required"):
        model(ids)


def test_bert_from_a_local_checkpoint_folder(corpus, tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    folder = tmp_path / "tiny-bert"
    tokenizer = char_tokenizer(corpus[2] / "chars" / "vocab.txt")
    BertForSequenceClassification(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    summary = run_bert(corpus, class_weights=True, checkpoint=str(folder))
    assert "pretrain_history" not in summary and summary["parameters"] < 200_000
    assert summary["history"][-1]["val_accuracy"] == 1.0
    with pytest.raises(
        ConfigError, match=r"train.bert: adapter_layer must be below the last encoder layer \(0"
    ):
        # a 1-layer checkpoint
        run_bert(corpus, checkpoint=str(folder), word_adapter=True, adapter_layer=0)


def test_missing_checkpoint_is_one_clear_error(corpus, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        ModelMissingError,
        match=r"BERT tokenizer 'no-such/bert' not found locally.*huggingface-cli download "
        r"no-such/bert",
    ):
        run_bert(corpus, checkpoint="no-such/bert")


def test_sentence_pairs_hold_true_and_random_next_clauses():
    from tasks.classification.models.pretraining import clauses, encode_pairs, sentence_pairs

    texts = pd.Series(
        ["房 间 很 干 净 ， 服 务 很 好 。 早 餐 一 般", "位 置 方 便", "太 吵 了 ！ 不 会 再 来"]
    )
    assert clauses(texts[1]) == [["位", "置"], ["方", "便"]]  # one clause: cut in halves
    pairs = sentence_pairs(texts, seed=0)
    assert len(pairs) == 4 and {label for *_, label in pairs} <= {0, 1}
    for a, b, label in pairs:
        if label == 0:
            assert any(" ".join(a + b) in t for t in texts)
    tokenizer = char_tokenizer_for(texts)
    (row,) = encode_pairs(tokenizer, [(list("房间很干净"), list("服务很好"), 0)], max_len=8)
    assert len(row["input_ids"]) == 8 and row["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]


def char_tokenizer_for(texts: pd.Series):
    from transformers import BertTokenizer

    chars = sorted({c for t in texts for c in t.split()})
    return BertTokenizer(
        vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars])},
        do_lower_case=False,
    )


def test_bert_pretrains_with_next_sentence_prediction(corpus):
    summary = run_bert(corpus, pretrain_epochs=2, nsp=True)
    history = summary["pretrain_history"]
    assert len(history) == 2 and {"val_mlm_loss", "val_nsp_loss", "val_nsp_accuracy"} <= set(
        history[-1]
    )
    # the classifier fine-tunes from the MLM + NSP encoder
    assert summary["history"][-1]["val_accuracy"] >= 0.5


def tiny_hf_checkpoint(tmp_path, dropout=0.1):
    """Train and validation frames with a `text` column, and a tiny random BERT with a fast
    tokenizer built here."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    def texts(df):
        return df.assign(text=df["words"].str.replace(" ", ""))

    train, validation = texts(frame().assign(aug_method="original")), texts(frame(2))
    chars = sorted({c for t in pd.concat([train["text"], validation["text"]]) for c in t})
    ckpt = tmp_path / "tiny"
    ckpt.mkdir()
    tokenizer = BertTokenizerFast(
        vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars])}
    )
    assert tokenizer.unk_token_id not in tokenizer(train["text"][0])["input_ids"]
    BertForSequenceClassification(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
    ).save_pretrained(ckpt)
    tokenizer.save_pretrained(ckpt)
    return train, validation, ckpt


def test_hf_trains_data_parallel_as_one_process_does(tmp_path):
    """train.processes=2 for a pretrained checkpoint: two gloo processes give one process's losses
    and weights."""
    from safetensors.torch import load_file

    from tasks.classification.models.hf import train_hf

    train, validation, ckpt = tiny_hf_checkpoint(tmp_path, dropout=0.0)
    got = {}
    for processes in (1, 2):
        params = TrainConfig(
            processes=processes,
            device="cpu",
            precision="fp32",
            hf={
                "checkpoint": str(ckpt),
                "epochs": 2,
                "patience": 2,
                "lr": 1e-3,
                "batch_size": 8,
                "warmup_ratio": 0.0,
            },
        )
        out = tmp_path / f"p{processes}"
        summary = train_hf(
            TrainInputs(
                "hf",
                train,
                validation,
                ["0", "1"],
                params,
                tmp_path,
                None,
                out,
                tmp_path / f"ckpt{processes}",
            )
        )
        got[processes] = (summary, load_file(out / "hf" / "model.safetensors"))
    (one, w1), (two, w2) = got[1], got[2]
    assert two.get("processes") == 2 and two.get("backend") == "gloo" and "processes" not in one
    assert [h["train_loss"] for h in two["history"]] == pytest.approx(
        [h["train_loss"] for h in one["history"]], rel=1e-4
    )
    for name, weight in w1.items():
        assert torch.allclose(weight, w2[name], atol=1e-4), name


def test_hf_fine_tunes_a_local_checkpoint_and_saves_what_auto_classes_load(tmp_path):
    """The pretrained-transformer path end to end on a tiny random BERT and a fast tokenizer built
    here."""
    from transformers import AutoModelForSequenceClassification

    from tasks.classification.models.hf import hf_predictor, train_hf

    train, validation, ckpt = tiny_hf_checkpoint(tmp_path)
    params = TrainConfig(
        hf={
            "checkpoint": str(ckpt),
            "epochs": 8,
            "patience": 8,
            "lr": 1e-3,
            "batch_size": 8,
            "warmup_ratio": 0.0,
        }
    )
    summary = train_hf(
        TrainInputs(
            "hf", train, validation, ["0", "1"], params, tmp_path, None, tmp_path, tmp_path / "ckpt"
        )
    )
    assert (
        summary["history"][-1]["train_loss"] < summary["history"][0]["train_loss"]
        and summary["precision"] == "fp32"
    )
    assert summary["history"][summary["best_epoch"] - 1]["val_accuracy"] >= 0.75
    loaded = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "hf", local_files_only=True
    )
    assert loaded.config.id2label == {0: "0", 1: "1"}
    probs = hf_predictor(tmp_path / "hf", "cpu")(validation)
    assert probs.shape == (len(validation), 2) and np.allclose(probs.sum(1), 1, atol=1e-5)
    frozen = TrainConfig(
        hf={
            "checkpoint": str(ckpt),
            "epochs": 1,
            "freeze_encoder": True,
            "gradient_checkpointing": True,
        }
    )
    out = tmp_path / "frozen"
    summary = train_hf(
        TrainInputs(
            "hf", train, validation, ["0", "1"], frozen, tmp_path, None, out, tmp_path / "ckpt2"
        )
    )
    assert summary["trainable_parameters"] < summary["parameters"] / 10  # the head only


def test_hf_without_its_checkpoint_is_one_clear_error(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from tasks.classification.models.hf import train_hf

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    params = TrainConfig(hf={"checkpoint": "no-such/chinese-bert"})
    with pytest.raises(
        ModelMissingError,
        match=r"tokenizer 'no-such/chinese-bert' not found locally.*huggingface-cli download "
        r"no-such/chinese-bert",
    ):
        train_hf(
            TrainInputs(
                "hf",
                frame(),
                frame(2),
                ["0", "1"],
                params,
                tmp_path,
                None,
                tmp_path,
                tmp_path / "ckpt",
            )
        )
