"""Model families from installed packages: the entry-point group `zhpipe.models`.

A distribution registers families as entry points whose object is a `ModelSpec` or a sequence of
them (the model protocol: tasks/models/base.py, docs/extending.md). zhpipe's own families are
registered the same way (its pyproject.toml names each kind's `SPECS`), so a team's package and
zhpipe itself meet one protocol. Each spec joins the models of the kind its `task` names: its
`train.<name>` section, `zhpipe models`, `train.models`.

A family's module is loaded only when no other user could have written it
(`tasks.util.private.not_trusted`); a name taken by another family, a kind that does not exist, or
an object that is not a spec is one line naming the entry point."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from importlib.metadata import EntryPoint, entry_points

from tasks.errors import ConfigError
from tasks.models.base import ModelSpec

GROUP = "zhpipe.models"

# model name -> where it comes from ("zhpipe", or "<distribution> (<entry point>)")
FOUND: dict[str, str] = {}


def _where(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    name = dist.metadata["Name"] if dist is not None else "?"
    return "zhpipe" if name == "zhpipe" else f"{name} ({ep.name} = {ep.value})"


def _trusted(ep: EntryPoint) -> None:
    import importlib.util
    from pathlib import Path

    from tasks.util.private import not_trusted

    spec = importlib.util.find_spec(ep.module)
    if spec is not None and spec.origin and (why := not_trusted(Path(spec.origin))):
        raise ConfigError(f"entry point {ep.name} = {ep.value} (group {GROUP}): {why}; not loaded")


def specs_of(ep: EntryPoint) -> list[ModelSpec]:
    """The specs an entry point registers, its module trust-checked before it is imported (zhpipe's
    own are the program that runs: a served model's process imports them from the code logged with
    it)."""
    if _where(ep) != "zhpipe":
        _trusted(ep)
    try:
        found = ep.load()
    except Exception as e:  # noqa: BLE001 - a package's module may raise anything while it imports
        from tasks.util.usercode import last_line

        raise ConfigError(
            f"entry point {ep.name} = {ep.value} (group {GROUP}) failed to load: {last_line(e)}"
        ) from None
    specs = list(found) if isinstance(found, (list, tuple)) else [found]
    bad = [s for s in specs if not isinstance(s, ModelSpec)]
    if bad:
        raise ConfigError(
            f"entry point {ep.name} = {ep.value} (group {GROUP}): {type(bad[0]).__name__} is not a "
            f"ModelSpec (tasks.models.ModelSpec: docs/extending.md)"
        )
    return specs


def register(kinds: Mapping[str, MutableMapping[str, ModelSpec]]) -> None:
    """Every family of the `zhpipe.models` group into the models of its kind (`kinds`: kind name ->
    its models by name). A spec already there as the same object (zhpipe's own, imported with its
    kind) is only recorded."""
    for ep in sorted(entry_points(group=GROUP), key=lambda e: (_where(e) != "zhpipe", e.name)):
        where = _where(ep)
        for spec in specs_of(ep):
            models = kinds.get(spec.task)
            if models is None:
                raise ConfigError(
                    f"entry point {ep.name} = {ep.value}: model {spec.name} is of task "
                    f"{spec.task!r}, "
                    f"which is no kind of zhpipe ({', '.join(kinds)})"
                )
            known = next((m.get(spec.name) for m in kinds.values() if spec.name in m), None)
            if known is not None and known is not spec:
                raise ConfigError(
                    f"entry point {ep.name} = {ep.value}: the model name {spec.name} is taken (by "
                    f"{FOUND.get(spec.name, 'zhpipe')}); name the family's model otherwise"
                )
            models[spec.name] = spec
            FOUND[spec.name] = where
