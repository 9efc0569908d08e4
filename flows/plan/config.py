"""Validated pipeline configuration: `pipelines.yaml` becomes one pydantic object, loaded once."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, create_model, model_validator

from flows.plan.values import apply_set, read_config, valid_cron
from tasks.core import Section
from tasks.errors import ConfigError
from tasks.shared.checks import Checks
from tasks.source.schema import Source
from tasks.stages import DEFAULT_KIND, KINDS, MODELS, STAGE_NAMES, TaskKind
from tasks.util.urls import conceal

DEFAULT_PIPELINE = "chnsenticorp"


class ScheduleConfig(Section):
    """When a deployed pipeline runs: a cron line in a time zone, or a fixed interval."""

    cron: str | None = None  # e.g. "0 3 * * *"
    interval: float | None = Field(None, gt=0)  # seconds
    timezone: str = "UTC"  # IANA name, e.g. Asia/Shanghai
    active: bool = True

    @model_validator(mode="after")
    def _one_kind(self) -> ScheduleConfig:
        if (self.cron is None) == (self.interval is None):
            raise ValueError("schedule needs exactly one of `cron` or `interval`")
        if self.cron is not None and not valid_cron(self.cron):
            raise ValueError(
                f"schedule.cron: {self.cron!r} is not a valid cron line (minute hour day month "
                "weekday)"
            )
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"schedule.timezone: unknown time zone {self.timezone!r} (expected an IANA name "
                f"such as Asia/Shanghai)"
            ) from None
        return self


class RunParameters(Section):
    """Default parameters of a deployed pipeline's runs (each can be changed per run in the Prefect
    UI)."""

    overrides: list[str] = []  # `--set` assignments, e.g. ["train.epochs=2"]
    stages: list[Literal[STAGE_NAMES]] | None = None  # None = all
    # rebuild these stages and all later ones; [] = all
    force: list[Literal[STAGE_NAMES]] | None = None
    # `--set` keys a run of the deployment may add (glob patterns such as "train.epochs" or
    # "split.*"); none by default. Paths outside the project and URLs are refused even here
    # (flows/orchestrate/guard.py).
    allow_overrides: list[str] = []


class PredictLimits(Section):
    """What the registered model accepts per call (`zhpipe predict` and a served model alike)."""

    # texts per call; more is refused (a served model answers 400)
    max_rows: int = Field(10_000, ge=1)
    # longer texts are cut to this many characters (status `truncated`)
    max_chars: int = Field(5_000, ge=1)


ALERT_EVENTS = (
    "zhpipe.partition.held",
    "zhpipe.check.failed",
    "zhpipe.champion.promoted",
    "zhpipe.champion.kept",
    "zhpipe.run.failed",
)


class Alerts(Section):
    """The project's `alerts:` (top level of pipelines.yaml, beside `pipelines:`): where `zhpipe
    alerts` sends zhpipe's Prefect events. One of a webhook URL (its JSON body: subject, text), a
    Slack webhook URL, or the name of a Prefect notification block made by hand (e-mail, Teams,
    PagerDuty ...)."""

    webhook: str | None = None
    slack: str | None = None
    block: str | None = None
    events: list[Literal[ALERT_EVENTS]] = list(ALERT_EVENTS)
    # a webhook on this machine or the local network (Prefect refuses them by default)
    allow_private_urls: bool = False
    # how long a delivery may take: a webhook slower than this counts as failed and Prefect sends
    # the event again
    timeout_s: float = Field(120, gt=0, le=600)

    @model_validator(mode="after")
    def _one_target(self) -> Alerts:
        given = [k for k in ("webhook", "slack", "block") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of webhook, slack, block (given: {', '.join(given) or 'none'})"
            )
        return self


class PipelineConfig(Section):
    """One pipeline of `pipelines.yaml`, validated. Its `stages` hold one section per stage (each
    stage's `Params`); `load_pipeline` returns an instance of the class `pipeline_model()`
    builds."""

    name: str
    description: str = ""
    # what its MLflow experiment and registered model are named after (`zhpipe-<tracked_as>`): the
    # pipeline's name, or for a run on another corpus (`--source FILE`) `<name>-<file stem>`, so
    # that it never joins the bundled corpus' experiment or competes with its champion
    tracked_as: str | None = None
    # a kind of tasks/stages.py (its stages, models and serving: tasks/<kind>/)
    task: str = DEFAULT_KIND
    source: Source
    stages: Any = None  # the stages' sections of its task kind (see pipeline_model)
    # deployment (`zhpipe deploy`, `zhpipe serve`) and execution; none of these is part of a stage
    # key
    schedule: ScheduleConfig | None = None
    parameters: RunParameters = RunParameters()
    work_pool: str = "zhpipe"  # the pool whose workers run the pipeline flow
    # where chunked stages run: this machine's processes, or a Dask cluster
    executor: Literal["local", "dask"] = "local"
    # scheduler address (tcp://host:8786); None with executor dask = a local cluster
    dask_address: str | None = None
    # stage store root: a folder or an fsspec URL; default data/ (ZHPIPE_STORAGE wins)
    storage: str | None = None
    predict: PredictLimits = PredictLimits()  # travels with the registered model
    # the data checks on each night's cleaned rows (tasks/shared/checks.py): severity and threshold
    # each
    checks: Checks = Checks()
    # `zhpipe tune` search spaces per model: {setting: {low, high, log?, step?} or {choices:
    # [...]}}; a model without one gets flows/orchestrate/tune.py's default
    tune: dict[str, dict[str, dict[str, Any]]] = {}

    @property
    def identity(self) -> str:
        """The name its experiment, registered model and runs go by."""
        return self.tracked_as or self.name

    @property
    def kind(self) -> TaskKind:
        """Its task kind's declaration (tasks/stages.py): stage table, selection metric, its serving
        and scoring hooks."""
        return KINDS[self.task]

    def section(self, stage: str) -> Any:
        """A stage's section of this pipeline's settings (its `Params`)."""
        return getattr(self.stages, stage)

    def per_partition(self, spec) -> bool:
        """Whether stage `spec` is built a unit per partition of this pipeline's source (its
        partitions' units, then one that gathers them)."""
        return spec.partitioned and spec.models is None and self.source.partitioned

    def models(self) -> list[str]:
        """The models this pipeline trains: its training stage's model list (none when its kind
        trains none)."""
        training = self.kind.training
        return list(self.section(training.name).models) if training else []

    def config_hash(self) -> str:
        """Short hash of the resolved config, tagged on every MLflow parent run."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def flat_params(self, used_only: bool = False) -> dict[str, str]:
        """Resolved config as dotted `section.key` strings, for MLflow params; `used_only` leaves
        out the sections of registered models this pipeline does not train (`train.bert.*` without
        bert in train.models) and the settings a section says it does not use (`Section.unused`: a
        method not chosen)."""
        flat = flatten(self.model_dump(mode="json", exclude={"name", "description", "tracked_as"}))
        unused = (
            {f"{name}.{key}." for name in self.kind.stages for key in self.section(name).unused()}
            if used_only
            else set()
        )
        training = self.kind.training
        if used_only and training is not None:
            unused |= {f"{training.name}.{m}." for m in MODELS if m not in self.models()}
        return {
            k.removeprefix("stages."): json.dumps(v, ensure_ascii=False)
            if isinstance(v, list)
            else str(v)
            for k, v in flat.items()
            if not any(k.removeprefix("stages.").startswith(u) for u in unused)
        }


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict with dotted keys."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class _Stages(Section):
    """A kind's stage sections; the kind's rules across sections (`TaskKind.check_stages`) run on
    every change."""

    @model_validator(mode="after")
    def _cross_checks(self):
        check = KINDS[type(self).__name__.removeprefix("StagesConfig_")].check_stages
        if check:
            check(self)
        return self


def _check_task(config: PipelineConfig) -> PipelineConfig:
    """What a task kind needs of the stages (its own `check`, its default models); every kind's
    models are its own and an ensemble's members are trained in the same run."""
    kind = config.kind
    if kind.training is None:
        if kind.check:
            kind.check(config)
        return config
    section, where = config.section(kind.training.name), kind.training.name
    if kind.default_models and "models" not in section.model_fields_set:
        section.models = list(kind.default_models)
    if kind.check:
        kind.check(config)
    # a team's own model is known to the pipelines that declare it, no other
    declared = section.own_models()
    known = [n for n, spec in MODELS.items() if not spec.own or n in declared]
    unknown = [m for m in section.models if m not in known]
    if unknown:
        raise ValueError(
            f"{where}.models: unknown model {unknown[0]!r} (registered: {', '.join(known)})"
        )
    wrong = [m for m in section.models if MODELS[m].task != kind.model_task]
    if wrong:
        fits = ", ".join(n for n in known if MODELS[n].task == kind.model_task)
        raise ValueError(
            f"{where}.models: {wrong[0]} is a {MODELS[wrong[0]].task} model; task {config.task} "
            "takes "
            f"{fits}"
        )
    for name in section.models:
        spec = MODELS[name]
        missing = [
            m
            for m in (spec.members(getattr(section, name)) if spec.members else [])
            if m not in section.models
        ]
        if missing:
            raise ValueError(
                f"{where}.{name}.members: {', '.join(missing)} not in {where}.models "
                "(an ensemble is built from models trained in the same run)"
            )
    return config


def pipeline_model(task: str = DEFAULT_KIND) -> type[PipelineConfig]:
    """The PipelineConfig class of one task kind: a section per stage of its table (each stage's
    `Params`), for the registered models of that kind (a model added to the registry gets its
    section)."""
    return _pipeline_model(task, tuple(MODELS.items()), tuple(KINDS[task].stages.values()))


@lru_cache(maxsize=16)
def _pipeline_model(task: str, models: tuple, stage_table: tuple) -> type[PipelineConfig]:
    sections = {
        stage.name: (section, Field(default_factory=section))
        for stage in stage_table
        for section in (stage.section(),)
    }
    stages = create_model(f"StagesConfig_{task}", __base__=_Stages, **sections)
    return create_model(
        "PipelineConfig",
        __base__=PipelineConfig,
        task=(Literal[task], task),
        stages=(stages, Field(default_factory=stages)),
        __validators__={"_task": model_validator(mode="after")(_check_task)},
    )


RENAMED = {"runner": "executor"}  # keys of older versions: an error that names the key's name now


def _describe(err: ValidationError, where: str, model: type[BaseModel]) -> str:
    """One line per pydantic error: the dotted key, what is wrong and, for unknown keys, what is
    allowed."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    if first["type"] == "extra_forbidden":
        parent = _model_at(model, first["loc"][:-1])
        allowed = ", ".join(parent.model_fields) if parent else "?"
        fields, key = list(parent.model_fields) if parent else [], str(first["loc"][-1])
        close = [RENAMED[key]] if key in RENAMED else difflib.get_close_matches(key, fields, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"{where}: unknown key '{loc}' ({hint}allowed keys: {allowed})"
    if first["type"] == "missing":
        return f"{where}: missing required key '{loc}'"
    return f"{where}: '{loc}': {first['msg']} (got {first.get('input')!r})"


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (
            isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        ):
            return None
        model = field.annotation
    return model


PIPELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def source_identity(name: str, path: str) -> str:
    """`<pipeline>-<file stem>` for a run on another corpus (`--source`): letters, digits and
    dashes, 64 at most."""
    from urllib.parse import urlsplit

    stem = Path(urlsplit(path).path if "://" in path else path).name.split(".")[0]
    slug = (
        "".join(
            c if c.isascii() and (c.isalnum() or c in "-_") else "-" for c in stem.lower()
        ).strip("-_")
        or "source"
    )
    return f"{name}-{slug}"[:64].rstrip("-_.")


def check_name(name: str, where: Path | str) -> None:
    """Pipeline names become MLflow experiments, registered models, deployments and artifact
    keys."""
    if not isinstance(name, str) or not PIPELINE_NAME.fullmatch(name) or ".." in name:
        raise ConfigError(
            f"{where}: pipeline name {name!r} is not allowed (expected letters, digits, '-', '_' "
            "or '.', "
            "starting with a letter or digit, at most 64 characters)"
        )


def conceal_urls(node: Any) -> Any:
    """Every URL with credentials in the raw config replaced by its redacted form; the real one
    stays in this process (tasks.util.urls.reveal) and never reaches MLflow, Prefect, manifests or
    logs."""
    if isinstance(node, dict):
        return {k: conceal_urls(v) for k, v in node.items()}
    if isinstance(node, list):
        return [conceal_urls(v) for v in node]
    return conceal(node) if isinstance(node, str) and "://" in node else node


def load_pipeline(
    name: str,
    config_file: Path | str | None = None,
    overrides: list[str] = (),
    source_overrides: dict[str, Any] | None = None,
) -> PipelineConfig:
    """Read `pipelines.yaml` (default: the current project's), pick one pipeline, apply --set and
    --source overrides, validate."""
    if config_file is None:
        from flows.plan.project import current

        config_file = current().config_file
    config_file = Path(config_file)
    try:
        config_file.stat()
    except OSError as e:
        raise ConfigError(f"cannot read config {config_file}: {e.strerror}") from e
    config = _parse(name, config_file, overrides, source_overrides)
    _check_user_code(config, config_file.resolve().parent)
    return config


def _check_user_code(config: PipelineConfig, project: Path) -> None:
    """Every function of the team's that the pipeline names (clean.rules, checks.custom) found and
    trusted now, as the config is read: a missing module or one another user could write is one line
    before anything runs."""
    from tasks.util.usercode import code_files

    named = [(stage, config.section(stage).user_code()) for stage in config.kind.stages]
    training = config.kind.training
    if training is not None:  # the team's own models: train.<name>.estimator
        own = config.section(training.name).own_models()
        named += [
            (f"{training.name}.{name}.estimator", section.user_code())
            for name, section in own.items()
        ]
    named.append(("checks.custom", config.checks.user_code()))
    for where, refs in named:
        for ref in refs:
            code_files(ref, project, f"{where} {ref}")


def _declared(config_file: Path | str) -> dict:
    """The `pipelines:` mapping of a config file; an unreadable file, bad YAML or another shape is
    one clear error."""
    doc = read_config(config_file) or {}
    pipelines = doc.get("pipelines") if isinstance(doc, dict) else None
    if not isinstance(pipelines, dict):
        raise ConfigError(f"{config_file}: expected a top-level 'pipelines:' mapping")
    return pipelines


def load_alerts(config_file: Path | str) -> Alerts:
    """The `alerts:` section of a config file; missing or wrong is one clear error."""
    doc = read_config(config_file) or {}
    raw = doc.get("alerts") if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{config_file}: no 'alerts:' section (e.g. alerts: {{webhook: "
            f"https://example.org/hook}}); "
            f'see docs/nightly.md, "A night\'s report and alerts"'
        )
    try:
        return Alerts.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_describe(e, f"{config_file} alerts", Alerts)) from e


def _parse(name: str, config_file: Path, overrides, source_overrides) -> PipelineConfig:
    pipelines = _declared(config_file)
    if name not in pipelines:
        raise ConfigError(f"{config_file}: no pipeline '{name}' (declared: {', '.join(pipelines)})")
    check_name(name, config_file)
    raw = json.loads(json.dumps(pipelines[name]))  # deep copy; YAML anchors resolved
    raw["name"] = name
    if source_overrides:  # --source first, so that `--set source.sha256=...` applies to it
        # how the pipeline's corpus is read (its columns, its tag scheme) carries over to the other
        # file unless given
        kept = {
            k: v
            for k, v in (raw.get("source") or {}).items()
            if k in ("text_column", "label_column", "tag_scheme")
        }
        raw["source"] = {**kept, **{k: v for k, v in source_overrides.items() if v is not None}}
        raw["tracked_as"] = source_identity(name, str(raw["source"].get("path") or ""))
    for assignment in overrides:
        apply_set(raw, assignment)
    raw = conceal_urls(raw)
    task = raw.get("task", DEFAULT_KIND)
    if not isinstance(task, str) or task not in KINDS:
        raise ConfigError(
            f"{config_file} pipeline '{name}': 'task': unknown task kind {task!r} (expected one of "
            f"{', '.join(KINDS)})"
        )
    model = pipeline_model(task)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(
            _describe(e, _blamed(e, overrides) or f"{config_file} pipeline '{name}'", model)
        ) from e


def _blamed(err: ValidationError, overrides: list[str]) -> str | None:
    """`--set KEY=VALUE` when the first error is in what that override set (a typo on the command
    line is not the file's fault); None when it is in the file."""
    loc = tuple(str(p) for p in err.errors()[0]["loc"])
    for assignment in overrides:
        parts = tuple(assignment.split("=", 1)[0].strip().split("."))
        path = parts if parts[0] == "source" else ("stages", *parts)
        if loc[: len(path)] == path or path[: len(loc)] == loc:
            return f"--set {assignment}"
    return None


def list_pipelines(config_file: Path | str) -> dict[str, str]:
    """Pipeline names and descriptions declared in the config file, in file order."""
    pipelines = _declared(config_file)
    for name in pipelines:
        check_name(name, config_file)
    return {
        k: (v or {}).get("description", "") if isinstance(v, dict) else ""
        for k, v in pipelines.items()
    }
