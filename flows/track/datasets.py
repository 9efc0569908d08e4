"""A split as an MLflow dataset (the UI's 'Datasets used'): described once per file version and kept
in the project's cache, so a rerun on the same splits infers no schema again."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from flows.plan import project


def _dataset_cache(source: str, name: str, rows: int | None) -> Path | None:
    """Where the MLflow description of a split file is kept once inferred: by the file (its path,
    size and modification time: an output in the store never changes in place), its name and row
    count."""
    import hashlib

    try:
        st = os.stat(source)
    except OSError:
        return None
    key = hashlib.sha256(
        json.dumps([source, st.st_size, st.st_mtime_ns, name, rows]).encode()
    ).hexdigest()[:24]
    return project.current().data / "_cache" / "datasets" / f"{key}.json"


def dataset_entity(
    df: pd.DataFrame | Callable[[], pd.DataFrame],
    source: str,
    name: str,
    rows: int | None = None,
):
    """The MLflow Dataset entity of a split file. When `df` is only the head of `rows` rows, the
    dataset is recorded by its schema and a digest (of the head and the row count), without a
    profile that would describe the head alone. `df` may be a function that reads the rows: called
    only when the file was not described before (a cached run reads nothing of its splits)."""
    import mlflow.data
    from mlflow.entities import Dataset

    cached = _dataset_cache(source, name, rows)
    # the same split, described by an earlier run: not inferred again
    if cached is not None and cached.is_file():
        try:
            return Dataset(**json.loads(cached.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            pass
    if callable(df):
        df = df()
    # schema-inference hints about integer columns, not actionable here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = mlflow.data.from_pandas(
            df, source=source, name=name, targets="label" if "label" in df else None
        )
        if rows is not None and rows > len(df):
            from mlflow.data.digest_utils import get_normalized_md5_digest
            from mlflow.data.meta_dataset import MetaDataset

            digest = get_normalized_md5_digest([ds.digest.encode(), str(rows).encode()])
            ds = MetaDataset(ds.source, name=name, digest=digest, schema=ds.schema)
        entity = ds._to_mlflow_entity()  # the schema is inferred here
    if cached is not None:
        from tasks.util.io import atomic_write_text

        cached.parent.mkdir(parents=True, exist_ok=True)
        # its fields, as Dataset(**...) takes them
        atomic_write_text(cached, json.dumps(dict(entity)))
    return entity
