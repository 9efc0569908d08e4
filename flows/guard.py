"""What a deployment run may change. A run started through the Prefect API or UI can set any parameter;
only the pipeline's own file decides what is safe. A run of a deployment may change:

- `overrides` that match the pipeline's `parameters.allow_overrides` patterns (none by default), whose
  values name no path outside the project and no URL;
- `stages`, `force` and `verify`, and (for the train flow) the MLflow parent run id.

Everything that chooses where data comes from or goes to (`source`, `storage`, `dask`, `config_file`,
`project_dir`, `pipeline`) is fixed by the deployment. Runs outside a deployment (the CLI, the Python API)
are the user's own and are not checked.
"""
from __future__ import annotations

import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from tasks.errors import ConfigError

FIXED = ("pipeline", "source", "storage", "dask", "config_file", "project_dir")
FREE = ("stages", "force", "verify")
RUN_ID = re.compile(r"[0-9a-f]{32}")


def deployment_defaults() -> dict[str, Any] | None:
    """The running deployment's own parameters, or None outside a deployment run."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.runtime import deployment

    if deployment.id is None:
        return None
    # prefect.runtime.deployment.parameters are the run's own; the deployment's are read from the server
    with get_client(sync_client=True) as client:
        return dict(client.read_deployment(UUID(deployment.id)).parameters or {})


def check_run(params: dict[str, Any], defaults: dict[str, Any] | None = None) -> None:
    """Refuse, in one line naming them, the parameters of a deployment run that it may not set."""
    defaults = deployment_defaults() if defaults is None else defaults
    if defaults is None:
        return
    refused = [name for name in FIXED if _norm(params.get(name)) != _norm(defaults.get(name))]
    if refused:  # decided before anything of the run's choosing is read
        _refuse(refused)
    run_id = params.get("parent_run_id")
    if run_id is not None and not RUN_ID.fullmatch(str(run_id)):
        refused.append("parent_run_id")
    refused += [f"overrides[{o}]" for o in refused_overrides(params, defaults)]
    if refused:
        _refuse(refused)


def _refuse(refused: list[str]) -> None:
    raise ConfigError(f"deployment run refused: it may not set {', '.join(refused)} (a deployment runs what pipelines.yaml "
                          "declares; allow overrides with `parameters.allow_overrides` in the pipeline)")


def refused_overrides(params: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """The run's overrides beyond the deployment's own that the pipeline does not allow, or whose values
    reach outside the project."""
    from flows.config import load_pipeline
    from flows.project import Project

    own = list(defaults.get("overrides") or [])
    extra = [o for o in params.get("overrides") or [] if o not in own]
    if not extra:
        return []
    project = Project(Path(defaults["project_dir"])) if defaults.get("project_dir") else None
    if project is None:
        from flows.project import current

        project = current()
    file = defaults.get("config_file") or project.config_file
    allowed = load_pipeline(defaults.get("pipeline") or params.get("pipeline"), file, own).parameters.allow_overrides
    root = project.root.resolve()
    out = []
    for assignment in extra:
        dotted, _, value = str(assignment).partition("=")
        if not any(fnmatchcase(dotted.strip(), pattern) for pattern in allowed) or _escapes(value.strip(), root):
            out.append(dotted.strip() or str(assignment))
    return out


def _escapes(value: str, root: Path) -> bool:
    """A value that is a URL, or a path that resolves outside the project folder."""
    if "://" in value or value.startswith("~"):
        return True
    if "/" in value or "\\" in value or value.startswith("."):
        path = Path(value)
        return not (path if path.is_absolute() else root / path).resolve().is_relative_to(root)
    return False


def _norm(value: Any) -> Any:
    return None if value in ("", [], {}) else value
