"""What a logged model requires (the packages its code imports, pinned to this environment's
versions), and MLflow's check of those requirements made cheap around zhpipe's own logging and
loading of models."""

from __future__ import annotations

import threading
from contextlib import contextmanager

# what every served model imports, whatever its family: zhpipe's serving code and what it reads
PACKAGES = (
    "mlflow",
    "pandas",
    "pyarrow",
    "numpy",
    "jieba",
    "pydantic",
    "pyyaml",
    "opencc",
    "prefect",
    "filelock",
)


def pinned(libraries: tuple[str, ...] = ()) -> list[str]:
    """The packages a logged model's code imports (`PACKAGES` and its family's `libraries`, declared
    once on its `ModelSpec`), pinned to this environment's versions (distribution names)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in dict.fromkeys((*PACKAGES, *libraries)):
        try:
            out.append(f"{name}=={version(name).split('+')[0]}")
        except PackageNotFoundError:
            continue
    return out


def model_libraries(config, model: str) -> tuple[str, ...]:
    """What a model of `config` needs besides `PACKAGES`: its train stage's libraries, its family's,
    and those of the members it is built from (an ensemble)."""
    from tasks.stages import MODELS

    stage, spec = config.kind.training, MODELS.get(model)
    own = stage.libraries if stage is not None else ()
    if spec is None:  # a model a kind logs that no family registers (a toy kind's rule)
        return tuple(own)
    section = config.section(stage.name) if stage is not None and spec.members else None
    members = spec.members(getattr(section, model)) if section is not None else []
    return tuple(
        dict.fromkeys((*own, *spec.libraries, *(n for m in members for n in MODELS[m].libraries)))
    )


_LOCK = threading.Lock()
_INSIDE = {"blocks": 0, "map": None}  # the blocks open now, and the map they gave MLflow


@contextmanager
def by_name():
    """Around zhpipe's own logging and loading of a model. Each time MLflow logs or loads one, it
    compares the model's requirements with the installed versions, and the first time in a process
    it first maps every installed module to the distributions that provide it
    (`importlib.metadata.packages_distributions()`: every file of every installed distribution,
    about 0.5 s). The map is only a fallback, for a requirement MLflow cannot find as a distribution
    by its name; zhpipe's requirements are distribution names (`pinned`), and so are the pip
    requirements of any MLflow model. So within these blocks MLflow starts from its own entries of
    that map: the comparison still runs, by name, and warns as before. When the last block open
    ends, the map is as it was (MLflow builds the whole of it when something else asks). Without the
    names this expects (another MLflow release), nothing changes."""
    try:
        from mlflow.utils import requirements_utils as reqs
    except ImportError:
        reqs = None
    with _LOCK:
        if (
            _INSIDE["blocks"] == 0
            and reqs is not None
            and getattr(reqs, "_MODULES_TO_PACKAGES", False) is None
            and isinstance(getattr(reqs, "MLFLOW_MODULES_TO_PACKAGES", None), dict)
        ):
            _INSIDE["map"] = reqs._MODULES_TO_PACKAGES = dict(reqs.MLFLOW_MODULES_TO_PACKAGES)
        _INSIDE["blocks"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _INSIDE["blocks"] -= 1
            if _INSIDE["blocks"] == 0 and _INSIDE["map"] is not None:
                if reqs._MODULES_TO_PACKAGES is _INSIDE["map"]:
                    reqs._MODULES_TO_PACKAGES = None
                _INSIDE["map"] = None
