"""What a deployment run may change. A run started through the Prefect API or UI can set any
parameter; only the pipeline's own file decides what is safe. A run of a deployment may change:

- `overrides` that match the pipeline's `parameters.allow_overrides` patterns (none by default),
  whose values, parsed exactly as the config parses them, hold no path outside the project, no `~`,
  no URL and no `*_env` key, at any depth;
- `stages`, `force` and `verify`, and (for the train flow) the MLflow parent run id.

Everything that chooses where data comes from or goes to (`source`, `storage`, `dask`,
`config_file`, `project_dir`, `pipeline`) is fixed by the deployment (the train flow on a worker
with ZHPIPE_PROJECT runs in that folder, whatever `project_dir` says). The train flow's
`source_fingerprint` only names keys, which are content addresses: a wrong one finds no inputs in
the store. What is allowed is read from the worker's own pipelines.yaml, never from values the
Prefect server holds (a PATCHed deployment cannot widen it). Runs outside a deployment (the CLI, the
Python API) are the user's own and are not checked.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from tasks.errors import ConfigError

FIXED = ("pipeline", "source", "storage", "dask", "config_file", "project_dir")
RUN_ID = re.compile(r"[0-9a-f]{32}")


def deployment_defaults() -> dict[str, Any] | None:
    """What the running deployment may run, from this machine's pipelines.yaml, or None outside a
    deployment run. The server names the deployment (its name is its pipeline's) and where the
    project is; the parameters are then computed from the file, as `zhpipe deploy` computed them."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    # the flow run as the engine read it (`prefect.runtime.deployment.id` reads it from the server
    # again when it has no deployment: a tenth of a second of every command-line run)
    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    if flow_run is None or flow_run.deployment_id is None:
        return None
    with get_client(sync_client=True) as client:
        server = client.read_deployment(flow_run.deployment_id)
    return expected_parameters(server.name, dict(server.parameters or {}))


def expected_parameters(name: str, server: dict[str, Any]) -> dict[str, Any]:
    """The deployment parameters `zhpipe deploy` writes for pipeline `name`, read from the project's
    own file: the project folder (ZHPIPE_PROJECT on the worker wins over the server's
    `project_dir`)."""
    import os

    from flows.plan.config import load_pipeline
    from flows.plan.project import Project

    folder = os.environ.get("ZHPIPE_PROJECT") or server.get("project_dir")
    if not folder:
        raise ConfigError(
            f"deployment run refused: deployment {name!r} names no project folder (project_dir) "
            "and "
            "ZHPIPE_PROJECT is unset on the worker"
        )
    project = Project(Path(folder))
    config_file = server.get("config_file")
    config = load_pipeline(name, config_file or project.config_file)
    p = config.parameters
    # project_dir: the deployment's own (a worker with a checkout of its own, ZHPIPE_PROJECT, runs
    # there whatever the deploying machine's folder was; a run may still not change it)
    expected = {
        "pipeline": config.name,
        "overrides": p.overrides,
        "stages": p.stages,
        "force": p.force,
        "project_dir": server.get("project_dir") or str(project.root),
        "allow_overrides": p.allow_overrides,
    }
    if config_file:
        expected["config_file"] = config_file
    return expected


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
    raise ConfigError(
        f"deployment run refused: it may not set {', '.join(refused)} (a deployment runs what "
        f"pipelines.yaml "
        "declares; allow overrides with `parameters.allow_overrides` in the pipeline)"
    )


def refused_overrides(params: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """The run's overrides beyond the deployment's own that the pipeline does not allow, or whose
    values reach outside the project."""
    from flows.plan.config import load_pipeline
    from flows.plan.project import Project

    own = list(defaults.get("overrides") or [])
    extra = [o for o in params.get("overrides") or [] if o not in own]
    if not extra:
        return []
    project = Project(Path(defaults["project_dir"])) if defaults.get("project_dir") else None
    if project is None:
        from flows.plan.project import current

        project = current()
    allowed = defaults.get("allow_overrides")
    if allowed is None:
        file = defaults.get("config_file") or project.config_file
        allowed = load_pipeline(
            defaults.get("pipeline") or params.get("pipeline"), file, own
        ).parameters.allow_overrides
    root = project.root.resolve()
    out = []
    for assignment in extra:
        dotted, _, value = str(assignment).partition("=")
        if not any(fnmatchcase(dotted.strip(), pattern) for pattern in allowed) or _unsafe(
            value, root
        ):
            out.append(dotted.strip() or str(assignment))
    return out


def _unsafe(value: str, root: Path) -> bool:
    """A value that, parsed as the config parses it, holds a URL, a path outside the project or a
    `*_env` key anywhere in it (an unparseable value is unsafe too)."""
    from flows.plan.values import parse_value, string_leaves

    try:
        parsed = parse_value(value)
    except ConfigError:
        return True
    if isinstance(parsed, dict | list):
        from flows.plan.values import mapping_keys as _mapping_keys

        if any(k.endswith("_env") for k in _mapping_keys(parsed)):
            return True
    return any(_escapes(leaf.strip(), root) for leaf in string_leaves(parsed))


def _escapes(value: str, root: Path) -> bool:
    """A value that is a URL, or a path that resolves outside the project folder (through `..` or a
    symlink)."""
    if "://" in value or ":/" in value or value.startswith("~") or value.startswith("\\\\"):
        return True
    if "/" in value or "\\" in value or value.startswith("."):
        path = Path(value)
        try:
            return not (path if path.is_absolute() else root / path).resolve().is_relative_to(root)
        except (OSError, RuntimeError):  # a symlink loop
            return True
    return False


def _norm(value: Any) -> Any:
    return None if value in ("", [], {}) else value
