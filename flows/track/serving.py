"""A trained model of any task kind as an MLflow pyfunc that takes raw text: one generic entry
(pyfunc_model.py) loads the kind's inference pipeline (`TaskKind.serving`, e.g.
tasks/classification/serving.py), which cleans, segments and encodes the texts the way the pipeline
did (its settings, user dictionary and stopwords travel with the model; the vocabulary is in the
model folder) and answers: labels and class probabilities, entities, translations.

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
# the flows and tasks packages as one file among a logged model's code (`code/`): one upload and one
# download where the tree is ~170 (a tracking server proxying a bucket answers each file in a
# request of its own)
CODE_ARCHIVE = "zhpipe-code.zip"


def code_archive(folder: Path) -> Path:
    """The flows and tasks packages' sources as `folder/zhpipe-code.zip`, the same bytes for the
    same code (sorted names, fixed times): Python imports from it as from a folder (pyfunc_model.py
    puts it on sys.path)."""
    import zipfile

    path = folder / CODE_ARCHIVE
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(
            p for package in ("flows", "tasks") for p in (CODE / package).rglob("*.py")
        ):
            info = zipfile.ZipInfo(
                source.relative_to(CODE).as_posix(), date_time=(1980, 1, 1, 0, 0, 0)
            )
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o600 << 16
            archive.writestr(info, source.read_bytes())
    return path


# the section of a served model's zhpipe.json whose files (user dictionary, stopwords) travel
SEGMENTING = "segment"


def bad_request(message: str) -> Exception:
    """An input error: MLflow's scoring server answers it with HTTP 400 and the message."""
    from mlflow.exceptions import MlflowException

    return MlflowException.invalid_parameter_value(f"zhpipe: {message}")


def as_texts(model_input: Any) -> list[Any]:
    """Texts from what pyfunc callers send: a list, a Series, a NumPy array, a single string, or a
    DataFrame with a `text` column (or one unnamed column, as MLflow's server builds from
    `{"inputs": [...]}`). Missing values stay missing (None), never the string "None" or "nan"."""
    if isinstance(model_input, str):
        return [model_input]
    if isinstance(model_input, pd.DataFrame):
        if "text" in model_input:
            column = "text"
        elif len(model_input.columns) == 1 and not isinstance(model_input.columns[0], str):
            column = model_input.columns[0]
        else:
            raise bad_request(
                "the input has no 'text' column (columns: "
                f"{', '.join(map(str, model_input.columns))})"
            )
        values = model_input[column].tolist()
    elif isinstance(model_input, (pd.Series, np.ndarray)):
        values = np.asarray(model_input, dtype=object).ravel().tolist()
    elif isinstance(model_input, (list, tuple)):
        values = list(model_input)
    else:
        raise bad_request(
            f"expected texts (a list of strings or a frame with a 'text' column), got "
            f"{type(model_input).__name__}"
        )
    return [
        None if v is None or (isinstance(v, float) and v != v) or v is pd.NA else v for v in values
    ]


def read_config(context) -> dict:
    """A logged model's zhpipe.json, its segmenter's files (user dictionary, stopwords) pointed at
    the artifacts."""
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
            path = (
                Path(segment[key])
                if Path(segment[key]).is_absolute()
                else current().root / segment[key]
            )
            artifacts[key] = str(shutil.copy(path, tmp / f"{key}{path.suffix}"))
    return artifacts


class ServedModel(PythonModel):
    """Raw text in, the kind's answers and a `status` per text out (the kind's `Served`); an input
    the kind refuses is HTTP 400 with its message."""

    # the kind's serving module, for models whose zhpipe.json does not name it (logged before it
    # did)
    serving = ""

    def load_context(self, context) -> None:
        import importlib

        cfg = read_config(context)
        self.kind = importlib.import_module(cfg.get("serving") or self.serving)
        self.served = self.kind.Served(cfg, Path(context.artifacts["model"]))

    @property
    # the most texts one call takes (predict.max_rows); past it a call is HTTP 400
    def max_rows(self) -> int:
        return self.served.max_rows

    @max_rows.setter
    def max_rows(self, value: int) -> None:
        self.served.max_rows = value

    @property
    def direction(self) -> str:  # a translator's, as models logged before the generic entry had it
        return self.served.direction

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from tasks.serving import BadInput

        try:
            return self.served(as_texts(model_input))
        except BadInput as e:
            raise bad_request(str(e)) from None


def log_model(
    run_id: str,
    model: str,
    folder: Path,
    labels: list[str],
    config,
    registered_name: str | None = None,
    store=None,
):
    """Log `folder` (a model the pipeline `config` trained) as a ServedModel pyfunc in run `run_id`,
    served as the config's task kind serves; register it under `registered_name` when given. The
    digest of what was logged goes into the stage store `store` (default: the project's;
    `trust.vouch`): only those files are loaded again. Returns MLflow's ModelInfo."""
    from flows.track.requirements import model_libraries, pinned
    from flows.track.trust import vouch
    from tasks.stages import serving

    kind = serving(config.kind)
    with tempfile.TemporaryDirectory() as tmp:
        settings = kind.settings(config, labels)
        artifacts = {
            "model": str(folder),
            **segment_artifacts(settings.get(SEGMENTING) or {}, Path(tmp)),
        }
        saved = {
            "model": model,
            "serving": kind.__name__,
            **settings,
            "predict": config.predict.model_dump(),
        }
        info = _log_pyfunc(
            run_id,
            model,
            ServedModel(),
            "pyfunc_model.py",
            artifacts,
            saved,
            kind.example(folder),
            registered_name,
            Path(tmp),
            pinned(model_libraries(config, model)),
        )
    _owner_only(info)
    vouch(info.model_uri, run_id, store)
    return info


def _owner_only(info) -> None:
    """MLflow copies the model's code with its source files' modes (0644 in a checkout), past the
    umask: a logged model in a local store is made its owner's only, as everything else of the
    project."""
    from urllib.parse import unquote, urlparse

    from flows.track.tracker import client
    from tasks.util.private import tighten

    location = client().get_logged_model(info.model_id).artifact_location
    if location.startswith(("file://", "/")):
        tighten(Path(unquote(urlparse(location).path)))


def served_outcomes(model_uri: str, test: pd.DataFrame, metric: str, batch: int = 1000, store=None):
    """What a registered model does on each row of a test split, as it is served (loaded from the
    registry, its logged code and weights, asked with the split's texts in batches): its kind's
    `outcomes` (true and predicted labels, each sentence's entity counts, each sentence's BLEU
    statistics), with their slices."""
    import mlflow.pyfunc

    from flows.track.tracker import tracking_uri

    # a models:/ URI is looked up in this project's registry
    mlflow.set_tracking_uri(tracking_uri())
    from flows.track.requirements import by_name
    from flows.track.trust import verified

    with tempfile.TemporaryDirectory(prefix="zhpipe-served-") as tmp, by_name():
        model = mlflow.pyfunc.load_model(str(verified(model_uri, Path(tmp), store)[1]))
    wrapper = model.unwrap_python_model()
    return wrapper.kind.outcomes(
        wrapper.served, lambda texts: _asked(model, texts, batch), test, metric
    )


def _asked(model, texts: list[str], batch: int) -> pd.DataFrame:
    return pd.concat(
        [
            model.predict(pd.DataFrame({"text": texts[i : i + batch]}))
            for i in range(0, len(texts), batch)
        ],
        ignore_index=True,
    )


def score_served(
    model_uri: str, test: pd.DataFrame, metric: str, batch: int = 1000, store=None
) -> float:
    """A registered model's score on a test split, as it is served (its kind's metric: accuracy or
    macro-F1, strict micro entity F1, corpus BLEU)."""
    return served_outcomes(model_uri, test, metric, batch, store).score()


def _log_pyfunc(
    run_id: str,
    name: str,
    wrapper: PythonModel,
    code_file: str,
    artifacts: dict,
    config: dict,
    example: list[str],
    registered_name: str | None,
    tmp: Path,
    requirements: list[str],
):
    import mlflow
    from mlflow.models import infer_signature

    from flows.track.requirements import by_name
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
        # models from code: MLflow keeps the code file as the model's code instead of a
        # CloudPickle'd object
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=str(Path(__file__).with_name(code_file)),
            artifacts=artifacts,
            signature=signature,
            input_example=example,
            code_paths=[str(code_archive(tmp))],
            registered_model_name=registered_name,
            pip_requirements=requirements,
        )
