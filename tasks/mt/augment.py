"""Stage `augment` (task translation): the train split as it is (`aug_method` original). The classification
augmenters rewrite one text; a pair would need both sides rewritten alike."""
from __future__ import annotations

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Section
from tasks.errors import ConfigError
from tasks.io import write_parquet

LIBRARIES = ("pandas", "pyarrow")
FILES: tuple[str, ...] = ()


class Params(Section):
    """The `augment` section of a translation pipeline."""

    method: str = "none"


def build(ctx: BuildContext) -> BuildOutput:
    if ctx.params.method != "none":
        raise ConfigError(f"augment.method {ctx.params.method!r}: task translation takes augment.method none")
    train = pd.read_parquet(ctx.inputs["segment"] / "train.parquet").assign(aug_method="original")
    write_parquet(train, ctx.out / "train.parquet")
    (ctx.out / "train.words.txt").write_text("\n".join(train["words"]) + "\n", encoding="utf-8")
    return BuildOutput(rows=len(train), metrics={"rows_original": len(train), "rows_added": 0},
                       info={**ctx.input_info["segment"], "augment_method_used": "none"})
