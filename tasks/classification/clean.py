"""Stage `clean`: normalise text, drop what cannot be used, and quarantine every dropped row with
its reason."""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, field_validator

from tasks.core import DATASET_SAMPLE_ROWS, BuildContext, BuildOutput, Dataset, Facts
from tasks.errors import DataError
from tasks.shared.normalise import Normalise, clean_text, length_reasons
from tasks.util.io import (
    ROW_GROUP_ROWS,
    Chunk,
    PartWriter,
    chunk_plan,
    iter_frames,
    read_chunk,
    sorted_labels,
    text_digests,
)
from tasks.util.pool import ChunkPool
from tasks.util.usercode import CodeRef, last_line, load

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output, and the params that name files (counted by content)
LIBRARIES = ("pandas", "pyarrow", "opencc")
FILES: tuple[str, ...] = ()


class Params(Normalise):
    """The `clean` section."""

    OUTSIDE_KEY = ("workers",)
    # processes that normalise chunks (0 = one per core); on Dask, every worker
    workers: int = Field(1, ge=0)
    # the team's own rules, `module:function(text) -> str | None`, applied in order after the
    # built-in cleaning: a str replaces the text, None drops the row to the quarantine (reason
    # `rule:<module:function>`); docs/extending.md
    rules: list[str] = []

    @field_validator("rules")
    @classmethod
    def _references(cls, value: list[str]) -> list[str]:
        return [str(CodeRef.parse(v, "clean.rules")) for v in value]

    def user_code(self) -> list[CodeRef]:
        return [CodeRef.parse(v, "clean.rules") for v in self.rules]


CHUNK_ROWS = 5000
log = logging.getLogger("zhpipe")


def normalise(df: pd.DataFrame, params: Params) -> pd.DataFrame:
    """The row-wise part of cleaning: `text` normalised, the original kept as `raw_text`."""
    df = df.copy()
    df["raw_text"] = df["text"]
    df["text"] = [clean_text(t, params) for t in df["text"].astype(str)]
    return df


def normalise_chunk(chunk: Chunk, settings: tuple[str, str]) -> pd.DataFrame:
    """Chunk function: one chunk of the raw corpus, normalised and passed through the team's rules,
    with its row-wise `reason` (a rule that dropped it, or the length limits) and a 128-bit digest
    of its text (`h1`, `h2`) that deduplication compares instead of the text. `settings`: the params
    as JSON, and the project folder the rules' modules are found in."""
    params_json, root = settings
    p = Params.model_validate_json(params_json)
    df = normalise(read_chunk(chunk), p)
    dropped = apply_rules(df, _rules(p.rules, root))
    df["reason"] = length_reasons(df["text"], p)
    df.loc[dropped.notna(), "reason"] = dropped[dropped.notna()]
    df["h1"], df["h2"] = text_digest(df["text"])
    return df


_LOADED: dict[tuple, list] = {}


def _rules(refs: list[str], root: str) -> list[tuple[str, object]]:
    """The rules' functions, imported once per process (a chunk pool's worker runs many chunks)."""
    key = (tuple(refs), root)
    if key not in _LOADED:
        _LOADED[key] = [
            (ref, load(CodeRef.parse(ref, "clean.rules"), Path(root), f"clean.rules {ref}"))
            for ref in refs
        ]
    return _LOADED[key]


def apply_rules(df: pd.DataFrame, rules: list[tuple[str, object]]) -> pd.Series:
    """Each rule, in order, on each row's text (in place): a str replaces it, None drops the row.
    The reason per row (`rule:<module:function>` where a rule dropped it, else missing). A rule that
    raises, or returns something else, is one line naming the rule and the row's id."""
    reason = pd.Series(pd.NA, index=df.index, dtype="string")
    if not rules:
        return reason
    texts = df["text"].tolist()
    for i, text in enumerate(texts):
        for ref, rule in rules:
            try:
                text = rule(text)
            except Exception as e:  # noqa: BLE001 - the team's code may raise anything
                raise DataError(
                    f"clean.rules {ref} raised on row id {df['id'].iloc[i]}: {last_line(e)}"
                ) from None
            if text is None:
                reason.iloc[i] = f"rule:{ref}"
                break
            if not isinstance(text, str):
                raise DataError(
                    f"clean.rules {ref} returned {type(text).__name__} for row id "
                    f"{df['id'].iloc[i]} "
                    f"(expected the cleaned text, or None to drop the row)"
                )
        texts[i] = text if text is not None else texts[i]
    df["text"] = texts
    return reason


def text_digest(text: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 64-bit hashes of each text (pandas' SipHash with two keys): equal texts,
    equal pairs."""
    return tuple(text_digests(text, key) for key in ("zhpipe-dedupe-h1", "zhpipe-dedupe-h2"))


def duplicate_reasons(df: pd.DataFrame, key: list[str]) -> pd.Series:
    """For rows that passed the length limits, in id order: `label_conflict` (one text under several
    labels, every copy) or `duplicate` (a repeat of an earlier row's text and label), else missing.
    Texts are compared by the columns `key` (the text, or its digest); rows with equal texts must
    all be in `df`: the caller passes the whole corpus or one hash partition of it."""
    reason = pd.Series(pd.NA, index=df.index, dtype="string")
    if "label" in df:
        labels = df.groupby(key)["label"].transform("nunique")
        reason[(labels > 1).to_numpy()] = "label_conflict"
    dup = df[reason.isna()].duplicated(
        subset=key + (["label"] if "label" in df else []), keep="first"
    )
    reason[dup[dup].index] = "duplicate"
    return reason


def conflict_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Label conflicts (text, labels, ids) from the rows marked `label_conflict`, by text."""
    if rows.empty:
        return pd.DataFrame(columns=["text", "labels", "ids"])
    return (
        rows.groupby("text")
        .agg(
            labels=("label", lambda s: ",".join(sorted(set(s)))),
            ids=("id", lambda s: ",".join(map(str, s))),
        )
        .reset_index()
    )


# rows per dedupe partition (id, digest, label): the most rows deduplicated at once
PARTITION_ROWS = 200_000


def partition_count(rows: int) -> int:
    """Hash partitions for deduplicating `rows` rows."""
    return max(1, -(-rows // PARTITION_ROWS))


def partition_duplicates(parts: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, reasons) of the duplicates and label conflicts found in hash partitions of (id, digest,
    label), one partition in memory at a time; sorted by id."""
    ids, reasons = [np.zeros(0, dtype="int64")], [np.zeros(0, dtype=object)]
    for path in parts:
        df = pd.read_parquet(path)
        if "label" in df:
            df["label"] = df["label"].astype("category")  # a code per row, not a string object
        found = duplicate_reasons(df, ["h1", "h2"])
        hit = found.notna().to_numpy()
        ids.append(df["id"].to_numpy()[hit])
        reasons.append(found[hit].to_numpy(dtype=object))
    ids_all, reasons_all = np.concatenate(ids), np.concatenate(reasons)
    order = np.argsort(ids_all, kind="stable")
    return ids_all[order], reasons_all[order]


def lookup(ids: np.ndarray, values: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of `keys`, whether it is in the sorted `ids`, and its value where it is."""
    if not len(ids):
        return np.zeros(len(keys), bool), values[:0]
    at = np.searchsorted(ids, keys)
    hit = (at < len(ids)) & (ids[np.minimum(at, len(ids) - 1)] == keys)
    return hit, values[at[hit]]


def earlier_digests(ctx: BuildContext) -> pd.DataFrame | None:
    """A partition unit's view of the partitions before it: the digest, label and partition of every
    row they kept (their `digests.parquet`); None for a whole-corpus build."""
    if ctx.partition is None:
        return None
    frames = [
        pd.read_parquet(folder / "digests.parquet")
        for unit, folder in ctx.inputs.items()
        if unit.startswith("clean:")
    ]
    return pd.concat(frames, ignore_index=True) if frames else no_digests()


def no_digests() -> pd.DataFrame:
    """An empty `digests.parquet` frame: each kept row's text digest, label and partition."""
    return pd.DataFrame(
        {
            "h1": pd.Series(dtype="uint64"),
            "h2": pd.Series(dtype="uint64"),
            "label": pd.Series(dtype="string"),
            "partition": pd.Series(dtype="string"),
        }
    )


def across_partitions(
    kept: pd.DataFrame, earlier: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows still kept, rows that repeat an earlier partition's text with `reason` duplicate, or
    label_conflict under another label, and `repeats` naming that partition); rows carry their text
    digest (`h1`, `h2`)."""
    kept = kept.reset_index(drop=True)
    first = earlier.drop_duplicates(["h1", "h2"]).rename(columns={"label": "earlier_label"})
    found = kept[["h1", "h2"]].merge(first, how="left", on=["h1", "h2"])
    hit = found["partition"].notna().to_numpy()
    if "label" in kept:
        same = found["earlier_label"].astype(str).to_numpy() == kept["label"].astype(str).to_numpy()
        reason = np.where(same, "duplicate", "label_conflict")
    else:
        reason = np.full(len(kept), "duplicate", dtype=object)
    bad = kept[hit].assign(
        reason=pd.Series(reason[hit], dtype="string").to_numpy(),
        repeats=found["partition"][hit].to_numpy(),
    )
    return kept[~hit].reset_index(drop=True), bad.reset_index(drop=True)


def build(ctx: BuildContext) -> BuildOutput:
    """Clean `data.parquet` into `data.parquet` + `quarantine.parquet` (+ `label_conflicts.csv`), in
    bounded memory: (1) chunks are normalised (processes or Dask) and streamed to a scratch file,
    and each row's id, label and text digest go to one of the hash partitions; (2) each partition
    (equal texts meet in one) is deduplicated on its own; (3) the normalised rows are streamed
    again, in id order, into kept and quarantined rows."""
    src = ctx.file("download", "data.parquet")
    rows_in = pq.ParquetFile(src).metadata.num_rows
    empty = normalise(
        pq.ParquetFile(src).schema_arrow.empty_table().to_pandas(), ctx.params
    ).assign(reason=pd.Series(dtype="string"))
    # a partition keeps each row's text digest in the scratch file, for its digests.parquet
    digested = empty
    if ctx.partition is not None:
        digested = empty.assign(h1=pd.Series(dtype="uint64"), h2=pd.Series(dtype="uint64"))
        empty = empty.assign(repeats=pd.Series(dtype="string"))
    with tempfile.TemporaryDirectory(prefix="clean-", dir=ctx.scratch) as tmp:
        normalised, parts = _normalise_pass(ctx, src, rows_in, Path(tmp), digested)
        ids, reasons = partition_duplicates([w.path for w in parts if w.rows])
        out = Sorted(ctx)
        for df in iter_frames(normalised):
            out.add(ctx, df, *lookup(ids, reasons, df["id"].to_numpy()))
    if not out.kept.rows and ctx.partition is None:  # a partition may repeat earlier ones entirely
        raise DataError(
            f"clean: no rows left after cleaning ({rows_in} rows in, all quarantined: "
            f"{dict(out.counts)})"
        )
    if not out.kept.rows:
        log.warning(
            "clean: partition %s adds no rows (%d in, all quarantined: %s)",
            ctx.partition[1],
            rows_in,
            dict(out.counts),
        )
    return out.close(ctx, empty, rows_in)


def _normalise_pass(
    ctx: BuildContext, src: Path, rows_in: int, tmp: Path, digested: pd.DataFrame
) -> tuple[Path, list[PartWriter]]:
    """(1): every chunk normalised into `tmp/normalised.parquet`, and the id, digest and label of
    each row not quarantined yet into its hash partition (when deduplicating)."""
    partitions = partition_count(rows_in)
    pool = ctx.pool(ctx.params.workers if ctx.pool is ChunkPool else 0)
    normalised = PartWriter(tmp / "normalised.parquet", ROW_GROUP_ROWS)
    parts = [PartWriter(tmp / f"partition-{i}.parquet") for i in range(partitions)]
    for table in pool.tables(
        normalise_chunk,
        chunk_plan(src, CHUNK_ROWS) if rows_in else [],
        (ctx.params.model_dump_json(), str(ctx.root)),
        desc="clean",
    ):
        normalised.write(table if ctx.partition is not None else table.drop_columns(["h1", "h2"]))
        if ctx.params.dedupe:
            table = table.filter(pc.is_null(table["reason"])).select(
                [c for c in ("id", "h1", "h2", "label") if c in table.column_names]
            )
            part = table["h1"].to_numpy() % partitions
            for i, writer in enumerate(parts):
                piece = table.filter(part == i) if partitions > 1 else table
                if piece.num_rows:
                    writer.write(piece)
    normalised.close(digested)
    for writer in parts:
        writer.close()
    return normalised.path, parts


class Sorted:
    """(3): the normalised rows, with the duplicates found, written as kept or quarantined rows (and
    a partition's digests), with the counts, samples, label conflicts and labels the stage
    reports."""

    def __init__(self, ctx: BuildContext):
        # a partition: dedupe against earlier partitions too
        self.earlier = earlier_digests(ctx) if ctx.params.dedupe else None
        self.kept = PartWriter(ctx.out / "data.parquet", ROW_GROUP_ROWS)
        self.bad = PartWriter(ctx.out / "quarantine.parquet", ROW_GROUP_ROWS)
        self.digests = (
            PartWriter(ctx.out / "digests.parquet", ROW_GROUP_ROWS)
            if ctx.partition is not None
            else None
        )
        self.counts: Counter = Counter()
        self.sample, self.bad_sample, self.conflicts, self.labels = [], [], [], set()

    def add(self, ctx: BuildContext, df: pd.DataFrame, hit: np.ndarray, found: np.ndarray) -> None:
        df["reason"] = df["reason"].astype("string")
        df.loc[hit, "reason"] = found
        kept = df[df["reason"].isna()].drop(columns=["reason"]).reset_index(drop=True)
        bad = df[df["reason"].notna()].reset_index(drop=True)
        if ctx.partition is not None:
            bad = bad.assign(repeats=pd.Series(pd.NA, index=bad.index, dtype="string"))
            if self.earlier is not None and len(kept):
                kept, repeated = across_partitions(kept, self.earlier)
                if len(repeated):
                    bad = pd.concat([bad, repeated[bad.columns]], ignore_index=True).sort_values(
                        "id", kind="stable"
                    )
            if len(kept):
                self.digests.write(
                    kept[["h1", "h2"]].assign(
                        label=kept["label"].astype("string").to_numpy()
                        if "label" in kept
                        else pd.NA,
                        partition=ctx.partition[1],
                    )
                )
            kept, bad = kept.drop(columns=["h1", "h2"]), bad.drop(columns=["h1", "h2"])
        kept = kept.drop(columns=["raw_text"])
        if len(kept):
            self.kept.write(kept)
            self.labels.update(kept["label"].unique().tolist() if "label" in kept else [])
            if sum(map(len, self.sample)) < DATASET_SAMPLE_ROWS:
                self.sample.append(kept.head(DATASET_SAMPLE_ROWS))
        if len(bad):
            self.bad.write(bad)
            self.counts.update(bad["reason"].tolist())
            if "label" in bad:
                self.conflicts.append(
                    bad.loc[bad["reason"] == "label_conflict", ["id", "text", "label"]]
                )
            if sum(map(len, self.bad_sample)) < 1000:
                self.bad_sample.append(bad.head(1000))

    def close(self, ctx: BuildContext, empty: pd.DataFrame, rows_in: int) -> BuildOutput:
        self.kept.close(empty.drop(columns=["raw_text", "reason", "repeats"], errors="ignore"))
        self.bad.close(empty)
        if self.digests is not None:
            self.digests.close(no_digests())
        conflicts = (
            pd.concat(self.conflicts, ignore_index=True)
            if self.conflicts
            else pd.DataFrame(columns=["id", "text", "label"])
        )
        conflict_table(conflicts).to_csv(ctx.out / "label_conflicts.csv", index=False)
        metrics = {
            f"dropped_{r}": self.counts.get(r, 0)
            for r in ("empty", "too_short", "too_long", "duplicate", "label_conflict")
        }
        # one count per rule of the team's, by its function's name (an MLflow metric name holds no
        # `:`)
        metrics.update(
            {
                f"dropped_rule_{CodeRef.parse(r, 'clean.rules').function}": self.counts.get(
                    f"rule:{r}", 0
                )
                for r in ctx.params.rules
            }
        )
        metrics.update(rows_in=rows_in, rows_kept=self.kept.rows, rows_dropped=self.bad.rows)
        return BuildOutput(
            rows=self.kept.rows,
            metrics=metrics,
            facts=Facts(labels=sorted_labels(self.labels) if self.labels else None),
            artifacts=["quarantine.parquet", "label_conflicts.csv"],
            tables={
                "quarantine_sample.json": pd.concat(self.bad_sample, ignore_index=True)
                .head(1000)
                .astype(str)
            }
            if self.bad.rows
            else {},
            datasets=[
                Dataset(
                    pd.concat(self.sample, ignore_index=True).head(DATASET_SAMPLE_ROWS),
                    str(ctx.out / "data.parquet"),
                    f"{ctx.pipeline}-clean",
                    "clean",
                    rows=self.kept.rows,
                )
            ]
            if self.sample and not ctx.partition
            else [],
            # (a night's partition is no dataset a person compares: the run's splits are, on its
            # parent run)
        )
