"""Serving a translator (task translation): raw text of the source language in, cleaned as the
pipeline cleaned that side (and segmented, for a Chinese source); `translation` and `status` per
text out. A served translator's outcomes on a test split are each sentence's BLEU statistics
(sacrebleu). What each name is: tasks/serving.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks.serving import Shown, checked, limits, segmenter_of, status


def settings(config, labels: list[str]) -> dict:
    return {
        "clean": config.section("clean").model_dump(mode="json"),
        "segment": config.section("segment").segmenter().model_dump(mode="json"),
    }


def example(model: Path) -> list[str]:
    import torch

    direction = torch.load(model / "model.pt", map_location="cpu", weights_only=True)["direction"]
    return (
        ["我们明天去北京。", "你好。"]
        if direction.startswith("zh")
        else ["We are going to Beijing tomorrow.", "Hello."]
    )


class Served:
    def __init__(self, config: dict, model: Path):
        from tasks.translation.clean import Params
        from tasks.translation.models import MODELS

        self.translator = MODELS[config["model"]].load(model)
        self.direction = self.translator.direction
        clean = Params(**{k: v for k, v in config["clean"].items() if k in Params.model_fields})
        # the English side is never converted to simplified characters
        zh = self.direction.startswith("zh")
        self.clean = clean if zh else clean.model_copy(update={"traditional_to_simplified": False})
        self.max_rows, self.max_chars = limits(config, 5_000)
        self.max_chars = min(self.max_chars, self.clean.max_chars)
        self.segmenter = segmenter_of(config) if zh else None

    def __call__(self, values: list[Any]) -> pd.DataFrame:
        from tasks.shared.normalise import clean_text

        texts, statuses = [], []
        for value in checked(values, self.max_rows):
            texts.append(clean_text((value or "")[: self.max_chars], self.clean))
            statuses.append(status(value, texts[-1], self.max_chars))
        usable = [i for i, t in enumerate(texts) if t]
        out: list[str | None] = [None] * len(texts)
        if usable:
            picked = [texts[i] for i in usable]
            frame = (
                pd.DataFrame({"text": picked, **self.segmenter.rows(picked)})
                if self.segmenter
                else pd.DataFrame({"en": picked})
            )
            for i, t in zip(usable, self.translator(frame)):
                out[i] = t.text
        return pd.DataFrame({"translation": pd.Series(out, dtype="string"), "status": statuses})


def outcomes(
    served: Served, ask: Callable[[list[str]], pd.DataFrame], test: pd.DataFrame, metric: str
):
    """Each sentence's sacrebleu statistics against its reference; slices: the source's length
    bucket."""
    from sacrebleu.metrics import BLEU

    from tasks.translation.text import sides
    from tasks.util.paired import Outcomes, length_buckets

    source, target = sides(served.direction)
    texts = test["text" if source == "zh" else "en"].astype(str).tolist()
    hypotheses = ask(texts)["translation"].fillna("").astype(str).tolist()
    refs = test["text" if target == "zh" else "en"].astype(str).tolist()
    tokenize = "zh" if target == "zh" else "13a"
    stats = np.array(
        BLEU(tokenize=tokenize)._extract_corpus_statistics(hypotheses, [refs]), dtype=np.int64
    )
    return Outcomes(
        "bleu", metric, {"stats": stats}, {"length": length_buckets(texts)}, tokenize=tokenize
    )


SHOWN = Shown(
    "translation",
    ("translation",),
    found=lambda out: f"translations: {int(out['translation'].notna().sum())}",
)
