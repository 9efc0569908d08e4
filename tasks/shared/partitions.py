"""A partitioned stage's own output: its partition units' outputs gathered in partition order. With
a source of many files (one a day), download, clean, split, segment and augment run per file, each
file a unit with its own key; this concatenation is all a night with one new file redoes for the old
ones. Parquet files are streamed one row group at a time (memory: one row group); text files are
appended byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core import BuildContext, BuildOutput, gathered
from tasks.util.io import ROW_GROUP_ROWS

LIBRARIES = ("pyarrow",)
FILES: tuple[str, ...] = ()


def concat_parquet(sources: list[Path], target: Path) -> int:
    """Every row of `sources`, in order, into `target` under their unified schema; returns the
    rows."""
    # an empty file's types are guesses
    filled = [p for p in sources if pq.ParquetFile(p).metadata.num_rows] or sources[:1]
    schema = pa.unify_schemas([pq.read_schema(p) for p in filled], promote_options="permissive")
    rows = 0
    with pq.ParquetWriter(target, schema) as writer:
        for path in filled:
            part = pq.ParquetFile(path)
            # as it is: a row group at a time, no casts
            if part.schema_arrow.equals(schema, check_metadata=False):
                for i in range(part.num_row_groups):
                    table = part.read_row_group(i)
                    writer.write_table(table.replace_schema_metadata(schema.metadata))
                    rows += len(table)
                continue
            for batch in part.iter_batches(batch_size=ROW_GROUP_ROWS):
                table = pa.Table.from_batches([batch])
                columns = [
                    table.column(f.name).cast(f.type)
                    if f.name in table.column_names
                    else pa.nulls(len(table), f.type)
                    for f in schema
                ]
                writer.write_table(pa.Table.from_arrays(columns, schema=schema))
                rows += len(table)
    return rows


def build(ctx: BuildContext) -> BuildOutput:
    """Concatenate the partitions' Parquet and text files (every one the first partition has at its
    top level) in partition order; metrics are the partitions' sums (means weighted by rows), plus
    their count."""
    folders = list(ctx.inputs.values())  # in partition order
    names = sorted(
        p.name for p in folders[0].iterdir() if p.is_file() and p.suffix in (".parquet", ".txt")
    )
    rows: dict[str, int] = {}
    for name in names:
        present = [f / name for f in folders if (f / name).is_file()]
        if name.endswith(".parquet"):
            rows[name] = concat_parquet(present, ctx.out / name)
        else:
            with open(ctx.out / name, "wb") as out:
                for path in present:
                    with open(path, "rb") as src:
                        shutil.copyfileobj(src, out)
    metrics: dict[str, float] = {"partitions": len(folders)}
    weights = [
        ctx.input_metrics.get(unit, {}).get("rows_kept") or ctx.input_rows.get(unit) or 0
        for unit in ctx.inputs
    ]
    for key in {k for m in ctx.input_metrics.values() for k in m}:
        values = [m.get(key) for m in ctx.input_metrics.values()]
        if not all(isinstance(v, int | float) for v in values):
            continue
        if "mean" in key or "rate" in key:
            total = sum(weights) or 1
            metrics[key] = sum(v * w for v, w in zip(values, weights)) / total
        else:
            metrics[key] = sum(values)
    main = next((n for n in ("data.parquet", "train.parquet") if n in rows), None)
    total_rows = rows[main] if main else sum(ctx.input_rows.get(u) or 0 for u in ctx.inputs)
    return BuildOutput(rows=total_rows, metrics=metrics, facts=gathered(list(ctx.facts.values())))
