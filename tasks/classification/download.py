"""Stage `download`: fetch or find the raw corpus, verify it, and read it into one Parquet table.

What it guards against: a file that does not match its sha256 (deleted and fetched again, a bounded
number of times), an http(s) source without a sha256 (refused unless `allow_unverified`, which keys
the download by the server's ETag/Last-Modified/size and re-checks them), a resume against a changed
file (`If-Range`, and `Content-Range` checked), a redirect from https to http, a server slower than
the deadline, a file larger than the size limit, archives that unpack into a bomb, escape their
folder or hold links, and rows that cannot be read (kept in `quarantine.parquet` with their line
numbers, never dropped silently).
"""

from __future__ import annotations

import logging
from collections import Counter

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Facts
from tasks.source.archives import ARCHIVES, extract
from tasks.source.fetch import FetchParams, locate
from tasks.source.readers import (
    empty_quarantine,
    file_format,
    labelled,
    no_rows,
    range_file,
    read_batches,
)
from tasks.source.schema import Source
from tasks.util.io import ROW_GROUP_ROWS, PartWriter, sorted_labels
from tasks.util.urls import redact

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output, and the params that name files (counted by content)
LIBRARIES = ("pandas", "pyarrow", "charset-normalizer")
FILES: tuple[str, ...] = ()
log = logging.getLogger("zhpipe")


class Params(FetchParams):
    """The `download` section: how a remote corpus is fetched and unpacked."""


# a partition's row ids start at its ordinal times this (partitions of up to 10^10 rows)
PARTITION_IDS = 10**10


EMPTY = pd.DataFrame(
    {
        "id": pd.Series(dtype="int64"),
        "line": pd.Series(dtype="int64"),
        "text": pd.Series(dtype="string"),
    }
)


def build(ctx: BuildContext) -> BuildOutput:
    """Find or fetch, verify, unpack and read the source (`ctx.source`); write `data.parquet` and
    `quarantine.parquet`. The file is decoded, parsed and written batch by batch, so memory does not
    grow with the corpus."""
    p: Params = ctx.params
    source: Source = ctx.source
    raw, sha = locate(source, ctx.root, ctx.store.downloads, p, ctx.store.expect(source))
    data_file = (
        extract(raw, ctx.scratch / "extracted", source.member, p)
        if raw.name.lower().endswith(ARCHIVES)
        else raw
    )
    if source.byte_range is not None:  # a partition of an appended file: its lines only
        data_file = range_file(source, data_file, ctx.scratch / "range")
    data = PartWriter(ctx.out / "data.parquet", ROW_GROUP_ROWS)
    bad = PartWriter(ctx.out / "quarantine.parquet", ROW_GROUP_ROWS)
    labels: set[str] = set()
    reasons: Counter = Counter()
    rows = physical = 0
    first_bad = None
    # ids unique across partitions
    offset = PARTITION_IDS * ctx.partition[0] if ctx.partition else 0
    for df, quarantine, lines in read_batches(data_file, source):
        physical += lines
        if offset:
            df = df.assign(id=df["id"] + offset)
            quarantine = (
                quarantine.assign(id=quarantine["id"] + offset)
                if "id" in quarantine
                else quarantine
            )
        if len(df):
            data.write(df)
            rows += len(df)
            if "label" in df:
                labels.update(df["label"].unique().tolist())
        if len(quarantine):
            bad.write(quarantine)
            reasons.update(quarantine["reason"].tolist())
            first_bad = first_bad if first_bad is not None else int(quarantine["line"].min())
    if not rows and not ctx.partition:
        no_rows(data_file, dict(reasons))
    # an empty night: its partition is empty (the quarantine check holds it out), never a failed run
    if not rows:
        log.warning("download: partition %s has no readable rows", ctx.partition[1])
    data.close(
        EMPTY.assign(label=pd.Series(dtype="string"))
        if labelled(source, file_format(data_file, source))
        else EMPTY
    )
    bad.close(empty_quarantine())
    if bad.rows:
        log.warning(
            "download: %d of %d rows quarantined (%s), first at line %d; see quarantine.parquet",
            bad.rows,
            rows + bad.rows,
            dict(reasons),
            first_bad,
        )
    with_labels = labelled(source, file_format(data_file, source))
    facts = Facts(
        source_sha256=sha,
        source_file=redact(str(raw) if raw.is_relative_to(ctx.root) else raw.name),
        labelled=with_labels,
        labels=sorted_labels(labels) if with_labels else None,
    )
    metrics = {"rows_raw": rows, "rows_quarantined": bad.rows, "lines_physical": physical}
    if with_labels:
        metrics["num_labels"] = len(facts.labels)
    return BuildOutput(rows=rows, metrics=metrics, facts=facts)
