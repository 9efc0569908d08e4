"""Stage `augment` (task ner): the train split as it is. The classification augmenters (EDA, back-translation)
rewrite characters and would shift the entity tags, so a tagging pipeline takes `augment.method: none`."""
from __future__ import annotations

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Section
from tasks.errors import ConfigError
from tasks.io import write_parquet

LIBRARIES = ("pandas", "pyarrow")
FILES: tuple[str, ...] = ()


class Params(Section):
    """The `augment` section of a ner pipeline."""

    method: str = "none"  # the only method that keeps entity tags in place


def build(ctx: BuildContext) -> BuildOutput:
    """Write `train.parquet` (the segmented train split, `aug_method` original) and `train.words.txt`."""
    if ctx.params.method != "none":
        raise ConfigError(f"augment.method {ctx.params.method!r} rewrites text and would shift entity tags; task ner takes augment.method none")
    train = pd.read_parquet(ctx.inputs["segment"] / "train.parquet").assign(aug_method="original")
    write_parquet(train, ctx.out / "train.parquet")
    (ctx.out / "train.words.txt").write_text("\n".join(train["words"]) + "\n", encoding="utf-8")
    return BuildOutput(rows=len(train), metrics={"rows_original": len(train), "rows_added": 0},
                       info={**ctx.input_info["segment"], "augment_method_used": "none"})
