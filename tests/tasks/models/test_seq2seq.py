"""The translators' networks and decoding on tiny models built here: attention is a distribution
over real source tokens, padding changes nothing, greedy search is beam search at beam 1, a
translator learns a tiny corpus, and a training killed after a checkpoint resumes to the same
weights."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tasks.classification.vocab import Params as VocabParams
from tasks.models import TrainInputs
from tasks.stages import MODELS
from tasks.translation.seq2seq_nets import (
    GRUSeq2Seq,
    Seq2SeqConfig,
    TransformerMT,
    TransformerMTConfig,
    beam_search,
    greedy,
)
from tasks.translation.text import en_text, en_tokens
from tasks.translation.train import params as _train_params
from tasks.util.text import build_vocab

TrainParams = _train_params()

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "mt" / "pairs.tsv"


def networks():
    torch.manual_seed(0)
    return {
        "gru": GRUSeq2Seq(Seq2SeqConfig(30, 32, 16, 32, 1, 0.0, attention=False)),
        "attention": GRUSeq2Seq(Seq2SeqConfig(30, 32, 16, 32, 2, 0.0, attention=True)),
        "transformer": TransformerMT(TransformerMTConfig(30, 32, 32, 4, 2, 2, 64, 0.0)),
    }


SRC = torch.tensor([[4, 5, 6, 7, 0, 0], [8, 9, 10, 11, 12, 13], [14, 0, 0, 0, 0, 0]])
TGT = torch.tensor([[2, 5, 6, 0], [2, 7, 8, 9], [2, 4, 0, 0]])


@pytest.mark.parametrize("name", ["attention", "transformer"])
def test_attention_weights_are_a_distribution_over_the_real_source_tokens(name):
    model = networks()[name].eval()
    if hasattr(model, "record_attention"):
        model.record_attention(True)
    rows, maps = greedy(model, SRC, 2, 3, 8, attention=True)
    for i, weights in enumerate(maps):
        # a step per token and EOS; padding cut away
        assert weights.shape == (
            min(len(rows[i]) + 1, 8),
            int((SRC[i] != 0).sum()),
        )
        assert np.allclose(weights.sum(1), 1.0, atol=1e-5)
    if name == "attention":  # padding gets exactly no weight inside the model
        memory = model.encode(SRC)
        hidden, keys = model._start(memory)
        _, weights = model.attention(hidden[-1], keys, memory.states, memory.mask)
        assert torch.all(weights[SRC == 0] == 0) and torch.allclose(weights.sum(1), torch.ones(3))


@pytest.mark.parametrize("name", ["gru", "attention", "transformer"])
def test_padding_is_masked_on_both_sides(name):
    model = networks()[name].eval()
    with torch.no_grad():
        base = model(SRC, TGT)
        more_src = model(torch.cat([SRC, torch.zeros(3, 4, dtype=torch.long)], 1), TGT)
        more_tgt = model(SRC, torch.cat([TGT, torch.zeros(3, 2, dtype=torch.long)], 1))
    assert torch.allclose(base, more_src, atol=1e-5)
    assert torch.allclose(base, more_tgt[:, : TGT.size(1)], atol=1e-5)


@pytest.mark.parametrize("name", ["gru", "attention", "transformer"])
def test_greedy_and_beam_search_agree_at_beam_one(name):
    model = networks()[name].eval()
    with torch.no_grad():
        rows, _ = greedy(model, SRC, 2, 3, 12)
        assert beam_search(model, SRC, 2, 3, 12, beam=1) == rows
        wide = beam_search(model, SRC, 2, 3, 12, beam=4)
    # no BOS/EOS in the answer
    assert len(wide) == 3 and all(3 not in r and 2 not in r for r in wide)


def test_beam_search_finds_a_likelier_sentence_than_greedy():
    """On a model whose first step prefers a dead end, beam 2 finds the better whole sentence."""

    class Toy(torch.nn.Module):
        def encode(self, src):
            from tasks.translation.seq2seq_nets import Memory

            return Memory(
                torch.zeros(src.size(0), 1, 1),
                torch.ones(src.size(0), 1, dtype=torch.bool),
                torch.zeros(src.size(0), 1),
            )

        def step(self, memory, prefix, cache):
            table = {
                (): [0.0, 0.0, 0.0, 0.0, 0.55, 0.45],
                (4,): [0, 0, 0, 0.5, 0, 0.5],
                (5,): [0, 0, 0, 0.95, 0.05, 0],
            }
            rows = [table.get(tuple(r[1:]), [0, 0, 0, 1.0, 0, 0]) for r in prefix.tolist()]
            return torch.log(torch.tensor(rows) + 1e-12), None, None

        @staticmethod
        def reorder(cache, rows):
            return None

    src = torch.ones(1, 1, dtype=torch.long)
    assert greedy(Toy(), src, 2, 3, 3)[0] == [[4]] and beam_search(
        Toy(), src, 2, 3, 3, beam=2, length_penalty=0
    ) == [[5]]


def test_english_tokens_join_back_into_the_text():
    for text in ["I'm fine.", 'Tom said, "Hi!" to 3 people.', "Don't—stop"]:
        assert en_text(en_tokens(text)) == text


def tiny_inputs(tmp_path, name, pairs=60, common: dict | None = None, **section):
    """A translator's inputs on the first `pairs` fixture pairs (validation = train), its section
    `section` and the shared settings `common` (benchmarks/gpu_check.py trains them on a GPU)."""
    lines = [ln.split("\t") for ln in FIXTURE.read_text(encoding="utf-8").splitlines()[:pairs]]
    frame = pd.DataFrame({"en": [a for a, b, *_ in lines], "text": [b for a, b, *_ in lines]})
    frame["chars"] = [" ".join(t) for t in frame["text"]]
    frame["words"] = frame["chars"]
    vocab = tmp_path / "vocab"
    for lang, rows in (
        ("zh", [t.split() for t in frame["chars"]]),
        ("en", [en_tokens(t) for t in frame["en"]]),
    ):
        (vocab / lang).mkdir(parents=True)
        itos = build_vocab(Counter(t for r in rows for t in r), VocabParams(min_freq=1))
        (vocab / lang / "vocab.txt").write_text("".join(f"{t}\n" for t in itos), encoding="utf-8")
    (vocab / "vocab.json").write_text(json.dumps({"zh_tokens": "chars"}))
    params = TrainParams(**{"direction": "zh-en", name: section, "patience": 100, **(common or {})})
    out = tmp_path / "out"
    out.mkdir()
    return TrainInputs(
        name, frame, frame, [], MODELS[name].view(params), vocab, None, out, tmp_path / "scratch"
    ), frame


@pytest.mark.parametrize(
    "name,section",
    [
        (
            "seq2seq_attention",
            {
                "epochs": 40,
                "embed_dim": 32,
                "hidden_size": 64,
                "lr": 5e-3,
                "dropout": 0.0,
                "label_smoothing": 0.0,
                "beam_size": 2,
            },
        ),
        (
            "transformer_mt",
            {
                "epochs": 40,
                "d_model": 64,
                "num_heads": 2,
                "num_encoder_layers": 1,
                "num_decoder_layers": 1,
                "ff_dim": 128,
                "lr": 3e-3,
                "dropout": 0.0,
                "label_smoothing": 0.0,
                "beam_size": 2,
                "warmup_ratio": 0.05,
            },
        ),
    ],
)
def test_a_translator_learns_a_tiny_corpus_and_translates_raw_pairs(tmp_path, name, section):
    inputs, frame = tiny_inputs(tmp_path, name, pairs=40, train_batch_size=8, **section)
    summary = MODELS[name].train(inputs)
    # it memorised what it saw (validation = train here)
    assert summary["val_bleu"] > 60, summary["val_bleu"]
    translate = MODELS[name].load(tmp_path / "out" / name)
    answers = translate(frame.head(5))
    assert sum(a.text == ref for a, ref in zip(answers, frame["en"].head(5))) >= 3


def test_a_killed_training_resumes_to_the_same_weights(tmp_path, monkeypatch):
    from tasks.models import trainer

    section = {"epochs": 3, "embed_dim": 16, "hidden_size": 32, "train_batch_size": 8}
    straight, _ = tiny_inputs(tmp_path / "a", "seq2seq_attention", **section)
    MODELS["seq2seq_attention"].train(straight)
    killed, _ = tiny_inputs(tmp_path / "b", "seq2seq_attention", **section)
    plain = trainer._train_epoch

    def crash(
        *args,
        **kwargs,
        # (name, model, task, cfg, optimizer, scheduler, trainable, rng, device, dtype, epoch,
        # scaler)
    ):
        if args[10] == 2:
            raise KeyboardInterrupt("killed in epoch 2, after the checkpoint of epoch 1")
        return plain(*args, **kwargs)

    monkeypatch.setattr(trainer, "_train_epoch", crash)
    with pytest.raises(KeyboardInterrupt):
        MODELS["seq2seq_attention"].train(killed)
    monkeypatch.setattr(trainer, "_train_epoch", plain)
    assert (killed.scratch / "last.pt").is_file()
    resumed, _ = tiny_inputs(tmp_path / "c", "seq2seq_attention", **section)
    resumed.scratch = killed.scratch
    summary = MODELS["seq2seq_attention"].train(resumed)
    assert summary["resumed_from_epoch"] == 1
    a = torch.load(tmp_path / "a" / "out" / "seq2seq_attention" / "model.pt", weights_only=True)[
        "state_dict"
    ]
    b = torch.load(tmp_path / "c" / "out" / "seq2seq_attention" / "model.pt", weights_only=True)[
        "state_dict"
    ]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["gru", "attention", "transformer"])
def test_teacher_forcing_gives_the_logits_of_decoding_step_by_step(name):
    """Training's forward pass (all target positions at once where it can) and decoding agree: the
    causal mask hides later target tokens, and the no-attention decoder's one GRU call equals its
    steps."""
    model = networks()[name].eval()
    with torch.no_grad():
        logits = torch.log_softmax(model(SRC, TGT), dim=-1)
        memory, cache = model.encode(SRC), None
        for t in range(TGT.size(1)):
            logp, cache, _ = model.step(memory, TGT[:, : t + 1], cache)
            assert torch.allclose(logp, logits[:, t], atol=1e-4), t
