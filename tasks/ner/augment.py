"""Stage `augment` (task ner): the train split as it is. The classification augmenters (EDA,
back-translation) rewrite characters and would shift the entity tags, so a tagging pipeline takes
`augment.method: none`."""

from __future__ import annotations

from tasks.core import BuildContext, BuildOutput, Section
from tasks.errors import ConfigError
from tasks.shared.as_is import train_as_is

LIBRARIES = ("pandas", "pyarrow")
FILES: tuple[str, ...] = ()


class Params(Section):
    """The `augment` section of a ner pipeline."""

    method: str = "none"  # the only method that keeps entity tags in place


def build(ctx: BuildContext) -> BuildOutput:
    """Write `train.parquet` (the segmented train split, `aug_method` original) and
    `train.words.txt`."""
    if ctx.params.method != "none":
        raise ConfigError(
            f"augment.method {ctx.params.method!r} rewrites text and would shift entity tags; task "
            "ner "
            f"takes augment.method none"
        )
    return train_as_is(ctx)
