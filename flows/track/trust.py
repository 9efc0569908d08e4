"""Which registered models zhpipe loads: only what a zhpipe run of this project's store logged, with its files under the
store's own artifact root. Loading a model runs its code as the user who loads it (`zhpipe predict`, the champion
gate's re-scoring), so a version someone else put in the registry must never be loaded."""
from __future__ import annotations

from pathlib import Path


def trusted(uri: str) -> str:
    """The version `uri` names, pinned (`models:/<name>/<version>`: an alias moved after the check cannot swap in
    another), when it is a model this project logged: a registered version whose run is in this store and was made by
    zhpipe, and whose files lie under the store's own artifact root (a SQLite store: `artifacts/` beside its database;
    a tracking server: the artifact location of the logging run's experiment). Anything else is refused in one line
    before a byte of it is loaded: loading a model runs its code as you, so a version whose files someone else put
    somewhere else must never be loaded. Other URIs (a logged model's folder given on purpose with --model) are
    returned as they are."""
    from urllib.parse import unquote, urlparse

    from mlflow.exceptions import MlflowException

    from flows.plan import project
    from flows.track.tracker import client
    from tasks.errors import ZhpipeError

    if not uri.startswith("models:/"):
        return uri
    mv = version_of(uri)
    name, version = mv.name, str(mv.version)
    c = client()

    def refuse(why: str) -> ZhpipeError:
        return ZhpipeError(f"{uri}: version {version} of {name} is not loaded: {why}; register a model with `zhpipe "
                           f"run`, or remove that version (it may have been put there by someone else)")

    try:
        run = c.get_run(mv.run_id) if mv.run_id else None
    except MlflowException:
        run = None
    if run is None:
        raise refuse("no run of this project's store logged it")
    if not any(k.startswith("zhpipe.") for k in run.data.tags):
        raise refuse(f"its run {mv.run_id} was not made by zhpipe")
    location = c.get_model_version_download_uri(name, version)
    own = project.current().artifact_root()
    if own is not None:
        parsed, root = urlparse(location), unquote(urlparse(own).path)
        if parsed.scheme not in ("", "file"):
            raise refuse(f"its files are at {location}, not in this store's artifact root")
        where = Path(unquote(parsed.path)).resolve()
        if not where.is_relative_to(Path(root).resolve()):
            raise refuse(f"its files are at {where}, outside this store's artifact root {root}")
    else:
        root = c.get_experiment(run.info.experiment_id).artifact_location
        if not location.startswith(root.rstrip("/") + "/"):
            raise refuse(f"its files are at {location}, outside its experiment's artifact location {root}")
    return f"models:/{name}/{version}"


def version_of(uri: str):
    """The registry's ModelVersion of `models:/<name>@<alias>` or `models:/<name>/<version>`; one clear error when the
    registry has no such model."""
    from mlflow.exceptions import MlflowException

    from flows.track.tracker import client
    from tasks.errors import ConfigError

    name, sep, alias = uri.removeprefix("models:/").partition("@")
    if not sep:
        name, _, alias = name.partition("/")
    try:
        return (client().get_model_version(name, alias) if alias.isdigit()
                else client().get_model_version_by_alias(name, alias))
    except MlflowException:
        raise ConfigError(f"{uri}: no such registered model version (run the pipeline that registers {name} first; "
                          f"`zhpipe models` lists what is registered)") from None
