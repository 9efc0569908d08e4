"""Stages run as the pipeline runs them (their streaming `build` on an upstream folder), for unit
tests that would rather pass a frame and read frames back."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Facts

SPLITS = ("train", "validation", "test")


def build_on(
    module, upstream: str, files: dict[str, pd.DataFrame], params, **ctx
) -> tuple[BuildOutput, dict[str, pd.DataFrame]]:
    """`module.build` with `files` (name -> frame, written as parquet) as the output of stage
    `upstream`; returns the build's result and every parquet file it wrote, read back."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / upstream).mkdir()
        for name, frame in files.items():
            # several row groups
            frame.to_parquet(root / upstream / name, index=False, row_group_size=7)
        (root / "out").mkdir()
        out = module.build(
            BuildContext(
                inputs={upstream: root / upstream},
                facts={upstream: Facts()},
                out=root / "out",
                params=params,
                **ctx,
            )
        )
        written = {
            p.relative_to(root / "out").as_posix(): pd.read_parquet(p)
            for p in (root / "out").rglob("*.parquet")
        }
        written |= {
            p.relative_to(root / "out").as_posix(): pd.read_csv(p, dtype=str, keep_default_na=False)
            for p in (root / "out").rglob("*.csv")
        }
    return out, written


def split_rows(df: pd.DataFrame, params) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """The split stage on `df` (the clean stage's rows): each split's rows, and the quarantined
    ones."""
    from tasks.classification import split

    _, written = build_on(split, "clean", {"data.parquet": df}, params)
    return {name: written[f"{name}.parquet"] for name in SPLITS}, written["quarantine.parquet"]


def clean_rows(df: pd.DataFrame, params) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The clean stage on `df` (the download stage's rows): kept rows, quarantined rows, label
    conflicts."""
    from tasks.classification import clean

    _, written = build_on(clean, "download", {"data.parquet": df}, params)
    return written["data.parquet"], written["quarantine.parquet"], written["label_conflicts.csv"]
