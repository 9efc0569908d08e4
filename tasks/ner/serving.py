"""Serving a tagger (task ner): raw text in; per text `entities` (a JSON list of {text, type, start,
end, score}; offsets in characters of the text as given, `end` exclusive), `count` and `status` out.
Each character is cleaned as the pipeline cleaned it (NFKC per character, control characters
removed), so offsets never shift. A served tagger's outcomes on a test split are each sentence's
strict entity counts. What each name is: tasks/serving.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks.serving import Shown, checked, limits, status


def settings(config, labels: list[str]) -> dict:
    return {"labels": labels, "clean": config.section("clean").model_dump(mode="json")}


def example(model: Path) -> list[str]:
    return ["张伟，男，1965年出生，北京大学硕士，现任中国银行行长。", "无"]


class Served:
    def __init__(self, config: dict, model: Path):
        from tasks.ner.clean import Params
        from tasks.ner.models import MODELS

        self.clean = Params(
            **{k: v for k, v in config["clean"].items() if k in Params.model_fields}
        )
        self.max_rows, self.max_chars = limits(config, self.clean.max_chars)
        self.tagger = MODELS[config["model"]].load(model)

    def __call__(self, values: list[Any]) -> pd.DataFrame:
        from tasks.ner.clean import clean_chars
        from tasks.ner.tagging import spans_of

        cleaned, where, statuses = [], [], []
        for value in checked(values, self.max_rows):
            text, index = clean_chars((value or "")[: self.max_chars], self.clean)
            cleaned.append(text)
            where.append(index)
            statuses.append(status(value, text, self.max_chars))
        entities = []
        for value, index, tagged in zip(values, where, self.tagger(cleaned)):
            entities.append(
                [
                    {
                        "text": value[index[s] : index[e - 1] + 1],
                        "type": kind,
                        "start": index[s],
                        "end": index[e - 1] + 1,
                        "score": round(float(np.mean(tagged.scores[s:e])), 4),
                    }
                    for kind, s, e in spans_of(tagged.tags)
                ]
            )
        return pd.DataFrame(
            {
                "entities": [json.dumps(e, ensure_ascii=False) for e in entities],
                "count": [len(e) for e in entities],
                "status": statuses,
            }
        )


def outcomes(
    served: Served, ask: Callable[[list[str]], pd.DataFrame], test: pd.DataFrame, metric: str
):
    """Each sentence's strict entity counts (tp, fp, fn), overall and per entity type; slices: the
    length bucket."""
    from tasks.ner.tagging import spans_of
    from tasks.util.paired import Outcomes, length_buckets

    texts = test["text"].astype(str).tolist()
    answers = ask(texts)
    per_type: dict[str, np.ndarray] = {}  # entity type -> each sentence's (tp, fp, fn) of that type
    for i, (tags, found) in enumerate(zip(test["tags"], answers["entities"])):
        gold = set(spans_of(list(tags)))
        got = {(e["type"], e["start"], e["end"]) for e in json.loads(found)}
        for kind in {s[0] for s in gold | got}:
            g, p = {s for s in gold if s[0] == kind}, {s for s in got if s[0] == kind}
            per_type.setdefault(kind, np.zeros((len(texts), 3), dtype=np.int64))[i] = (
                len(g & p),
                len(p - g),
                len(g - p),
            )
    counts = sum(per_type.values()) if per_type else np.zeros((len(texts), 3), dtype=np.int64)
    columns = {"tp": counts[:, 0], "fp": counts[:, 1], "fn": counts[:, 2]}
    columns |= {
        f"{k}:{kind}": c[:, j]
        for kind, c in per_type.items()
        for j, k in enumerate(("tp", "fp", "fn"))
    }
    return Outcomes("spans", metric, columns, {"length": length_buckets(texts)})


def entities_text(value: str) -> str:
    """A tagger's entities (JSON) as one readable cell: 张伟/NAME[0:2] 0.99; ..."""
    return "; ".join(
        f"{e['text']}/{e['type']}[{e['start']}:{e['end']}] {e['score']:.2f}"
        for e in json.loads(value or "[]")
    )


SHOWN = Shown(
    "entities",
    ("entities",),
    found=lambda out: f"entities: {int(out['count'].sum())}",
    nested=("entities",),
    cell=entities_text,
)
