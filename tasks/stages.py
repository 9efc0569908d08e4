"""The plan of the house: every task kind, gathered from its package (tasks/classification,
tasks/ner, tasks/translation: its stage table and declaration), and the names the CLI accepts. A
stage is a `Stage`, a kind a `TaskKind` (tasks/graph.py); `flows/` derives the CLI's stage names,
the key plan, the Prefect wiring, `status`, the run summary and `api.load` from these tables. The
stages hold their functions, so it imports every kind's stage modules (pandas, pyarrow, pydantic:
about 0.3 s; their heavier libraries inside the functions); the CLI reads it to parse arguments."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from types import ModuleType

from tasks import classification, ner, translation
from tasks.graph import SELECTS, SPLITS, TRAINS, Output, PerModel, Stage, TaskKind, graph
from tasks.models import families
from tasks.models.base import ModelSpec

KINDS: dict[str, TaskKind] = {k.KIND.name: k.KIND for k in (classification, ner, translation)}
DEFAULT_KIND = next(iter(KINDS))  # a pipeline's `task:` when it names none
CLASSIFICATION_STAGES = classification.STAGES
# every stage name of every kind, in graph order: what the CLI's --from/--to/--only/--force accept
STAGE_NAMES = tuple(dict.fromkeys(name for k in KINDS.values() for name in k.stages))
# every kind's models by name, in the kinds' order: what `train.models` names and the CLI lists (a
# live view of each kind's own `models`, so a model added to a kind is here too)
MODELS: Mapping[str, ModelSpec] = ChainMap(*reversed([k.models for k in KINDS.values()]))
# and the families installed packages register (entry points `zhpipe.models`:
# tasks/models/families.py), each into the models of its kind
families.register({name: k.models for name, k in KINDS.items()})


def kind(name: str) -> TaskKind:
    """The declaration of a task kind; an unknown name is one clear error."""
    from tasks.errors import ConfigError

    if name not in KINDS:
        raise ConfigError(f"unknown task {name!r} (task kinds: {', '.join(KINDS)})")
    return KINDS[name]


def model(name: str) -> ModelSpec:
    """The spec of a registered model (of any kind); an unknown name is one clear error."""
    from tasks.errors import ConfigError

    if name not in MODELS:
        raise ConfigError(f"unknown model '{name}' (registered: {', '.join(MODELS)})")
    return MODELS[name]


def serving(task: TaskKind) -> ModuleType:
    """The module that serves a kind's registered models (its own `serving`, else that of the kind
    whose models it trains): what tasks/serving.py describes."""
    return task.serving or serving(kind(task.models_of))


__all__ = [
    "CLASSIFICATION_STAGES",
    "DEFAULT_KIND",
    "KINDS",
    "MODELS",
    "SELECTS",
    "SPLITS",
    "STAGE_NAMES",
    "TRAINS",
    "Output",
    "PerModel",
    "Stage",
    "TaskKind",
    "graph",
    "kind",
    "model",
    "serving",
]
