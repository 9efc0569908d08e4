"""`zhpipe predict`: a registered model (or a logged model folder) applied to texts or a file, here
or in chunks on Dask; a model logged with other code answers from a child process that runs its own
copy."""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path

import pandas as pd

from tasks.errors import ConfigError, DataError, ZhpipeError
from tasks.util.private import atomic_path

log = logging.getLogger("zhpipe")


READERS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def load_model(uri: str):
    """An MLflow pyfunc by URI, or one clear error naming the URI and the tracking store. When the
    code logged with the model differs from the installed zhpipe, the model answers from a child
    process that runs the logged code (as `mlflow models serve` does), so one model version gives
    one answer."""
    import tempfile

    import mlflow
    from mlflow.exceptions import MlflowException

    from flows.track.tracker import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    import atexit
    import shutil

    folder = Path(tempfile.mkdtemp(prefix="zhpipe-model-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)

    def cannot(e: Exception) -> ZhpipeError:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        from tasks.util.urls import redact, redact_text

        return ZhpipeError(
            f"cannot load model {uri} from {redact(tracking_uri())}: {redact_text(first)}; run a "
            f"pipeline first (`zhpipe run`) or pass --model"
        )

    # the model's files first, its code not yet run: a model logged with other code answers from a
    # child process that runs that code, never from this one
    from urllib.parse import urlparse

    from flows.track.trust import verified
    from tasks.util.private import not_trusted

    # a `models:/` (or `runs:/`) URI goes through the registry and the store's record, never through
    # a folder of that name; only a path (`--model DIR`) is a folder, read in place once no one else
    # could have written it
    in_place = urlparse(uri).scheme in ("", "file")
    local = Path(uri.removeprefix("file://")).expanduser().absolute()
    if in_place and (local / "MLmodel").exists() and (why := not_trusted(local / "MLmodel")):
        raise ZhpipeError(
            f"--model {uri}: {why}; a model folder is loaded only when no one else can write to it"
        )
    try:
        # a registered version this project logged, its files as its run recorded them; or one line
        if not in_place:
            local = verified(uri, folder)[1]
        if not (local / "MLmodel").is_file():
            raise MlflowException(f"no MLmodel file in {uri}")
    except ConfigError as e:  # no such version: said as any model that cannot be loaded
        raise cannot(e) from None
    except (MlflowException, OSError) as e:
        raise cannot(e) from None
    changed = code_drift(local)
    if changed:
        log.info(
            "predict: %s was logged with other zhpipe code (%s%s); it answers with its logged "
            "code, as MLflow serves it",
            uri,
            ", ".join(changed[:3]),
            " ..." if len(changed) > 3 else "",
        )
        return LoggedCodeModel(local)
    from flows.track.requirements import by_name

    try:
        with by_name():
            return mlflow.pyfunc.load_model(str(local))
    except (MlflowException, OSError) as e:
        raise cannot(e) from None


def logged_code(folder: Path) -> dict[str, bytes]:
    """The flows and tasks sources logged with a model, by path (`code/zhpipe-code.zip`; older
    models: the folders `code/flows` and `code/tasks`); {} when it has none."""
    import zipfile

    from flows.track.serving import CODE_ARCHIVE

    logged = folder / "code"
    if (logged / CODE_ARCHIVE).is_file():
        with zipfile.ZipFile(logged / CODE_ARCHIVE) as archive:
            return {n: archive.read(n) for n in archive.namelist() if n.endswith(".py")}
    if not logged.is_dir():
        return {}
    return {
        p.relative_to(logged).as_posix(): p.read_bytes()
        for p in logged.glob("*/**/*.py")
        if p.parts[len(logged.parts)] in ("flows", "tasks")
    }


def code_drift(folder: Path) -> list[str]:
    """The files of the code logged with a model that differ from the installed ones."""
    from flows.track.serving import CODE

    logged = logged_code(folder)
    if not logged:
        return []
    names = set(logged) | {
        p.relative_to(CODE).as_posix()
        for package in ("flows", "tasks")
        for p in (CODE / package).rglob("*.py")
    }
    return sorted(
        n
        for n in names
        if not (n in logged and (CODE / n).is_file() and logged[n] == (CODE / n).read_bytes())
    )


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
    """A logged model answering from a child process that imports only the code logged with it (its
    `code/` folder first on sys.path, started outside the project folder), one JSON line per
    call."""

    def __init__(self, folder: Path):
        import subprocess
        import sys
        import tempfile

        self.folder = folder
        # its warnings and errors, not the console
        self.errors = Path(tempfile.mkstemp(prefix="zhpipe-predict-", suffix=".log")[1])
        # isolated (-I: no PYTHON* variables, no user site, neither the working directory nor a
        # script's folder on sys.path), in an empty folder of its own: it imports the logged code
        # and the installed libraries only
        self.workdir = tempfile.mkdtemp(prefix="zhpipe-predict-")
        with open(self.errors, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _CHILD, str(folder)],
                cwd=self.workdir,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                encoding="utf-8",
            )
        if "ready" not in self._read():
            raise ZhpipeError(f"the model in {folder} could not be loaded with its logged code")
        config = json.loads((folder / "artifacts" / "zhpipe.json").read_text(encoding="utf-8"))
        self.max_rows = (config.get("predict") or {}).get("max_rows", 10_000)

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = self.errors.read_text(encoding="utf-8", errors="replace").strip().splitlines()[
                -1:
            ] or ["no message"]
            raise ZhpipeError(
                f"the model's process ended: its logged code failed to run ({tail[0][:300]})"
            )
        return json.loads(line)

    def unwrap_python_model(self):
        return self  # what predict_frame asks: max_rows

    def predict(self, texts) -> pd.DataFrame:
        import io

        from mlflow.exceptions import MlflowException

        values = texts.tolist() if hasattr(texts, "tolist") else list(texts)
        values = [
            None if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v
            for v in values
        ]
        self.proc.stdin.write(json.dumps(values, ensure_ascii=False) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise MlflowException(answer["error"])
        return pd.read_json(io.StringIO(answer["frame"]), orient="split", dtype=False)

    def __del__(self):  # the child ends with the model, and its log of warnings goes with it
        if getattr(self, "proc", None) and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        if getattr(self, "errors", None) is not None:
            self.errors.unlink(missing_ok=True)
        if getattr(self, "workdir", None) is not None:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)


def read_input(path: Path, text_column: str) -> pd.DataFrame:
    kind = READERS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(
            f"--input {path}: unknown file type '{path.suffix}' (expected .csv, "
            f".tsv, .jsonl or .parquet)"
        )
    if not path.is_file():
        raise DataError(f"--input {path}: no such file")
    try:
        if kind == "parquet":
            df = pd.read_parquet(path)
        # UTF-8 (with or without BOM), UTF-16 and GBK/GB18030, as the download stage reads a corpus
        else:
            from tasks.source.readers import detect_encoding

            with open(path, "rb") as f:
                encoding = detect_encoding(f.read(1 << 16), path)
            if kind == "jsonl":
                df = pd.read_json(path, lines=True, dtype=False, encoding=encoding)
            else:  # "NA", "null" and "" stay texts: only a missing field is missing
                df = pd.read_csv(
                    path,
                    sep="\t" if kind == "tsv" else ",",
                    dtype=str,
                    keep_default_na=False,
                    encoding=encoding,
                )
    except (ValueError, OSError, pd.errors.ParserError) as e:
        raise DataError(
            f"--input {path}: unreadable {kind}: {str(e).splitlines()[0][:200]}"
        ) from None
    if text_column not in df:
        raise DataError(
            f"--input {path}: no text column '{text_column}' (columns found: "
            f"{', '.join(map(str, df.columns))}); use --text-column"
        )
    return df


def write_table(df: pd.DataFrame, path: Path) -> None:
    """Write by extension, atomically (a temporary sibling renamed into place)."""
    kind = READERS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(
            f"--output {path}: unknown file type '{path.suffix}' (expected .csv, "
            f".tsv, .jsonl or .parquet)"
        )
    # answers that hold JSON (a tagger's entities) as nested objects, not as strings inside JSON
    if kind == "jsonl":
        nested = [f"{PREFIX}{c}" for c in shown_as(df).nested if f"{PREFIX}{c}" in df]
        df = df.assign(
            **{c: [json.loads(e) if isinstance(e, str) else e for e in df[c]] for c in nested}
        )
    # made with O_EXCL beside the output: no planted link at a guessed name is followed
    with atomic_path(path) as tmp:
        if kind == "parquet":
            df.to_parquet(tmp, index=False)
        elif kind == "jsonl":
            df.to_json(tmp, orient="records", lines=True, force_ascii=False)
        else:
            df.to_csv(tmp, sep="\t" if kind == "tsv" else ",", index=False)


@lru_cache(maxsize=2)
def _cached_model(uri: str):
    return load_model(uri)


def predict_chunk(chunk, params: dict) -> pd.DataFrame:
    """Chunk function: the label and probabilities of one chunk's texts (the model is loaded once
    per worker)."""
    from tasks.util.io import read_chunk

    return predict_frame(
        _cached_model(params["uri"]),
        read_chunk(chunk, columns=[params["text_column"]]),
        params["text_column"],
    )


def predict_distributed(
    uri: str, df: pd.DataFrame, text_column: str, executor: str, chunk_rows: int = 2000
) -> pd.DataFrame:
    """Batch prediction in chunks on Dask ("local" or a scheduler address): the texts are written as
    Parquet row groups, each worker loads the model once and labels the chunks it is given."""
    import tempfile

    from flows.pools.chunks import DaskPool, shutdown
    from tasks.util.io import chunk_plan, write_parquet

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "texts.parquet"
        write_parquet(df[[text_column]], src, row_group_rows=chunk_rows)
        try:
            parts = list(
                DaskPool(executor).map(
                    predict_chunk,
                    chunk_plan(src, chunk_rows),
                    {"uri": uri, "text_column": text_column},
                    desc="predict",
                )
            )
        finally:
            shutdown()
    return pd.concat(parts, ignore_index=True)


# the output's own columns; the input's columns (a `label` of its own too) are kept as they are
PREFIX = "pred_"


def model_version(uri: str) -> dict[str, str]:
    """The registered model name and version behind a `models:/NAME@alias` or `models:/NAME/VERSION`
    URI."""
    if not uri.startswith("models:/"):
        return {"model": uri, "version": ""}
    name, sep, rest = uri.removeprefix("models:/").partition("@")
    from flows.track.tracker import client as tracking_client

    client = tracking_client()
    if sep:
        return {
            "model": name,
            "version": str(client.get_model_version_by_alias(name, rest).version),
        }
    name, _, version = name.partition("/")
    return {"model": name, "version": version}


def shown_as(out: pd.DataFrame):
    """How predictions read (`tasks.serving.Shown`): that of the kind whose answer column `out`
    has."""
    from tasks.stages import KINDS, serving

    for kind in KINDS.values():
        shown = serving(kind).SHOWN
        if f"{PREFIX}{shown.answer}" in out or shown.answer in out:
            return shown
    raise ZhpipeError(
        f"the model answered with columns no task kind reads: {', '.join(map(str, out.columns))}"
    )


def with_predictions(df: pd.DataFrame, out: pd.DataFrame, model: dict[str, str]) -> pd.DataFrame:
    """The input rows, then the prediction columns under `pred_` names, then which model made
    them."""
    out = out.rename(columns={c: f"{PREFIX}{c}" for c in out.columns}).reset_index(drop=True)
    out[f"{PREFIX}model"] = model["model"]
    out[f"{PREFIX}model_version"] = model["version"]
    clash = [c for c in out.columns if c in df.columns]
    if clash:
        raise DataError(f"the input already has the output columns {clash}; rename them")
    return pd.concat([df.reset_index(drop=True), out], axis=1)


def predict_frame(model, df: pd.DataFrame, text_column: str, batch: int = 512) -> pd.DataFrame:
    """The model's `label`, `probability`, `p_<label>` and `status` for each row's text (a tagger's
    `entities`, `count` and `status`; a translator's `translation` and `status`), in batches of at
    most the model's `predict.max_rows` with a progress bar; missing texts stay missing (status
    `missing`)."""
    from tasks.util.progress import progress

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
    # the answer columns, no row
    return pd.concat(parts, ignore_index=True) if parts else model.predict([""]).iloc[:0]
