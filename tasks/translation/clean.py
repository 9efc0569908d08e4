"""Stage `clean` (task translation): both sides of every pair normalised as the classification clean
stage normalises text (NFKC, HTML, URLs, control characters, white space; OpenCC t2s on the Chinese
side only), then pairs quarantined with their reason: an empty or over-long side, a length ratio no
translation has (a misaligned pair), or a repeat of an earlier pair."""

from __future__ import annotations

import pandas as pd
from pydantic import Field

from tasks.core import BuildContext, BuildOutput
from tasks.errors import DataError
from tasks.shared import normalise as clean
from tasks.util.io import write_parquet

LIBRARIES = ("pandas", "pyarrow", "opencc")
FILES: tuple[str, ...] = ()


class Params(clean.Normalise):
    """The `clean` section of a translation pipeline (the limits apply to each side, in
    characters)."""

    min_chars: int = Field(1, ge=0)
    max_chars: int = Field(500, ge=1)
    # English characters per Chinese character outside [min_ratio, max_ratio]: the two sides do not
    # match
    min_ratio: float = Field(0.5, gt=0)
    max_ratio: float = Field(12.0, gt=0)


def clean_pairs(df: pd.DataFrame, p: Params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kept pairs, quarantined pairs with `reason`), in id order."""
    english = p.model_copy(update={"traditional_to_simplified": False})
    df = df.assign(raw_text=df["text"], raw_en=df["en"])
    df["text"] = [clean.clean_text(t, p) for t in df["text"].astype(str)]
    df["en"] = [clean.clean_text(t, english) for t in df["en"].astype(str)]
    reason = clean.length_reasons(df["text"], p)
    en_reason = clean.length_reasons(df["en"], p)
    reason = reason.fillna(("en_" + en_reason).astype("string"))
    ratio = df["en"].str.len() / df["text"].str.len().clip(lower=1)
    reason[reason.isna() & ((ratio < p.min_ratio) | (ratio > p.max_ratio))] = "length_ratio"
    if p.dedupe:
        dup = df[reason.isna()].duplicated(subset=["text", "en"], keep="first")
        reason[dup[dup].index] = "duplicate"
    kept = df[reason.isna()].drop(columns=["raw_text", "raw_en"]).reset_index(drop=True)
    return kept, df[reason.notna()].assign(reason=reason[reason.notna()]).reset_index(drop=True)


def build(ctx: BuildContext) -> BuildOutput:
    """Write `data.parquet` (the kept pairs) and `quarantine.parquet` (the others, with the raw
    sides and reason)."""
    df = pd.read_parquet(ctx.file("download", "data.parquet"))
    kept, quarantine = clean_pairs(df, ctx.params)
    if kept.empty:
        raise DataError(
            f"clean: no pair of {len(df)} is left ({quarantine['reason'].value_counts().to_dict()})"
        )
    write_parquet(kept, ctx.out / "data.parquet")
    write_parquet(quarantine, ctx.out / "quarantine.parquet")
    reasons = quarantine["reason"].value_counts().to_dict()
    metrics = {"rows_in": len(df), "rows_kept": len(kept), "rows_dropped": len(quarantine)} | {
        f"dropped_{k}": v for k, v in reasons.items()
    }
    return BuildOutput(
        rows=len(kept),
        metrics=metrics,
        tables={"quarantine_sample.json": quarantine.head(1000).astype(str)}
        if len(quarantine)
        else {},
    )
