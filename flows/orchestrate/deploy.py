"""Prefect deployments from `pipelines.yaml`: `zhpipe deploy` (work pools and workers), `zhpipe
serve` (one long-running process, no work pool), and the per-worker GPU slot the train flow
holds."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from flows.orchestrate.workers import train_deployment
from flows.plan.config import PipelineConfig
from tasks.errors import ZhpipeError

log = logging.getLogger("zhpipe")
# what a worker on another machine needs to reach the same store and tracking server: read from the
# worker's own environment (a flow run inherits it), never written into the deployment, where a
# password in the URL would sit in plain text on the server and in its UI
WORKER_ENV = ("ZHPIPE_PROJECT", "ZHPIPE_STORAGE", "MLFLOW_TRACKING_URI", "ZHPIPE_CACHE")


def schedules(config: PipelineConfig) -> list:
    """The pipeline's Prefect schedules: one, or none (an empty list clears the deployment's
    schedules)."""
    from prefect.schedules import Cron, Interval

    s = config.schedule
    if s is None:
        return []
    if s.cron is not None:
        return [Cron(s.cron, timezone=s.timezone, active=s.active)]
    return [Interval(s.interval, timezone=s.timezone, active=s.active)]


def flow_parameters(config: PipelineConfig, config_file: str | None) -> dict[str, Any]:
    """The deployment's default parameters: the pipeline's name, its project folder and its
    `parameters` section."""
    from flows.plan.project import current

    p = config.parameters
    params: dict[str, Any] = {
        "pipeline": config.name,
        "overrides": p.overrides,
        "stages": p.stages,
        "force": p.force,
        "project_dir": str(current().root),
    }
    if config_file:
        params["config_file"] = config_file
    return params


def job_env() -> dict[str, str]:
    """Environment the deployment adds for its flow-run processes: zhpipe's logger among Prefect's
    (its lines then reach the worker's log and the UI). Nothing secret: storage and tracking come
    from the worker's own environment (WORKER_ENV)."""
    return {"PREFECT_LOGGING_EXTRA_LOGGERS": "zhpipe"}


def job_template() -> dict[str, Any]:
    """The base job template of a pool zhpipe creates: Prefect's process template with the command
    and the environment fixed, so that no deployment or flow run can replace the flow with another
    command or move the store and tracking through job variables (they are not variables any
    more)."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    template["job_configuration"]["command"] = None  # the worker's own `prefect flow-run execute`
    template["job_configuration"]["env"] = job_env()
    template["job_configuration"]["working_dir"] = None
    for fixed in ("command", "env", "working_dir"):
        template["variables"]["properties"].pop(fixed, None)
    return template


def require_server() -> str:
    """The Prefect API URL; deployments need a real server that workers can reach, not a temporary
    one."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise ZhpipeError(
            "no Prefect server: start this project's with `zhpipe server start`, or set "
            "PREFECT_API_URL to another one's"
        )
    return url


def ensure_work_pool(client, name: str) -> bool:
    """Create a process work pool with zhpipe's fixed job template (`job_template`), or give an
    existing process pool that template; True when created."""
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    try:
        pool = client.read_work_pool(name)
    except ObjectNotFound:
        pool = None
    if pool is not None:
        if pool.type != "process":
            raise ZhpipeError(
                f"work pool {name!r} is of type {pool.type!r}; zhpipe deploys to process "
                f"pools (name another pool)"
            )
        if pool.base_job_template != job_template():
            client.update_work_pool(name, WorkPoolUpdate(base_job_template=job_template()))
        return False
    try:
        client.create_work_pool(
            WorkPoolCreate(name=name, type="process", base_job_template=job_template())
        )
    except ObjectAlreadyExists:
        return False
    return True


def deploy(configs: list[PipelineConfig], config_file: str | None = None) -> list[dict[str, Any]]:
    """Create or update each pipeline's deployment (and its train deployment when the train stage
    has a work pool of its own). Idempotent: the file is the truth, so a removed schedule or train
    pool is removed."""
    from prefect import deploy as deploy_all
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.types.entrypoint import EntrypointType

    from flows.orchestrate.pipeline import pipeline_flow, train_flow

    # by module path (flows.orchestrate.pipeline.train_flow): a worker imports the zhpipe it has
    # installed, on any machine and at any path, with no copy of the deploying machine's folder
    common = {
        "entrypoint_type": EntrypointType.MODULE_PATH,
        "job_variables": {},
        "enforce_parameter_schema": False,
    }
    quiet = {
        "build": False,
        "push": False,
        "print_next_steps_message": False,
        "ignore_warnings": True,
    }

    require_server()
    rows = []
    with get_client(sync_client=True) as client:
        for config in configs:
            pools = [config.work_pool] + (
                [config.stages.train.work_pool] if config.stages.train.work_pool else []
            )
            created = [p for p in dict.fromkeys(pools) if ensure_work_pool(client, p)]
            main = pipeline_flow.to_deployment(
                name=config.name,
                schedules=schedules(config),
                parameters=flow_parameters(config, config_file),
                description=config.description or None,
                tags=["zhpipe"],
                **common,
            )
            (deployment_id,) = deploy_all(main, work_pool_name=config.work_pool, **quiet)
            training = config.kind.training
            train_pool = training and config.section(training.name).work_pool
            if train_pool:
                kept = ("pipeline", "project_dir", "config_file", "overrides")
                train = train_flow.to_deployment(
                    name=config.name,
                    schedules=[],
                    tags=["zhpipe", training.name],
                    **common,
                    parameters={
                        k: v for k, v in flow_parameters(config, config_file).items() if k in kept
                    },
                    description=f"train stage of {config.name} (submitted by its pipeline runs)",
                )
                deploy_all(train, work_pool_name=train_pool, **quiet)
            else:  # the file no longer routes training: drop a train deployment left from before
                with contextlib.suppress(ObjectNotFound):
                    stale = client.read_deployment_by_name(train_deployment(config.name))
                    client.delete_deployment(stale.id)
            rows.append(
                {
                    "pipeline": config.name,
                    "deployment": f"zhpipe/{config.name}",
                    "id": str(deployment_id),
                    "work_pool": config.work_pool,
                    "train_pool": train_pool or "",
                    "schedule": describe_schedule(config),
                    "pools_created": created,
                }
            )
    return rows


def describe_schedule(config: PipelineConfig) -> str:
    s = config.schedule
    if s is None:
        return "none"
    what = f"cron '{s.cron}'" if s.cron else f"every {s.interval:g} s"
    return f"{what} ({s.timezone}){'' if s.active else ', paused'}"


def serve(configs: list[PipelineConfig], config_file: str | None = None) -> None:
    """Run the pipelines' schedules from this process (Prefect's runner): no work pool, no
    worker."""
    from prefect import serve as prefect_serve

    from flows.orchestrate.pipeline import pipeline_flow

    deployments = [
        pipeline_flow.to_deployment(
            name=config.name,
            schedules=schedules(config),
            parameters=flow_parameters(config, config_file),
            description=config.description or None,
            tags=["zhpipe", "served"],
        )
        for config in configs
    ]
    prefect_serve(*deployments)
