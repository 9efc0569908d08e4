"""A trained classifier as an MLflow pyfunc that takes raw Chinese text: it cleans, segments and encodes the
texts the way the pipeline did (clean and segment parameters, user dictionary and stopwords travel with
the model; the vocabulary is in the model folder) and returns the label and the class probabilities.

    mlflow.pyfunc.load_model("models:/zhpipe-chnsenticorp@champion").predict(["房间很干净"])
    mlflow models serve -m models:/zhpipe-chnsenticorp@champion --env-manager local
"""
from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

CODE = Path(__file__).resolve().parent.parent  # the folder holding the flows and tasks packages
# MLflow suggests type hints on `predict` for its own input validation; this model validates its input itself
warnings.filterwarnings("ignore", message=".*Add type hints to the `predict` method.*")


def as_texts(model_input: Any) -> list[str]:
    """Texts from what pyfunc callers send: a list, a Series, a DataFrame (its `text` column, else its only
    column), a NumPy array or a single string."""
    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, pd.DataFrame):
        column = "text" if "text" in model_input else model_input.columns[0]
        return model_input[column].astype(str).tolist()
    if isinstance(model_input, (pd.Series, np.ndarray)):
        return [str(t) for t in np.asarray(model_input).ravel()]
    return [str(t) for t in model_input]


class TextClassifier(PythonModel):
    """Raw text in; `label`, `probability` and one `p_<label>` column per class out."""

    def load_context(self, context) -> None:
        from tasks.clean import Params as CleanParams
        from tasks.models import MODELS
        from tasks.segmenter import Segmenter, SegmenterParams

        cfg = json.loads(Path(context.artifacts["config"]).read_text(encoding="utf-8"))
        segment = cfg["segment"]
        for key in ("user_dict", "stopwords"):  # files travel as artifacts
            if segment.get(key):
                segment[key] = context.artifacts[key]
        self.labels = cfg["labels"]
        self.clean = CleanParams(**cfg["clean"])
        self.segmenter = Segmenter(SegmenterParams(**{k: v for k, v in segment.items() if k in SegmenterParams.model_fields}))
        self.predictor = MODELS[cfg["model"]].predictor(Path(context.artifacts["model"]))

    def predict(self, context, model_input, params=None) -> pd.DataFrame:
        from tasks.clean import clean_text

        texts = [clean_text(t, self.clean) for t in as_texts(model_input)]
        frame = pd.DataFrame({"text": texts, **self.segmenter.rows(texts)})
        probs = self.predictor(frame) if len(frame) else np.zeros((0, len(self.labels)), dtype=np.float32)
        out = pd.DataFrame({"label": [self.labels[i] for i in probs.argmax(1)], "probability": probs.max(1, initial=0.0)})
        for i, label in enumerate(self.labels):
            out[f"p_{label}"] = probs[:, i]
        return out


def log_classifier(run_id: str, model: str, folder: Path, labels: list[str], clean: dict, segment: dict,
                   registered_name: str | None = None):
    """Log `folder` (a trained classifier) as a TextClassifier pyfunc in run `run_id`; register it under
    `registered_name` when given. Returns MLflow's ModelInfo."""
    import mlflow
    from mlflow.models import infer_signature

    from flows.project import current
    from flows.tracking import tracking_uri

    artifacts = {"model": str(folder)}
    with tempfile.TemporaryDirectory() as tmp:
        for key in ("user_dict", "stopwords"):
            if segment.get(key):
                path = Path(segment[key]) if Path(segment[key]).is_absolute() else current().root / segment[key]
                artifacts[key] = str(shutil.copy(path, Path(tmp) / f"{key}{path.suffix}"))
        config = Path(tmp) / "zhpipe.json"
        config.write_text(json.dumps({"model": model, "labels": labels, "clean": clean, "segment": segment}, ensure_ascii=False), encoding="utf-8")
        artifacts["config"] = str(config)
        example = ["房间很干净，服务也好", "早餐太差了"]
        wrapper = TextClassifier()

        class _Ctx:  # the signature's output comes from the model itself, as MLflow would load it
            pass

        ctx = _Ctx()
        ctx.artifacts = artifacts
        wrapper.load_context(ctx)
        signature = infer_signature(example, wrapper.predict(ctx, example))
        mlflow.set_tracking_uri(tracking_uri())
        with mlflow.start_run(run_id=run_id):
            # models from code: MLflow keeps pyfunc_model.py as the model's code instead of a CloudPickle'd object
            return mlflow.pyfunc.log_model(
                name="classifier", python_model=str(Path(__file__).with_name("pyfunc_model.py")), artifacts=artifacts, signature=signature,
                input_example=example, code_paths=[str(CODE / "flows"), str(CODE / "tasks")],
                registered_model_name=registered_name, pip_requirements=_requirements(),
            )


def _requirements() -> list[str]:
    """The packages the model code imports, pinned to this environment's versions."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("mlflow", "torch", "pandas", "pyarrow", "numpy", "scipy", "jieba", "scikit-learn", "fasttext", "gensim",
                 "transformers", "pydantic", "pyyaml", "opencc", "prefect", "filelock"):
        try:
            out.append(f"{name}=={version(name).split('+')[0]}")
        except PackageNotFoundError:
            continue
    return out
