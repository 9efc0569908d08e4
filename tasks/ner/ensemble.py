"""`ner_ensemble`: the listed taggers' per-character tag probabilities averaged, then the best
well-formed tag path over them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tasks.core import Section
from tasks.models.base import TrainInputs
from tasks.ner.tagged import Tagged, TaggerFn, averaged_decoder
from tasks.ner.tagging import tag_set


class EnsembleParams(Section):
    """The `train.ner_ensemble` section: the members' per-character tag probabilities averaged, then
    the best well-formed tag path over them (Viterbi over the log averages, within the tag scheme's
    transitions)."""

    # taggers of train.models, trained first
    members: list[str] = ["crf", "bilstm_crf", "lexicon_tagger"]
    weights: list[float] | None = None  # per member; None = equal


def train_ensemble(inputs: TrainInputs) -> dict:
    import shutil
    import time

    p: EnsembleParams = inputs.section
    if p.weights is not None and len(p.weights) != len(p.members):
        raise ValueError(
            f"train.{inputs.name}.weights: {len(p.weights)} weights for {len(p.members)} members"
        )
    t0 = time.perf_counter()
    folder = inputs.out / inputs.name
    for member in p.members:
        shutil.copytree(inputs.members[member], folder / "members" / member)
    (folder / "config.json").write_text(
        json.dumps(
            {
                "kind": "ensemble",
                "members": p.members,
                "weights": p.weights,
                "labels": inputs.labels,
            }
        ),
        encoding="utf-8",
    )
    return {
        "path": inputs.name,
        "kind": "ensemble",
        "seconds": time.perf_counter() - t0,
        "members": p.members,
    }


def ensemble_tagger(folder: Path, load: Callable[[Path], TaggerFn]) -> TaggerFn:
    """The members (each loaded by `load`) tagging together: their per-character tag probabilities,
    weighted and averaged, decoded into the best well-formed path."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    members = [load(folder / "members" / m) for m in config["members"]]
    weights = np.array(config["weights"] or [1.0] * len(members), dtype=np.float64)
    weights /= weights.sum()
    order = tag_set(config["labels"])
    decode_average = averaged_decoder(order)
    columns = [[m.tags.index(t) if t in m.tags else -1 for t in order] for m in members]

    def tag(texts: list[str]) -> list[Tagged]:
        tagged = [m(texts) for m in members]
        out = []
        for i, text in enumerate(texts):
            average = np.zeros((len(text), len(order)))
            for w, cols, result in zip(weights, columns, (t[i] for t in tagged)):
                for j, c in enumerate(cols):
                    if c >= 0 and len(text):
                        average[:, j] += w * result.marginals[:, c]
            out.append(decode_average(average))
        return out

    tag.tags = order
    return tag
