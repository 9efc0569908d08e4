"""Build tiny MarianMT translation models (random weights, SentencePiece tokenizers trained on
fixture text) in a folder, so the real transformers code path runs without a model hub."""

from __future__ import annotations

import json
from pathlib import Path

ZH = [
    "房间很干净，服务也很好。",
    "早餐太差了，不会再来。",
    "位置不错，交通方便。",
    "前台态度冷淡，等了很久。",
    "酒店设施比较旧，但是价格便宜。",
    "床很舒服，睡得很好。",
    "卫生间有异味，空调也坏了。",
    "总体来说还可以，性价比高。",
    "离地铁站很近，周边吃饭的地方很多。",
    "隔音效果很差，晚上很吵。",
]
EN = [
    "The room is clean and the service is good.",
    "Breakfast was terrible, I will not come again.",
    "Good location and convenient transport.",
    "The front desk was cold and we waited a long time.",
    "The hotel facilities are old but the price is cheap.",
    "The bed is comfortable and I slept well.",
    "The bathroom smells and the air conditioner is broken.",
    "Overall it is fine and good value for money.",
    "Very close to the subway station with many places to eat.",
    "The sound insulation is poor and it is noisy at night.",
]


def _spm(lines: list[str], prefix: Path, vocab_size: int) -> None:
    import sentencepiece as spm

    text = prefix.with_suffix(".txt")
    text.write_text("\n".join(lines * 5) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        character_coverage=1.0,
        model_type="unigram",
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        hard_vocab_limit=False,
        minloglevel=2,
    )


def build_tiny_marian(folder: Path, source: list[str], target: list[str], seed: int = 0) -> Path:
    """A MarianMT model translating `source`-like text to `target`-like text (badly: weights are
    random)."""
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    _spm(source, folder / "src", 120)
    _spm(target, folder / "tgt", 120)
    vocab = {"</s>": 0, "<unk>": 1, "<pad>": 2}
    for name in ("src", "tgt"):
        for line in (folder / f"{name}.vocab").read_text(encoding="utf-8").splitlines():
            vocab.setdefault(line.split("\t")[0], len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = MarianTokenizer(
        str(folder / "src.model"), str(folder / "tgt.model"), str(folder / "vocab.json")
    )
    torch.manual_seed(seed)
    config = MarianConfig(
        vocab_size=len(vocab),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=128,
        pad_token_id=2,
        eos_token_id=0,
        decoder_start_token_id=2,
        forced_eos_token_id=0,
    )
    model = MarianMTModel(config)
    out = folder / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_pair(root: Path) -> tuple[Path, Path]:
    """zh->en and en->zh tiny models."""
    return build_tiny_marian(root / "zh-en", ZH, EN, 0), build_tiny_marian(
        root / "en-zh", EN, ZH, 1
    )
