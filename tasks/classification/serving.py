"""Serving a classifier (task classification): raw text in, cleaned and segmented as the pipeline
did, its `label`, `probability`, one `p_<label>` column per class and `status` out; and a served
classifier's outcomes on a test split (true and predicted labels) for the champion rule. What each
name is: tasks/serving.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks.serving import EXAMPLE_ZH, Shown, checked, limits, segmenter_of


def settings(config, labels: list[str]) -> dict:
    return {
        "labels": labels,
        "clean": config.section("clean").model_dump(mode="json"),
        "segment": config.section("segment").segmenter().model_dump(mode="json"),
    }


def example(model: Path) -> list[str]:
    return list(EXAMPLE_ZH)


class Served:
    """A text that is missing, empty or too short after cleaning gets no label; a text over the
    length limit is cut."""

    def __init__(self, config: dict, model: Path):
        from tasks.classification.clean import Params
        from tasks.classification.models import loader

        self.labels = config["labels"]
        self.clean = Params(**config["clean"])
        self.max_rows, self.max_chars = limits(config, self.clean.max_chars)
        self.segmenter = segmenter_of(config)
        self.predictor = loader(config["model"], model)

    def screen(self, values: list[Any]) -> tuple[list[str], list[str]]:
        """(cleaned texts, status per text): the length limit is applied before cleaning and
        segmenting."""
        from tasks.shared.normalise import clean_text

        texts, statuses = [], []
        for value in values:
            if value is None:
                texts.append("")
                statuses.append("missing")
                continue
            text = clean_text(value[: self.max_chars], self.clean)
            texts.append(text)
            statuses.append(
                "empty"
                if not text
                else "too_short"
                if len(text) < self.clean.min_chars
                else "truncated"
                if len(value) > self.max_chars
                else "ok"
            )
        return texts, statuses

    def __call__(self, values: list[Any]) -> pd.DataFrame:
        texts, statuses = self.screen(checked(values, self.max_rows))
        usable = [i for i, s in enumerate(statuses) if s in ("ok", "truncated")]
        probs = np.full((len(texts), len(self.labels)), np.nan, dtype=np.float32)
        if usable:
            picked = [texts[i] for i in usable]
            probs[usable] = self.predictor(
                pd.DataFrame({"text": picked, **self.segmenter.rows(picked)})
            )
        labelled = set(usable)
        labels = [
            self.labels[int(row.argmax())] if i in labelled else None for i, row in enumerate(probs)
        ]
        out = pd.DataFrame(
            {
                "label": pd.Series(labels, dtype="string"),
                "probability": probs.max(1, initial=-np.inf) if len(probs) else [],
            }
        )
        out.loc[out["label"].isna(), "probability"] = np.nan
        for i, label in enumerate(self.labels):
            out[f"p_{label}"] = probs[:, i]
        out["status"] = statuses
        return out


def answering(served: Served, predict: Callable) -> Callable:
    """`api.load_model`'s classifier: raw texts (a list, a Series, a frame's `text`, one string)
    answered as a served model answers them; a frame already segmented (`words`) answered with its
    class probabilities, as the train stage scores it."""

    def answer(data):
        if isinstance(data, pd.DataFrame) and "words" in data:
            return predict(data)
        texts = (
            data["text"]
            if isinstance(data, pd.DataFrame)
            else [data]
            if isinstance(data, str)
            else data
        )
        return served([None if v is None else str(v) for v in list(texts)])

    return answer


def outcomes(
    served: Served, ask: Callable[[list[str]], pd.DataFrame], test: pd.DataFrame, metric: str
):
    """The true and predicted labels per row; slices: the true class and the length bucket."""
    from tasks.util.paired import Outcomes, length_buckets

    texts = test["text"].astype(str).tolist()
    truth = test["label"].astype(str).to_numpy()
    predicted = ask(texts)["label"].fillna("").astype(str).to_numpy()
    return Outcomes(
        "labels",
        metric,
        {"truth": truth, "predicted": predicted},
        {"class": truth, "length": length_buckets(texts)},
    )


SHOWN = Shown(
    "label",
    ("label", "probability"),
    found=lambda out: f"labels: {out['label'].value_counts().to_dict()}",
)
