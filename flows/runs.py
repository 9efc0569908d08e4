"""Runs from the command line: `zhpipe runs` lists pipeline runs, `zhpipe compare` shows what differs
between runs, `zhpipe predict` applies a registered model to texts or a file."""
from __future__ import annotations

import json
import logging
import os
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.errors import ConfigError, DataError, ZhpipeError
from tasks.stages import KINDS

log = logging.getLogger("zhpipe")


def _client():
    from flows.tracking import client

    return client()


def pipeline_runs(pipeline: str | None, limit: int = 20) -> list:
    """Recent parent (pipeline) runs, newest first, from one pipeline's experiment or all zhpipe ones."""
    from flows.tracking import tracking_uri

    uri = tracking_uri()
    db = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None
    if db is not None and db.is_file():
        runs = _runs_from_sqlite(db, pipeline, limit)
        if runs is not None:
            return runs
    return runs_from_client(pipeline, limit)


def runs_from_client(pipeline: str | None, limit: int) -> list:
    """`pipeline_runs` through the MLflow client (any tracking store)."""
    c = _client()
    if pipeline:
        exp = c.get_experiment_by_name(f"zhpipe-{pipeline}")
        if exp is None:
            raise ZhpipeError(f"no runs of pipeline '{pipeline}' (no MLflow experiment zhpipe-{pipeline}); run `zhpipe run {pipeline}` first")
        ids = [exp.experiment_id]
    else:
        ids = [e.experiment_id for e in c.search_experiments() if e.name.startswith("zhpipe-")]
    if not ids:
        return []
    return c.search_runs(ids, filter_string="tags.`zhpipe.pipeline` != ''", order_by=["attributes.start_time DESC"], max_results=limit)


class _Run:
    """The parts of an MLflow run that `runs_table` reads, from the SQLite store's tables."""

    def __init__(self, run_id: str, start_time: int, status: str, tags: dict, metrics: dict):
        from types import SimpleNamespace

        self.info = SimpleNamespace(run_id=run_id, start_time=start_time, status=status)
        self.data = SimpleNamespace(tags=tags, metrics=metrics)


def _runs_from_sqlite(db: Path, pipeline: str | None, limit: int) -> list | None:
    """`pipeline_runs` read straight from MLflow's SQLite file (read-only, its documented tables: experiments,
    runs, tags, latest_metrics), in a few milliseconds instead of the seconds that importing MLflow and
    opening its store take. None when the file does not have those tables (the MLflow client reads it then)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            where, args = ("name = ?", [f"zhpipe-{pipeline}"]) if pipeline else ("substr(name, 1, 7) = 'zhpipe-'", [])
            experiments = [r[0] for r in con.execute(f"SELECT experiment_id FROM experiments WHERE lifecycle_stage = 'active' AND {where}", args)]
            if pipeline and not experiments:
                raise ZhpipeError(f"no runs of pipeline '{pipeline}' (no MLflow experiment zhpipe-{pipeline}); run `zhpipe run {pipeline}` first")
            marks = ",".join("?" * len(experiments))
            runs = con.execute(
                f"SELECT run_uuid, start_time, status FROM runs r WHERE lifecycle_stage = 'active' AND experiment_id IN ({marks}) "
                "AND EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = 'zhpipe.pipeline' AND t.value != '') "
                "ORDER BY start_time DESC, run_uuid LIMIT ?", [*experiments, limit]).fetchall()
            ids = [r[0] for r in runs]
            marks = ",".join("?" * len(ids))
            tags: dict[str, dict] = {i: {} for i in ids}
            metrics: dict[str, dict] = {i: {} for i in ids}
            for run_id, key, value in con.execute(f"SELECT run_uuid, key, value FROM tags WHERE run_uuid IN ({marks})", ids):
                tags[run_id][key] = value
            for run_id, key, value, is_nan in con.execute(f"SELECT run_uuid, key, value, is_nan FROM latest_metrics WHERE run_uuid IN ({marks})", ids):
                metrics[run_id][key] = float("nan") if is_nan else value
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return [_Run(run_id, start, status, tags[run_id], metrics[run_id]) for run_id, start, status in runs]


def runs_table(runs: list) -> pd.DataFrame:
    """One row per run: id, date, status, pipeline, commit, source sha256, best model, metrics, cache use."""
    rows = []
    for r in runs:
        tags, m = r.data.tags, r.data.metrics
        rows.append({
            "run": r.info.run_id[:12], "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(r.info.start_time / 1000)),
            "status": r.info.status, "name": tags.get("mlflow.runName") or getattr(r.info, "run_name", ""),
            "overrides": tags.get("zhpipe.overrides", ""),
            "pipeline": tags.get("zhpipe.pipeline", ""), "commit": tags.get("zhpipe.git_commit", "")[:8],
            "source": tags.get("zhpipe.source_sha256", "").removeprefix("partitions ")[:8], "best model": tags.get("zhpipe.best_model", ""),
            "test acc": m.get("best_test_accuracy"), "test macro-F1": m.get("best_test_macro_f1"), "test entity F1": m.get("best_test_f1"),
            "hit/miss": f"{int(m.get('stages_hit', 0))}/{int(m.get('stages_miss', 0))}",
            "partitions reused/built": (f"{int(m['partitions_hit'])}/{int(m['partitions_miss'])}"
                                        if "partitions_hit" in m else ""),
            "rows": int(m["rows_read"]) if "rows_read" in m else "",
            "rows new": int(m["rows_new"]) if "rows_new" in m else "",
            "champion": tags.get("zhpipe.champion", ""), "why": tags.get("zhpipe.champion_reason", ""),
            "registered": tags.get("zhpipe.registered", ""),
        })
    frame = pd.DataFrame(rows)
    if len(frame) and frame["test entity F1"].isna().all():  # no ner run among them
        frame = frame.drop(columns=["test entity F1"])
    if len(frame) and not (frame["partitions reused/built"] != "").any():  # no partitioned source among them
        frame = frame.drop(columns=["partitions reused/built", "rows new"])
    return frame


def find_run(prefix: str):
    """A run by its id or an unambiguous prefix of it (as `zhpipe runs` prints them)."""
    from mlflow.exceptions import MlflowException

    c = _client()
    if len(prefix) == 32:
        try:
            return c.get_run(prefix)
        except MlflowException:
            pass
    matches = [r for r in runs_from_client(None, 5000) if r.info.run_id.startswith(prefix)]
    if len(matches) != 1:
        raise ZhpipeError(f"run '{prefix}': {'no pipeline run' if not matches else f'{len(matches)} runs'} with that id prefix")
    return matches[0]


MODEL_METRICS = ("val_accuracy_best", "val_macro_f1_best", "test_accuracy", "test_macro_f1", "val_f1_best", "test_f1",
                 "test_perplexity", "train_seconds")


def model_metrics(run) -> dict[str, dict[str, float]]:
    """The model runs under a parent run: per model, its validation and test metrics."""
    c = _client()
    children = c.search_runs([run.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'",
                             max_results=500)
    out: dict[str, dict[str, float]] = {}
    for child in children:
        model = child.data.tags.get("zhpipe.model")
        if model and not child.data.tags.get("zhpipe.trial"):
            out[model] = {k: child.data.metrics[k] for k in MODEL_METRICS if k in child.data.metrics}
    # a run that built nothing names the model runs it reused: their training's, then their scoring's metrics
    reused = sorted((k.removeprefix("zhpipe.reused.").partition("."), v) for k, v in run.data.tags.items()
                    if k.startswith("zhpipe.reused.") and "." in k.removeprefix("zhpipe.reused.") and v)
    order = list(KINDS[run.data.tags.get("zhpipe.task")].stages) if run.data.tags.get("zhpipe.task") in KINDS else []
    for (stage, _, model), source in sorted(reused, key=lambda item: order.index(item[0][0]) if item[0][0] in order else 0):
        metrics = c.get_run(source).data.metrics
        out.setdefault(model, {}).update({k: metrics[k] for k in MODEL_METRICS if k in metrics})
    return out


def compare_table(run_ids: list[str], everything: bool = False) -> pd.DataFrame:
    """Parameters, metrics and tags side by side, one column per run, and each model's validation and test
    metrics (`model textcnn test_accuracy`); only rows that differ unless `everything` (the headline metrics
    are always shown). `delta` is the last run's value minus the first's (in the spirit of `dvc metrics diff`)."""
    runs = [find_run(r) for r in run_ids]
    headline = {"metric best_test_accuracy", "metric best_test_macro_f1", "metric best_test_f1", "metric best_test_bleu", "tag zhpipe.best_model"}
    table: dict[str, dict[str, Any]] = {}
    for r in runs:
        col = r.info.run_id[:12]
        for k, v in r.data.params.items():
            table.setdefault(f"param {k}", {})[col] = v
        for k, v in r.data.metrics.items():
            table.setdefault(f"metric {k}", {})[col] = round(v, 4)
        for model, values in model_metrics(r).items():
            for k, v in values.items():
                table.setdefault(f"model {model} {k}", {})[col] = round(v, 4)
        for k in ("zhpipe.best_model", "zhpipe.git_commit", "zhpipe.source_sha256", "zhpipe.config_hash", "zhpipe.registered", "zhpipe.champion"):
            if k in r.data.tags:
                table.setdefault(f"tag {k}", {})[col] = r.data.tags[k][:16]
    columns = [r.info.run_id[:12] for r in runs]
    frame = pd.DataFrame.from_dict(table, orient="index").reindex(columns=columns)
    if not everything:
        differs = frame.astype(str).nunique(axis=1, dropna=False) > 1
        frame = frame[differs | frame.index.isin(headline)]
    kind = {"model": 0, "metric": 1, "tag": 2, "param": 3}
    order = sorted(frame.index, key=lambda k: (kind[k.split(" ", 1)[0]], k))
    frame = frame.loc[order]
    first, last = pd.to_numeric(frame[columns[0]], errors="coerce"), pd.to_numeric(frame[columns[-1]], errors="coerce")
    frame["delta"] = (last - first).round(4).map(lambda d: "" if pd.isna(d) else f"{d:+.4f}")
    return frame.rename_axis("what").reset_index()


# ---- prediction ----------------------------------------------------------------------------------------

READERS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def load_model(uri: str):
    """An MLflow pyfunc by URI, or one clear error naming the URI and the tracking store. When the code logged
    with the model differs from the installed zhpipe, the model answers from a child process that runs the
    logged code (as `mlflow models serve` does), so one model version gives one answer."""
    import tempfile

    import mlflow
    from mlflow.exceptions import MlflowException

    from flows.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    import atexit
    import shutil

    folder = Path(tempfile.mkdtemp(prefix="zhpipe-model-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)

    def cannot(e: Exception) -> ZhpipeError:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        from tasks.urls import redact, redact_text

        return ZhpipeError(f"cannot load model {uri} from {redact(tracking_uri())}: {redact_text(first)}; run a pipeline first "
                           "(`zhpipe run`) or pass --model")

    # the model's files first, its code not yet run: a model logged with other code answers from a child process
    # that runs that code, never from this one
    in_place = Path(uri.removeprefix("file://")).expanduser()
    try:
        if (in_place / "MLmodel").is_file():  # a local model is read in place
            local = in_place
        else:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(folder)))
        if not (local / "MLmodel").is_file():
            raise MlflowException(f"no MLmodel file in {uri}")
    except (MlflowException, OSError) as e:
        raise cannot(e) from None
    changed = code_drift(local)
    if changed:
        log.info("predict: %s was logged with other zhpipe code (%s%s); it answers with its logged code, as MLflow serves it",
                 uri, ", ".join(changed[:3]), " ..." if len(changed) > 3 else "")
        return LoggedCodeModel(local)
    try:
        return mlflow.pyfunc.load_model(str(local))
    except (MlflowException, OSError) as e:
        raise cannot(e) from None


def code_drift(folder: Path) -> list[str]:
    """The files of the code logged with a model (`code/flows`, `code/tasks`) that differ from the installed ones."""
    from flows.serving import CODE

    logged = folder / "code"
    if not logged.is_dir():
        return []
    names = {p.relative_to(logged).as_posix() for p in logged.glob("*/**/*.py") if p.parts[len(logged.parts)] in ("flows", "tasks")}
    names |= {p.relative_to(CODE).as_posix() for package in ("flows", "tasks") for p in (CODE / package).rglob("*.py")}
    return sorted(n for n in names if not ((logged / n).is_file() and (CODE / n).is_file() and (logged / n).read_bytes() == (CODE / n).read_bytes()))


_CHILD = """
import json, sys
import mlflow.pyfunc
model = mlflow.pyfunc.load_model(sys.argv[1])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    try:
        out = model.predict(json.loads(line))
        print(json.dumps({"frame": out.to_json(orient="split", force_ascii=False)}), flush=True)
    except Exception as e:  # the model's input errors (MlflowException) come back as messages
        print(json.dumps({"error": getattr(e, "message", str(e))}), flush=True)
"""


class LoggedCodeModel:
    """A logged model answering from a child process that imports only the code logged with it (its `code/`
    folder first on sys.path, started outside the project folder), one JSON line per call."""

    def __init__(self, folder: Path):
        import subprocess
        import sys
        import tempfile

        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.folder = folder
        self.errors = Path(tempfile.mkstemp(prefix="zhpipe-predict-", suffix=".log")[1])  # its warnings and errors, not the console
        with open(self.errors, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(folder)], cwd=folder, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, encoding="utf-8")
        if "ready" not in self._read():
            raise ZhpipeError(f"the model in {folder} could not be loaded with its logged code")
        config = json.loads((folder / "artifacts" / "zhpipe.json").read_text(encoding="utf-8"))
        self.max_rows = (config.get("predict") or {}).get("max_rows", 10_000)

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = self.errors.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise ZhpipeError(f"the model's process ended: its logged code failed to run ({tail[0][:300]})")
        return json.loads(line)

    def unwrap_python_model(self):
        return self  # what predict_frame asks: max_rows

    def predict(self, texts) -> pd.DataFrame:
        import io

        from mlflow.exceptions import MlflowException

        values = texts.tolist() if hasattr(texts, "tolist") else list(texts)
        values = [None if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v for v in values]
        self.proc.stdin.write(json.dumps(values, ensure_ascii=False) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise MlflowException(answer["error"])
        return pd.read_json(io.StringIO(answer["frame"]), orient="split", dtype=False)

    def __del__(self):
        if getattr(self, "proc", None) and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def read_input(path: Path, text_column: str) -> pd.DataFrame:
    kind = READERS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(f"--input {path}: unknown file type '{path.suffix}' (expected .csv, .tsv, .jsonl or .parquet)")
    if not path.is_file():
        raise DataError(f"--input {path}: no such file")
    try:
        if kind == "parquet":
            df = pd.read_parquet(path)
        else:  # UTF-8 (with or without BOM), UTF-16 and GBK/GB18030, as the download stage reads a corpus
            from tasks.source.readers import detect_encoding

            with open(path, "rb") as f:
                encoding = detect_encoding(f.read(1 << 16))
            if kind == "jsonl":
                df = pd.read_json(path, lines=True, dtype=False, encoding=encoding)
            else:  # "NA", "null" and "" stay texts: only a missing field is missing
                df = pd.read_csv(path, sep="\t" if kind == "tsv" else ",", dtype=str, keep_default_na=False, encoding=encoding)
    except (ValueError, OSError, pd.errors.ParserError) as e:
        raise DataError(f"--input {path}: unreadable {kind}: {str(e).splitlines()[0][:200]}") from None
    if text_column not in df:
        raise DataError(f"--input {path}: no text column '{text_column}' (columns found: {', '.join(map(str, df.columns))}); use --text-column")
    return df


def write_table(df: pd.DataFrame, path: Path) -> None:
    """Write by extension, atomically (a temporary sibling renamed into place)."""
    kind = READERS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(f"--output {path}: unknown file type '{path.suffix}' (expected .csv, .tsv, .jsonl or .parquet)")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if kind == "parquet":
        df.to_parquet(tmp, index=False)
    elif kind == "jsonl":  # a tagger's entities as nested objects, not as a JSON string inside JSON
        if f"{PREFIX}entities" in df:
            df = df.assign(**{f"{PREFIX}entities": [json.loads(e) if isinstance(e, str) else e for e in df[f"{PREFIX}entities"]]})
        df.to_json(tmp, orient="records", lines=True, force_ascii=False)
    else:
        df.to_csv(tmp, sep="\t" if kind == "tsv" else ",", index=False)
    os.replace(tmp, path)


@lru_cache(maxsize=2)
def _cached_model(uri: str):
    return load_model(uri)


def predict_chunk(chunk, params: dict) -> pd.DataFrame:
    """Chunk function: the label and probabilities of one chunk's texts (the model is loaded once per worker)."""
    from tasks.io import read_chunk

    return predict_frame(_cached_model(params["uri"]), read_chunk(chunk, columns=[params["text_column"]]), params["text_column"])


def predict_distributed(uri: str, df: pd.DataFrame, text_column: str, executor: str, chunk_rows: int = 2000) -> pd.DataFrame:
    """Batch prediction in chunks on Dask ("local" or a scheduler address): the texts are written as Parquet
    row groups, each worker loads the model once and labels the chunks it is given."""
    import tempfile

    from flows.chunks import DaskRunner, shutdown
    from tasks.io import chunk_plan, write_parquet

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "texts.parquet"
        write_parquet(df[[text_column]], src, row_group_rows=chunk_rows)
        try:
            parts = list(DaskRunner(executor).map(predict_chunk, chunk_plan(src, chunk_rows), {"uri": uri, "text_column": text_column}, desc="predict"))
        finally:
            shutdown()
    return pd.concat(parts, ignore_index=True)


PREFIX = "pred_"  # the output's own columns; the input's columns (a `label` of its own too) are kept as they are


def model_version(uri: str) -> dict[str, str]:
    """The registered model name and version behind a `models:/NAME@alias` or `models:/NAME/VERSION` URI."""
    if not uri.startswith("models:/"):
        return {"model": uri, "version": ""}
    name, sep, rest = uri.removeprefix("models:/").partition("@")
    client = _client()
    if sep:
        return {"model": name, "version": str(client.get_model_version_by_alias(name, rest).version)}
    name, _, version = name.partition("/")
    return {"model": name, "version": version}


def entities_text(value: str) -> str:
    """A tagger's entities (JSON) as one readable cell: 张伟/NAME[0:2] 0.99; ..."""
    return "; ".join(f"{e['text']}/{e['type']}[{e['start']}:{e['end']}] {e['score']:.2f}" for e in json.loads(value or "[]"))


def with_predictions(df: pd.DataFrame, out: pd.DataFrame, model: dict[str, str]) -> pd.DataFrame:
    """The input rows, then the prediction columns under `pred_` names, then which model made them."""
    out = out.rename(columns={c: f"{PREFIX}{c}" for c in out.columns}).reset_index(drop=True)
    out[f"{PREFIX}model"] = model["model"]
    out[f"{PREFIX}model_version"] = model["version"]
    clash = [c for c in out.columns if c in df.columns]
    if clash:
        raise DataError(f"the input already has the output columns {clash}; rename them")
    return pd.concat([df.reset_index(drop=True), out], axis=1)


def predict_frame(model, df: pd.DataFrame, text_column: str, batch: int = 512) -> pd.DataFrame:
    """The model's `label`, `probability`, `p_<label>` and `status` for each row's text (a tagger's `entities`,
    `count` and `status`; a translator's `translation` and `status`), in batches of at most the model's
    `predict.max_rows` with a progress bar; missing texts stay missing (status `missing`)."""
    from tasks.progress import progress

    texts = df[text_column].tolist()
    try:  # a file of any length, asked in calls the model accepts (its predict.max_rows)
        batch = min(batch, int(model.unwrap_python_model().max_rows))
    except (AttributeError, TypeError, ValueError):
        pass
    parts = []
    with progress(total=len(texts), desc="predict", unit="text", shown=len(texts) >= 2000) as bar:
        for i in range(0, len(texts), batch):
            parts.append(model.predict(texts[i : i + batch]))
            bar.update(len(parts[-1]))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["label", "probability", "status"])
