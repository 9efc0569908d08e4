"""Stage `augment` (task translation): the train split as it is (`aug_method` original). The
classification augmenters rewrite one text; a pair would need both sides rewritten alike."""

from __future__ import annotations

from tasks.core import BuildContext, BuildOutput, Section
from tasks.errors import ConfigError
from tasks.shared.as_is import train_as_is

LIBRARIES = ("pandas", "pyarrow")
FILES: tuple[str, ...] = ()


class Params(Section):
    """The `augment` section of a translation pipeline."""

    method: str = "none"


def build(ctx: BuildContext) -> BuildOutput:
    if ctx.params.method != "none":
        raise ConfigError(
            f"augment.method {ctx.params.method!r}: task translation takes augment.method none"
        )
    return train_as_is(ctx)
