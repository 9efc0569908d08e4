"""Stage `clean`: normalise text, drop what cannot be used, and quarantine every dropped row with its reason."""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import pandas as pd
import pyarrow.parquet as pq
from pydantic import Field

from tasks.core import BuildContext, BuildOutput, Dataset, Section
from tasks.errors import DataError
from tasks.io import Chunk, Runner, plan, read_chunk, sorted_labels, write_parquet

# what its key sees besides params, inputs and code (flows/fingerprint.py): the libraries that shape
# its output, and the params that name files (counted by content)
LIBRARIES = ("pandas", "pyarrow", "opencc")
FILES: tuple[str, ...] = ()


class Params(Section):
    """The `clean` section."""

    nfkc: bool = True  # full-width to half-width
    strip_html: bool = True
    strip_urls: bool = True
    traditional_to_simplified: bool = False  # OpenCC t2s
    min_chars: int = Field(2, ge=0)
    max_chars: int = Field(5000, ge=1)
    dedupe: bool = True
CHUNK_ROWS = 5000
_HTML_TAG = re.compile(r"<[^>]{1,200}>")
_URL = re.compile(r"(?:https?://|www\.)[^\s\u4e00-\u9fff，。！？、；：]+", re.IGNORECASE)
_CONTROL = re.compile(r"[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202f\u2060-\u206f\ufeff]")
_SPACE = re.compile(r"\s+")


@lru_cache(maxsize=1)
def _t2s():
    import opencc

    return opencc.OpenCC("t2s")


def clean_text(text: str, params: Params) -> str:
    """One text through the normalisation steps, in order."""
    if params.nfkc:
        text = unicodedata.normalize("NFKC", text)  # full-width letters, digits and punctuation to half-width
    if params.strip_html:
        text = _HTML_TAG.sub(" ", text)
        text = text.replace("&nbsp;", " ").replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    if params.strip_urls:
        text = _URL.sub(" ", text)
    text = _CONTROL.sub("", text)  # BOM, zero-width and control characters
    text = _SPACE.sub(" ", text).strip()
    if params.traditional_to_simplified:
        text = _t2s().convert(text)
    return text


def normalise(df: pd.DataFrame, params: Params) -> pd.DataFrame:
    """The row-wise part of cleaning: `text` normalised, the original kept as `raw_text`."""
    df = df.copy()
    df["raw_text"] = df["text"]
    df["text"] = [clean_text(t, params) for t in df["text"].astype(str)]
    return df


def normalise_chunk(chunk: Chunk, params_json: str) -> pd.DataFrame:
    """Chunk function: one chunk of the raw corpus, normalised."""
    return normalise(read_chunk(chunk), Params.model_validate_json(params_json))


def clean_frame(df: pd.DataFrame, params: Params) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Return (kept rows, quarantined rows with `reason`, label conflicts) for a frame of id/text[/label]."""
    return filter_rows(normalise(df, params), params)


def filter_rows(df: pd.DataFrame, params: Params) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The corpus-wide part of cleaning, on normalised rows: length limits, label conflicts, duplicates."""
    length = df["text"].str.len()
    reason = pd.Series(pd.NA, index=df.index, dtype="string")
    reason[length == 0] = "empty"
    reason[reason.isna() & (length < params.min_chars)] = "too_short"
    reason[reason.isna() & (length > params.max_chars)] = "too_long"
    conflicts = pd.DataFrame(columns=["text", "labels", "ids"])
    if params.dedupe:
        candidates = df[reason.isna()]
        if "label" in df:
            groups = candidates.groupby("text")["label"].nunique()
            conflict_texts = set(groups[groups > 1].index)
            in_conflict = candidates["text"].isin(conflict_texts)
            reason[in_conflict[in_conflict].index] = "label_conflict"
            conflicts = (
                candidates[in_conflict]
                .groupby("text")
                .agg(labels=("label", lambda s: ",".join(sorted(set(s)))), ids=("id", lambda s: ",".join(map(str, s))))
                .reset_index()
            )
        dup = df[reason.isna()].duplicated(subset=["text"] + (["label"] if "label" in df else []), keep="first")
        reason[dup[dup].index] = "duplicate"
    kept = df[reason.isna()].drop(columns=["raw_text"]).reset_index(drop=True)
    quarantine = df[reason.notna()].assign(reason=reason[reason.notna()]).reset_index(drop=True)
    return kept, quarantine, conflicts


def build(ctx: BuildContext) -> BuildOutput:
    """Clean `data.parquet` into `data.parquet` + `quarantine.parquet` (+ `label_conflicts.csv`)."""
    src = ctx.inputs["download"] / "data.parquet"
    runner = ctx.runner(1 if ctx.runner is Runner else 0)  # local: one process (the work is light); Dask: every worker
    # normalisation runs in chunks (processes or Dask); duplicates and conflicts need every row at once
    df = pd.concat(list(runner.map(normalise_chunk, plan(src, CHUNK_ROWS), ctx.params.model_dump_json(), desc="clean")),
                   ignore_index=True) if pq.ParquetFile(src).metadata.num_rows else normalise(pd.read_parquet(src), ctx.params)
    kept, quarantine, conflicts = filter_rows(df, ctx.params)
    if kept.empty:
        raise DataError(f"clean: no rows left after cleaning ({len(df)} rows in, all quarantined: {quarantine['reason'].value_counts().to_dict()})")
    write_parquet(kept, ctx.out / "data.parquet")
    write_parquet(quarantine, ctx.out / "quarantine.parquet")
    conflicts.to_csv(ctx.out / "label_conflicts.csv", index=False)
    counts = quarantine["reason"].value_counts().to_dict()
    metrics = {f"dropped_{r}": counts.get(r, 0) for r in ("empty", "too_short", "too_long", "duplicate", "label_conflict")}
    metrics.update(rows_in=len(df), rows_kept=len(kept), rows_dropped=len(quarantine))
    return BuildOutput(
        rows=len(kept),
        metrics=metrics,
        info={"labels": sorted_labels(kept["label"]) if "label" in kept else None},
        artifacts=["quarantine.parquet", "label_conflicts.csv"],
        tables={"quarantine_sample.json": quarantine.head(1000).astype(str)} if len(quarantine) else {},
        datasets=[Dataset(kept, str(ctx.out / "data.parquet"), f"{ctx.pipeline}-clean", "clean")],
    )
