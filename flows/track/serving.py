"""A trained classifier (or tagger) as an MLflow pyfunc that takes raw Chinese text: it cleans, segments and encodes the
texts the way the pipeline did (clean and segment parameters, user dictionary and stopwords travel with
the model; the vocabulary is in the model folder) and returns the label and the class probabilities.

    mlflow.pyfunc.load_model("models:/zhpipe-chnsenticorp@champion").predict(["房间很干净"])
    mlflow models serve -m models:/zhpipe-chnsenticorp@champion --env-manager local
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

CODE = Path(__file__).resolve().parents[2]  # the folder holding the flows and tasks packages

# the stages a served model replays on raw text, by name: their settings are its zhpipe.json's sections of these names
CLEANING, SEGMENTING = "clean", "segment"


def bad_request(message: str) -> Exception:
    """An input error: MLflow's scoring server answers it with HTTP 400 and the message."""
    from mlflow.exceptions import MlflowException

    return MlflowException.invalid_parameter_value(f"zhpipe: {message}")


def as_texts(model_input: Any) -> list[Any]:
    """Texts from what pyfunc callers send: a list, a Series, a NumPy array, a single string, or a DataFrame with
    a `text` column (or one unnamed column, as MLflow's server builds from `{"inputs": [...]}`). Missing
    values stay missing (None), never the string "None" or "nan"."""
    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, pd.DataFrame):
        if "text" in model_input:
            column = "text"
        elif len(model_input.columns) == 1 and not isinstance(model_input.columns[0], str):
            column = model_input.columns[0]
        else:
            raise bad_request(f"the input has no 'text' column (columns: {', '.join(map(str, model_input.columns))})")
        values = model_input[column].tolist()
    elif isinstance(model_input, (pd.Series, np.ndarray)):
        values = np.asarray(model_input, dtype=object).ravel().tolist()
    elif isinstance(model_input, (list, tuple)):
        values = list(model_input)
    else:
        raise bad_request(f"expected texts (a list of strings or a frame with a 'text' column), got {type(model_input).__name__}")
    return [None if v is None or (isinstance(v, float) and v != v) or v is pd.NA else v for v in values]


def read_config(context) -> dict:
    """A logged model's zhpipe.json, its segmenter's files (user dictionary, stopwords) pointed at the artifacts."""
    cfg = json.loads(Path(context.artifacts["config"]).read_text(encoding="utf-8"))
    segment = cfg.get(SEGMENTING) or {}
    for key in ("user_dict", "stopwords"):  # files travel as artifacts
        if segment.get(key):
            segment[key] = context.artifacts[key]
    return cfg


def segment_artifacts(segment: dict, tmp: Path) -> dict[str, str]:
    """The segmenter's files (user dictionary, stopwords) copied to travel with a logged model."""
    from flows.plan.project import current

    artifacts = {}
    for key in ("user_dict", "stopwords"):
        if segment.get(key):
            path = Path(segment[key]) if Path(segment[key]).is_absolute() else current().root / segment[key]
            artifacts[key] = str(shutil.copy(path, tmp / f"{key}{path.suffix}"))
    return artifacts


class TextClassifier(PythonModel):
    """Raw text in; `label`, `probability`, one `p_<label>` column per class and `status` out. A text that
    is missing, empty or too short after cleaning gets no label; a text over the length limit is cut."""

    def load_context(self, context) -> None:
        from tasks.classification.clean import Params as CleanParams
        from tasks.models import MODELS
        from tasks.segmenter import Segmenter, SegmenterParams

        cfg = read_config(context)
        segment = cfg[SEGMENTING]
        self.labels = cfg["labels"]
        self.clean = CleanParams(**cfg[CLEANING])
        limits = cfg.get("predict") or {}
        self.max_rows, self.max_chars = limits.get("max_rows", 10_000), limits.get("max_chars", self.clean.max_chars)
        self.segmenter = Segmenter(SegmenterParams(**{k: v for k, v in segment.items() if k in SegmenterParams.model_fields}))
        self.predictor = MODELS[cfg["model"]].predictor(Path(context.artifacts["model"]))

    def screen(self, values: list[Any]) -> tuple[list[str], list[str]]:
        """(cleaned texts, status per text): the length limit is applied before cleaning and segmenting."""
        from tasks.normalise import clean_text

        texts, statuses = [], []
        for value in values:
            if value is None:
                texts.append("")
                statuses.append("missing")
                continue
            if not isinstance(value, str):
                raise bad_request(f"text {len(texts) + 1} is a {type(value).__name__}, not a string")
            status = "truncated" if len(value) > self.max_chars else "ok"
            text = clean_text(value[: self.max_chars], self.clean)
            if not text:
                status = "empty"
            elif len(text) < self.clean.min_chars:
                status = "too_short"
            texts.append(text)
            statuses.append(status)
        return texts, statuses

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        values = as_texts(model_input)
        if len(values) > self.max_rows:
            raise bad_request(f"{len(values)} texts in one call; at most {self.max_rows} (predict.max_rows)")
        texts, statuses = self.screen(values)
        usable = [i for i, s in enumerate(statuses) if s in ("ok", "truncated")]
        probs = np.full((len(texts), len(self.labels)), np.nan, dtype=np.float32)
        if usable:
            picked = [texts[i] for i in usable]
            probs[usable] = self.predictor(pd.DataFrame({"text": picked, **self.segmenter.rows(picked)}))
        labelled = set(usable)
        labels = [self.labels[int(row.argmax())] if i in labelled else None for i, row in enumerate(probs)]
        out = pd.DataFrame({"label": pd.Series(labels, dtype="string"), "probability": probs.max(1, initial=-np.inf) if len(probs) else []})
        out.loc[out["label"].isna(), "probability"] = np.nan
        for i, label in enumerate(self.labels):
            out[f"p_{label}"] = probs[:, i]
        out["status"] = statuses
        return out


def log_classifier(run_id: str, model: str, folder: Path, labels: list[str], clean: dict, segment: dict,
                   predict: dict | None = None, registered_name: str | None = None):
    """Log `folder` (a trained classifier) as a TextClassifier pyfunc in run `run_id`; register it under
    `registered_name` when given. Returns MLflow's ModelInfo."""

    with tempfile.TemporaryDirectory() as tmp:
        artifacts = {"model": str(folder), **segment_artifacts(segment, Path(tmp))}
        config = {"model": model, "labels": labels, CLEANING: clean, SEGMENTING: segment, "predict": predict or {}}
        return _log_pyfunc(run_id, model, TextClassifier(), "pyfunc_model.py", artifacts, config,
                           ["房间很干净，服务也好", "早餐太差了"], registered_name, Path(tmp))


def log_tagger(run_id: str, model: str, folder: Path, labels: list[str], clean: dict, predict: dict | None = None,
               registered_name: str | None = None):
    """Log `folder` (a trained tagger) as an EntityTagger pyfunc in run `run_id`. Returns MLflow's ModelInfo."""
    with tempfile.TemporaryDirectory() as tmp:
        config = {"model": model, "labels": labels, CLEANING: clean, "predict": predict or {}}
        return _log_pyfunc(run_id, model, EntityTagger(), "pyfunc_tagger.py", {"model": str(folder)}, config,
                           ["张伟，男，1965年出生，北京大学硕士，现任中国银行行长。", "无"], registered_name, Path(tmp))


class TextTranslator(PythonModel):
    """Raw text of the source language in; `translation` and `status` per text out. The text is cleaned as the
    pipeline cleaned that side (and segmented, for a Chinese source) before it is translated."""

    def load_context(self, context) -> None:
        from tasks.classification.clean import Params as CleanParams
        from tasks.models import MODELS
        from tasks.segmenter import Segmenter, SegmenterParams

        cfg = read_config(context)
        segment = cfg[SEGMENTING]
        self.translator = MODELS[cfg["model"]].translator(Path(context.artifacts["model"]))
        self.direction = self.translator.direction
        clean = CleanParams(**{k: v for k, v in cfg[CLEANING].items() if k in CleanParams.model_fields})
        # the English side is never converted to simplified characters
        self.clean = clean if self.direction.startswith("zh") else clean.model_copy(update={"traditional_to_simplified": False})
        limits = cfg.get("predict") or {}
        self.max_rows, self.max_chars = limits.get("max_rows", 10_000), min(limits.get("max_chars", 5_000), self.clean.max_chars)
        self.segmenter = (Segmenter(SegmenterParams(**{k: v for k, v in segment.items() if k in SegmenterParams.model_fields}))
                          if self.direction.startswith("zh") else None)

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from tasks.normalise import clean_text

        values = as_texts(model_input)
        if len(values) > self.max_rows:
            raise bad_request(f"{len(values)} texts in one call; at most {self.max_rows} (predict.max_rows)")
        texts, statuses = [], []
        for n, value in enumerate(values, 1):
            if value is not None and not isinstance(value, str):
                raise bad_request(f"text {n} is a {type(value).__name__}, not a string")
            text = clean_text((value or "")[: self.max_chars], self.clean)
            texts.append(text)
            statuses.append("missing" if value is None else "empty" if not text else "truncated" if len(value) > self.max_chars else "ok")
        usable = [i for i, t in enumerate(texts) if t]
        out: list[str | None] = [None] * len(texts)
        if usable:
            picked = [texts[i] for i in usable]
            frame = pd.DataFrame({"text": picked, **self.segmenter.rows(picked)}) if self.segmenter else pd.DataFrame({"en": picked})
            for i, t in zip(usable, self.translator(frame)):
                out[i] = t.text
        return pd.DataFrame({"translation": pd.Series(out, dtype="string"), "status": statuses})


def log_translator(run_id: str, model: str, folder: Path, clean: dict, segment: dict, predict: dict | None = None,
                   registered_name: str | None = None):
    """Log `folder` (a trained translator) as a TextTranslator pyfunc in run `run_id`. Returns MLflow's ModelInfo."""
    import torch

    direction = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)["direction"]
    example = ["我们明天去北京。", "你好。"] if direction.startswith("zh") else ["We are going to Beijing tomorrow.", "Hello."]
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = {"model": str(folder), **segment_artifacts(segment, Path(tmp))}
        config = {"model": model, CLEANING: clean, SEGMENTING: segment, "predict": predict or {}}
        return _log_pyfunc(run_id, model, TextTranslator(), "pyfunc_translator.py", artifacts, config, example, registered_name, Path(tmp))


def served_outcomes(model_uri: str, test: pd.DataFrame, metric: str, flavour: str, batch: int = 1000):
    """What a registered model does on each row of a test split, as it is served (loaded from the registry, its
    logged code and weights, asked with the split's texts in batches): classifier: the true and predicted labels;
    tagger: each sentence's strict entity counts; translator: each sentence's BLEU statistics (sacrebleu). Slices:
    the true class, and the text's length bucket."""
    import mlflow.pyfunc
    import numpy as np

    from flows.track.paired import Outcomes, length_buckets
    from flows.track.tracker import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())  # a models:/ URI is looked up in this project's registry
    from flows.track.requirements import by_name
    from flows.track.trust import trusted

    with by_name():
        model = mlflow.pyfunc.load_model(trusted(model_uri))
    if flavour == "translator":
        from sacrebleu.metrics import BLEU

        from tasks.translation.text import sides

        source, target = sides(model.unwrap_python_model().direction)
        texts = test["text" if source == "zh" else "en"].astype(str).tolist()
        hypotheses = _asked(model, texts, batch)["translation"].fillna("").astype(str).tolist()
        refs = test["text" if target == "zh" else "en"].astype(str).tolist()
        tokenize = "zh" if target == "zh" else "13a"
        stats = np.array(BLEU(tokenize=tokenize)._extract_corpus_statistics(hypotheses, [refs]), dtype=np.int64)
        return Outcomes("bleu", metric, {"stats": stats}, {"length": length_buckets(texts)}, tokenize=tokenize)
    texts = test["text"].astype(str).tolist()
    answers = _asked(model, texts, batch)
    if flavour == "tagger":
        from tasks.ner.tagging import spans_of

        per_type: dict[str, np.ndarray] = {}  # entity type -> each sentence's (tp, fp, fn) of that type
        for i, (tags, found) in enumerate(zip(test["tags"], answers["entities"])):
            gold = set(spans_of(list(tags)))
            got = {(e["type"], e["start"], e["end"]) for e in json.loads(found)}
            for kind in {s[0] for s in gold | got}:
                g, p = {s for s in gold if s[0] == kind}, {s for s in got if s[0] == kind}
                per_type.setdefault(kind, np.zeros((len(texts), 3), dtype=np.int64))[i] = len(g & p), len(p - g), len(g - p)
        counts = sum(per_type.values()) if per_type else np.zeros((len(texts), 3), dtype=np.int64)
        columns = {"tp": counts[:, 0], "fp": counts[:, 1], "fn": counts[:, 2]}
        columns |= {f"{k}:{kind}": c[:, j] for kind, c in per_type.items() for j, k in enumerate(("tp", "fp", "fn"))}
        return Outcomes("spans", metric, columns, {"length": length_buckets(texts)})
    truth = test["label"].astype(str).to_numpy()
    predicted = answers["label"].fillna("").astype(str).to_numpy()
    return Outcomes("labels", metric, {"truth": truth, "predicted": predicted}, {"class": truth, "length": length_buckets(texts)})


def _asked(model, texts: list[str], batch: int) -> pd.DataFrame:
    return pd.concat([model.predict(pd.DataFrame({"text": texts[i : i + batch]})) for i in range(0, len(texts), batch)], ignore_index=True)


def score_served(model_uri: str, test: pd.DataFrame, metric: str, flavour: str, batch: int = 1000) -> float:
    """A registered model's score on a test split, as it is served. classifier: accuracy or macro_f1 of the
    labels; tagger: strict micro entity F1; translator: corpus BLEU."""
    return served_outcomes(model_uri, test, metric, flavour, batch).score()


def _log_classifier_of(run_id: str, model: str, folder: Path, labels: list[str], config):
    return log_classifier(run_id, model, folder, labels, config.section(CLEANING).model_dump(mode="json"),
                          config.section(SEGMENTING).segmenter().model_dump(mode="json"), config.predict.model_dump())


def _log_tagger_of(run_id: str, model: str, folder: Path, labels: list[str], config):
    return log_tagger(run_id, model, folder, labels, config.section(CLEANING).model_dump(mode="json"), config.predict.model_dump())


def _log_translator_of(run_id: str, model: str, folder: Path, labels: list[str], config):
    return log_translator(run_id, model, folder, config.section(CLEANING).model_dump(mode="json"),
                          config.section(SEGMENTING).segmenter().model_dump(mode="json"), config.predict.model_dump())


# how a task kind's models are logged and served (tasks.stages.TaskKind.flavour): (run id, model, its folder,
# labels, the pipeline config) -> MLflow's ModelInfo of a pyfunc that takes raw text
FLAVOURS = {"classifier": _log_classifier_of, "tagger": _log_tagger_of, "translator": _log_translator_of}


def _log_pyfunc(run_id: str, name: str, wrapper: PythonModel, code_file: str, artifacts: dict, config: dict, example: list[str],
                registered_name: str | None, tmp: Path):
    import mlflow
    from mlflow.models import infer_signature

    from flows.track.requirements import by_name, pinned
    from flows.track.tracker import tracking_uri

    path = tmp / "zhpipe.json"
    path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    artifacts = {**artifacts, "config": str(path)}

    class _Ctx:  # the signature's output comes from the model itself, as MLflow would load it
        pass

    ctx = _Ctx()
    ctx.artifacts = artifacts
    wrapper.load_context(ctx)
    signature = infer_signature(example, wrapper.predict(ctx, example))
    mlflow.set_tracking_uri(tracking_uri())
    with mlflow.start_run(run_id=run_id), by_name():
        # models from code: MLflow keeps the code file as the model's code instead of a CloudPickle'd object
        return mlflow.pyfunc.log_model(
            name=name, python_model=str(Path(__file__).with_name(code_file)), artifacts=artifacts, signature=signature,
            input_example=example, code_paths=[str(CODE / "flows"), str(CODE / "tasks")],
            registered_model_name=registered_name, pip_requirements=pinned(),
        )


class EntityTagger(PythonModel):
    """Raw text in; per text `entities` (a JSON list of {text, type, start, end, score}; offsets in characters of
    the text as given, `end` exclusive), `count` and `status` out. Each character is cleaned as the pipeline
    cleaned it (NFKC per character, control characters removed), so offsets never shift."""

    def load_context(self, context) -> None:
        from tasks.models import MODELS
        from tasks.ner.clean import Params as CleanParams

        cfg = json.loads(Path(context.artifacts["config"]).read_text(encoding="utf-8"))
        self.clean = CleanParams(**{k: v for k, v in cfg[CLEANING].items() if k in CleanParams.model_fields})
        limits = cfg.get("predict") or {}
        self.max_rows, self.max_chars = limits.get("max_rows", 10_000), limits.get("max_chars", self.clean.max_chars)
        self.tagger = MODELS[cfg["model"]].tagger(Path(context.artifacts["model"]))

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from tasks.ner.clean import clean_chars
        from tasks.ner.tagging import spans_of

        values = as_texts(model_input)
        if len(values) > self.max_rows:
            raise bad_request(f"{len(values)} texts in one call; at most {self.max_rows} (predict.max_rows)")
        cleaned, where, statuses = [], [], []
        for n, value in enumerate(values, 1):
            if value is not None and not isinstance(value, str):
                raise bad_request(f"text {n} is a {type(value).__name__}, not a string")
            text, index = clean_chars((value or "")[: self.max_chars], self.clean)
            cleaned.append(text)
            where.append(index)
            statuses.append("missing" if value is None else "empty" if not cleaned[-1].strip() else
                            "truncated" if len(value) > self.max_chars else "ok")
        entities = []
        for value, index, tagged in zip(values, where, self.tagger(cleaned)):
            found = [{"text": value[index[s] : index[e - 1] + 1], "type": kind, "start": index[s], "end": index[e - 1] + 1,
                      "score": round(float(np.mean(tagged.scores[s:e])), 4)} for kind, s, e in spans_of(tagged.tags)]
            entities.append(found)
        return pd.DataFrame({"entities": [json.dumps(e, ensure_ascii=False) for e in entities],
                             "count": [len(e) for e in entities], "status": statuses})


