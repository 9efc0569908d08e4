"""`zhpipe doctor`: each service a run will use, checked the way the run uses it, one line each: the
config, the disk, the tracking store (MLflow: a SQLite file, or a server on a database), the Prefect
server, the stage store (a folder or an object store) and its lock, the alert target. A failing line
names what to fix; the exit status is 1 when one fails. `preflight` is the part a run does itself
before it builds anything."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from flows.needs import Needs
from tasks.errors import ZhpipeError


def _config(args) -> str:
    from flows.cli.common import config_file
    from flows.plan.config import list_pipelines, load_alerts, load_pipeline

    file = config_file(args)
    names = list(list_pipelines(file))
    for name in names:
        load_pipeline(name, file)
    alerts = ""
    try:
        from flows.track.alerts import check_target

        check_target(load_alerts(file))
        alerts = "; alerts: target allowed"
    except ZhpipeError as e:
        if "no 'alerts:' section" not in str(e):
            raise
    return f"{len(names)} pipelines valid in {file}{alerts}"


def _disk(args) -> str:
    from flows.plan import project

    return ", ".join(f"{what} {free / 1024:.1f} GB free" for _, what, free in project.check_space())


def _unanswered(url: str, timeout: float = 5) -> str | None:
    """Why a GET of `url` does not answer 200 (one phrase), or None when it does."""
    import httpx

    try:
        status = httpx.get(url, timeout=timeout).status_code
    except httpx.HTTPError as e:
        return f"({type(e).__name__}: {str(e)[:120]})"
    return None if status == 200 else f"(HTTP {status})"


def _require(url: str, shown: str) -> None:
    why = _unanswered(url)
    if why:
        raise ZhpipeError(f"{shown} does not answer {why}; is the server up, is the address right?")


def _mlflow_version(base: str) -> str:
    """The server's MLflow version ('' from a server without /version), asked with this machine's
    credentials (MLflow's basic-auth app guards /version too); credentials it refuses are one line
    naming the variables to fix."""
    import httpx

    from tasks.util.urls import redact

    user, password = (
        os.environ.get("MLFLOW_TRACKING_USERNAME"),
        os.environ.get("MLFLOW_TRACKING_PASSWORD"),
    )
    try:
        answer = httpx.get(
            f"{base}/version", timeout=5, auth=(user, password or "") if user else None
        )
    except httpx.HTTPError:
        return ""
    if answer.status_code in (401, 403):
        given = (
            f"as user {user!r}"
            if user
            else "without credentials (MLFLOW_TRACKING_USERNAME is not set)"
        )
        raise ZhpipeError(
            f"{redact(base)} refused this machine {given} (HTTP {answer.status_code}); set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to your user on the tracking "
            "server"
        )
    text = answer.text.strip()
    return text if answer.status_code == 200 and len(text) < 40 else ""


def _tracking(args) -> str:
    import mlflow

    from flows.track.sqlite import check_sqlite
    from flows.track.tracker import client, tracking_server, tracking_uri
    from tasks.util.urls import redact

    uri, base = tracking_uri(), tracking_server()
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        check_sqlite(path)
        client().search_experiments(max_results=1)
        return (
            f"{uri}: readable, mode {path.stat().st_mode & 0o777:o} (mlflow {mlflow.__version__})"
        )
    if base is None:
        client().search_experiments(max_results=1)
        return f"{redact(uri)}: readable"
    _require(f"{base}/health", f"{redact(base)}/health")
    version = _mlflow_version(base)
    if version and version.split(".")[0] != mlflow.__version__.split(".")[0]:
        raise ZhpipeError(
            f"{redact(base)} runs mlflow {version}, this machine {mlflow.__version__}: install "
            f"the same major version"
        )
    c = client()
    try:
        experiment = c.get_experiment_by_name("zhpipe-doctor") or c.get_experiment(
            c.create_experiment("zhpipe-doctor")
        )
        run = c.create_run(experiment.experiment_id, run_name="zhpipe doctor")
        # an artifact too: through the server's proxy, or to the bucket
        c.log_text(run.info.run_id, "ok", "doctor.txt")
        c.delete_run(run.info.run_id)
    except Exception as e:  # noqa: BLE001 - MLflow raises its own exceptions and the HTTP client's
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ZhpipeError(
            f"{redact(base)}: cannot write a run and an artifact ({first}); check "
            f"MLFLOW_TRACKING_USERNAME/PASSWORD and the server's --artifacts-destination"
        ) from None
    return f"{redact(base)}: mlflow {version or '?'}, a run and an artifact written and deleted"


def _prefect(args) -> str:
    url = os.environ.get("PREFECT_API_URL")
    if os.environ.get("PREFECT_HOME"):  # the project's own server's database (not a team's server)
        from flows.plan.private import read_state
        from flows.plan.project import corrupt_prefect_database

        home = Path(os.environ["PREFECT_HOME"]).expanduser()
        own = not url or url == (read_state(home / "zhpipe-server.json") or {}).get("url")
        if own and (why := corrupt_prefect_database(home)):
            raise ZhpipeError(why)
    if not url:
        return (
            "no server configured or running: the first `zhpipe run` starts the project's own "
            "(about 20 s)"
        )
    import prefect
    from prefect.client.orchestration import get_client

    base = url.rstrip("/").removesuffix("/api")
    _require(f"{url.rstrip('/')}/health", f"{base}/api/health")
    # answered without credentials
    open_to_all = _unanswered(f"{url.rstrip('/')}/admin/version") is None
    with get_client(sync_client=True) as c:
        try:
            version = c.api_version()
        except Exception as e:  # noqa: BLE001 - httpx's errors, Prefect's
            raise ZhpipeError(
                f"{base}: refused this machine's requests ({type(e).__name__}: {str(e)[:120]}); "
                "set PREFECT_API_AUTH_STRING to the server's server.api.auth_string"
            ) from None
    if version.split(".")[0] != prefect.__version__.split(".")[0]:
        raise ZhpipeError(
            f"{base} runs Prefect {version}, this machine {prefect.__version__}: install "
            f"the same major version"
        )
    from urllib.parse import urlsplit

    from flows.track.tracker import tracking_server

    # a team's set-up: others reach this server, or share the machine it runs on
    team = tracking_server() is not None
    if open_to_all and (team or urlsplit(base).hostname not in ("127.0.0.1", "localhost", "::1")):
        raise ZhpipeError(
            f"{base} answers anyone without credentials: anyone who reaches it can start runs with "
            "your "
            "workers; start it with PREFECT_SERVER_API_AUTH_STRING and give clients "
            "PREFECT_API_AUTH_STRING"
        )
    return f"{base}: Prefect {version}" + (
        "; it answers without credentials (loopback only)"
        if open_to_all
        else ", asks for credentials"
    )


def _store(args) -> str:
    from flows.cli.common import pipeline_name
    from flows.plan.config import load_pipeline
    from flows.plan.store import StageStore, storage_root

    store = StageStore(
        storage_root(load_pipeline(pipeline_name(args)), getattr(args, "storage", None))
    )
    name = f"_doctor-{secrets.token_hex(4)}"
    try:
        if store.fs is not None:
            where = f"{store.base}/_cache/{name}"
            store.fs.pipe_file(where, b"ok")
            assert store.fs.cat_file(where) == b"ok"
            store.fs.rm_file(where)
        else:
            store.root.mkdir(parents=True, exist_ok=True)
            probe = store.root / name
            try:
                probe.write_bytes(b"ok")
            finally:  # a full disk leaves no probe behind
                probe.unlink(missing_ok=True)
    except Exception as e:  # noqa: BLE001 - fsspec backends raise their own errors
        raise ZhpipeError(
            f"{store.url}: cannot write, read and delete a file there ({type(e).__name__}: "
            f"{str(e)[:160]}); check the bucket or folder and its credentials"
        ) from None
    t0 = time.perf_counter()
    # the key lock a build takes, on a key no output has, in the store's shared folder
    with store.lock("_cache", "0" * 16):
        pass
    (store.root / "_cache" / f".lock-{'0' * 16}").unlink(missing_ok=True)
    shared = (
        " (the lock across machines is a Prefect concurrency limit: the Prefect line above)"
        if store.fs is not None
        else ""
    )
    return (
        f"{store.url}: writable, its lock works ({(time.perf_counter() - t0) * 1000:.0f} "
        f"ms){shared}"
    )


SERVICES: dict[str, Callable] = {
    "config": _config,
    "disk": _disk,
    "tracking": _tracking,
    "prefect": _prefect,
    "store": _store,
}


# checks that write: not tried on a full disk (MLflow retries a full disk for 100 s)
WRITES = {"tracking", "store"}


def cmd_doctor(args) -> int:
    failed, full = 0, False
    for name, check in SERVICES.items():
        if name in WRITES and full:
            print(
                f"skip  {name:9s} not checked: too little free disk space (the disk line above)",
                flush=True,
            )
            continue
        try:
            line = check(args)
            print(f"ok    {name:9s} {line}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is one line naming the service
            failed += 1
            full = full or name == "disk"
            text = " ".join(str(e).split()) or type(e).__name__
            print(f"FAIL  {name:9s} {text}", flush=True)
    if failed:
        print(f"{failed} of {len(SERVICES)} services failed: a run would stop on them")
    return 1 if failed else 0


def preflight() -> None:
    """What a run checks before it builds anything: a tracking server that does not answer is one
    line, not a run that fails after its data stages."""
    from flows.track.tracker import tracking_server
    from tasks.util.urls import redact

    base = tracking_server()
    why = _unanswered(f"{base}/health") if base else None
    if why:
        raise ZhpipeError(
            f"the tracking server {redact(base)} does not answer {why}; nothing was built (`zhpipe "
            f"doctor` checks every service)"
        )


def add_parsers(sub) -> None:
    from flows.cli.common import storage_arg

    doctor = sub.add_parser(
        "doctor",
        help="check every service a run uses (config, disk, tracking, Prefect, "
        "store), one line each",
    )
    storage_arg(doctor)
    doctor.add_argument(
        "--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)"
    )
    doctor.set_defaults(handler=cmd_doctor, pipeline=None, needs=Needs(server="use"))
