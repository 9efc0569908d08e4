"""The key plan: every stage's and model unit's key causes (params, inputs' keys, code, libraries,
the files its params name), computed from the config alone, so `status` needs no run. Neither
Prefect nor MLflow: a key that needs a registered model's version is given the lookup
(`registry`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from flows.plan import project
from flows.plan.config import PipelineConfig
from flows.plan.fingerprint import code_fingerprint, file_fingerprints, library_versions
from flows.plan.sources import partition_source, partitions, source_fingerprint
from flows.plan.store import stage_key
from tasks.core import Unit, model_unit, partition_unit
from tasks.source.origin import Origin
from tasks.stages import MODELS
from tasks.util.io import atomic_write_text

# a registered model's URI (models:/name@alias) -> `<name>/<version>`; raises ZhpipeError
Registry = Callable[[str], str]


def stage_params(config: PipelineConfig, stage: str) -> dict[str, Any]:
    """The resolved parameters that define one stage's output (a stage that reads the source,
    needing no other stage, includes the source); never the settings its chosen options leave
    unread (`Section.unused`: back-translation's, for an EDA augment)."""
    section = config.section(stage)
    params = section.model_dump(mode="json", exclude={*section.OUTSIDE_KEY, *section.unused()})
    if not config.kind.stages[stage].needs:
        params = {"source": config.source.model_dump(mode="json"), **params}
    return params


def key_causes(
    config: PipelineConfig, unit: str, inputs: dict[str, str], registry: Registry | None = None
) -> dict[str, Any]:
    """Everything a stage's or model unit's key hashes: its params, its inputs' keys (the source's
    sha256 for download), the code that computes it, the libraries that shape it and the contents of
    the files its params name. A model unit (`train.<model>`, `evaluate.<model>`) sees its stage's
    code and its own model family's, never another family's, and only the files its own section
    names."""
    unit = Unit.parse(unit)
    stage, model, part = unit.stage, unit.model, unit.part
    spec = config.kind.stages[stage]
    params = unit_params(config, unit)
    module, files, libraries = spec.module_name, spec.files, spec.libraries
    # it concatenates its partitions
    if config.per_partition(spec) and not part and not spec.gather:
        from tasks.shared import partitions as gather

        module, files, libraries = gather.__name__, (), gather.LIBRARIES
    code = code_fingerprint(module)
    if model:
        code = {
            **code_fingerprint(module, skip="tasks.models"),
            **code_fingerprint(MODELS[model].train.__module__),
        }
        files = tuple(f for f in files if f.startswith(f"{model}."))
        libraries = (*libraries, *MODELS[model].libraries)
    section = config.section(stage)
    # the libraries of settings the chosen options leave unread (back-translation's, for EDA)
    left = {lib for name in section.unused() for lib in section.LIBRARIES_OF.get(name, ())}
    libraries = tuple(name for name in libraries if name not in left)
    refs = (
        getattr(section, model).user_code()
        if model and model in section.own_models()
        else (section.user_code())
    )
    # the team's own code (clean.rules): its files by their path in the project, as zhpipe's own
    # modules
    if refs:
        from tasks.util.usercode import fingerprint as user_code

        code = {**code, **user_code(refs, project.current().root, stage)}
    return {
        "stage": unit,
        "params": params,
        "inputs": inputs,
        "code": code,
        "libraries": library_versions(libraries),
        "files": file_fingerprints(
            params, files, project.current().root, section=stage, registry=registry
        ),
    }


def model_units(config: PipelineConfig, stage: str) -> list[Unit]:
    """The units of a per-model stage: `<stage>.<model>` for each model the pipeline trains,
    ensembles after the models they are built from."""
    return [
        model_unit(stage, name)
        for name in sorted(config.models(), key=lambda n: MODELS[n].members is not None)
    ]


def training_order(config: PipelineConfig, stage: str) -> list[Unit]:
    """The model units of a training stage in the order a budget runs them: cheapest first, the
    ensembles last."""
    return sorted(
        model_units(config, stage),
        key=lambda u: (MODELS[u.model].members is not None, MODELS[u.model].cost),
    )


def members_of(config: PipelineConfig, model: str) -> list[str]:
    """The models an ensemble is built from (none for other models)."""
    spec = MODELS[model]
    return (
        spec.members(getattr(config.section(config.kind.training.name), model))
        if spec.members
        else []
    )


def unit_params(config: PipelineConfig, unit: str) -> dict[str, Any]:
    """The params that define a stage's or a model unit's output. A model unit of the training stage
    sees the shared settings its model declares it reads (`ModelSpec.shared`) and its own section,
    never another model's; the training stage itself only the model list."""
    unit = Unit.parse(unit)
    stage, model, part = unit.stage, unit.model, unit.part
    spec = config.kind.stages[stage]
    if part and not spec.needs:  # a partition of the source: its file, and its place in the order
        ordinal = [p.name for p in partitions(config)].index(part)
        return {
            **stage_params(config, stage),
            "source": partition_source(config, part).model_dump(mode="json"),
            "partition": part,
            "ordinal": ordinal,
        }
    cut = not_trained(config) if spec.per_model and not model else {}
    # a stage that gathers the models, run without those the training budget left no time for
    if cut:
        return {**_unit_params(config, spec, stage), "not_trained": sorted(cut)}
    return _unit_params(config, spec, stage, model)


def not_trained(config: PipelineConfig) -> dict[str, str]:
    """The models of the pipeline's list that this run's training budget left no time for, and
    why."""
    training = config.kind.training
    return getattr(config.section(training.name), "not_trained", dict)() if training else {}


def _unit_params(
    config: PipelineConfig, spec, stage: str, model: str | None = None
) -> dict[str, Any]:
    if spec.per_model and spec.models.trains:
        every = stage_params(config, stage)
        if not model:
            return {"models": every["models"]}
        declared = MODELS[model].shared
        budgeted = every.get("budget") is not None or every.get("model_budget") is not None
        # a budget may fit it on fewer rows
        if budgeted and training_order(config, stage)[0].model == model:
            declared = None if declared is None else (*declared, "budget", "model_budget")
        shared = {
            k: v
            for k, v in every.items()
            if k not in MODELS and k != "models" and (declared is None or k in declared)
        }
        return {**shared, model: every[model]}
    return stage_params(config, stage)


def plan(
    config: PipelineConfig,
    origin: Origin | None = None,
    registry: Registry | None = None,
    source: str | None = None,
) -> dict[Unit, dict[str, Any]]:
    """Every stage's and model unit's key causes, computed from the config alone (so `status` needs
    no run). Each model is a unit of its own (`train.<model>`, `evaluate.<model>`); the train and
    evaluate stages gather their units, so a change to one model's params rebuilds that model and
    the comparison only. `source`: the source's fingerprint as another machine computed it (a worker
    that trains from the store has no corpus)."""
    causes: dict[Unit, dict[str, Any]] = {}
    parts = partitions(config)
    for spec in config.kind.stages.values():
        stage = Unit(spec.name)
        # a unit per partition, then the stage that gathers them in order
        if parts and spec.partitioned:
            for i, part in enumerate(parts):
                unit = partition_unit(spec.name, part.name)
                unit_inputs = {
                    d: stage_key(causes[partition_unit(d, part.name)]) for d in spec.needs
                } or {"source": part.fingerprint()}
                # it reads every earlier partition's output (clean: deduplication across them)
                if spec.cumulative:
                    earlier = [partition_unit(spec.name, q.name) for q in parts[:i]]
                    unit_inputs |= {u: stage_key(causes[u]) for u in earlier}
                causes[unit] = key_causes(config, unit, unit_inputs, registry)
            gathered = [partition_unit(spec.name, p.name) for p in parts]
            causes[stage] = key_causes(
                config, stage, {u: stage_key(causes[u]) for u in gathered}, registry
            )
            continue
        inputs = (
            {d: stage_key(causes[d]) for d in spec.needs}
            if spec.needs
            else {"source": source or source_fingerprint(config, origin)}
        )
        if spec.per_model:
            for unit in model_units(config, spec.name):
                model = unit.model
                unit_inputs = {d: k for d, k in inputs.items() if spec.reads(d, MODELS[model])}
                if spec.models.trains:  # an ensemble reads its members' units
                    unit_inputs |= {
                        model_unit(spec.name, m): stage_key(causes[model_unit(spec.name, m)])
                        for m in members_of(config, model)
                    }
                # the same model's unit
                unit_inputs |= {
                    r: stage_key(causes[model_unit(r, model)]) for r in spec.models.reads
                }
                causes[unit] = key_causes(config, unit, unit_inputs, registry)
            inputs = {unit: stage_key(causes[unit]) for unit in model_units(config, spec.name)}
        causes[stage] = key_causes(config, stage, inputs, registry)
    return causes


def plan_keys(config: PipelineConfig, registry: Registry | None = None) -> dict[Unit, str]:
    """Every stage's key, computed from the config alone."""
    return {stage: stage_key(c) for stage, c in plan(config, registry=registry).items()}


# ---- the training budget's decisions, kept as a unit's output is ---------------------------------

# in the store's shared folder: training key and budget -> the models it left untrained
CUTS = "budget-cuts.json"


def _cut_key(config: PipelineConfig, keys: dict[str, str]) -> str | None:
    training = config.kind.training
    section = config.section(training.name) if training else None
    if section is None or (
        getattr(section, "budget", None) is None and getattr(section, "model_budget", None) is None
    ):
        return None
    return f"{keys.get(training.name)}|{section.budget}|{section.model_budget}"


def recorded_cut(store, config: PipelineConfig, keys: dict[str, str]) -> dict[str, str]:
    """The models a run of the same training (its key, its budget) left untrained, and why: a rerun
    keeps that decision as it keeps any output, so that a fully cached run stays cached (`--force
    train`, another budget or other settings try them again)."""
    key = _cut_key(config, keys)
    if key is None:
        return {}
    try:
        cut = json.loads(store.cache_file(CUTS).read_text(encoding="utf-8")).get(key, {})
    except (OSError, ValueError, AttributeError):
        return {}
    return (
        {m: str(w) for m, w in cut.items() if m in config.models()} if isinstance(cut, dict) else {}
    )


def record_cut(store, config: PipelineConfig, keys: dict[str, str], cut: dict[str, str]) -> None:
    """Keep what the budget left untrained for the training planned with `keys` (the last 500
    decisions)."""
    key = _cut_key(config, keys)
    if key is None:
        return
    path = store.cache_file(CUTS)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    record = {k: v for k, v in record.items() if k != key} if isinstance(record, dict) else {}
    record[key] = cut
    atomic_write_text(path, json.dumps(dict(list(record.items())[-500:]), ensure_ascii=False))


def planned(
    store,
    config: PipelineConfig,
    origin: Origin | None = None,
    registry: Registry | None = None,
    forced: bool = False,
) -> tuple[PipelineConfig, dict[Unit, dict[str, Any]]]:
    """The plan as a run makes it (`plan`), and its config: less the models a run of the same
    training left untrained (`recorded_cut`; not when the training is forced), as that run planned
    it. `not_trained(config)` names them."""
    causes = plan(config, origin, registry)
    cut = (
        {} if forced else recorded_cut(store, config, {u: stage_key(c) for u, c in causes.items()})
    )
    if cut:
        config = without_models(config, cut)
        causes = plan(config, origin, registry)
    return config, causes


def without_models(config: PipelineConfig, cut: dict[str, str]) -> PipelineConfig:
    """`config` less the models the training budget left untrained (`cut`: model -> why), which it
    names."""
    training = config.kind.training.name
    section = config.section(training).without(cut)
    return config.model_copy(
        update={"stages": config.stages.model_copy(update={training: section})}
    )


def unread(config: PipelineConfig, stages: list[str]) -> set[str]:
    """The stages of `stages` that a run leaves unbuilt because every stage of `stages` that needs
    them is a per-model stage none of whose models reads them (embed, when no model of the pipeline
    starts from word vectors). A stage nothing of `stages` needs (the last one asked for) is never
    among them."""
    kind, models = config.kind, [MODELS[m] for m in config.models()]
    out = set()
    for name in stages:
        readers = [kind.stages[s] for s in stages if name in kind.stages[s].needs]
        if readers and all(
            r.per_model and not any(r.reads(name, m) for m in models) for r in readers
        ):
            out.add(name)
    return out
