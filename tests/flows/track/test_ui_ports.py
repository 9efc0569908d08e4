"""One MLflow UI per project: the port comes from the project (drawn once, recorded), so two
projects' `zhpipe ui` run side by side and each project's links (what its alerts and reports carry)
open that project's own UI."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.procs import zhpipe_argv

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e

# a run in the project's store, then the link to it as an alert carries it
# (flows.track.tracker.ui_url, as the checks' `report` link and the champion alerts compute it)
LINK = """
import json
from flows.plan import project
project.activate(project.find())
from flows.track.tracker import Tracker, private_store, ui_url
private_store()
experiment = "zhpipe-" + project.current().root.name
run = Tracker.start(experiment, "a night")
print(json.dumps({"run": run.run_id, "link": ui_url(experiment, run.run_id)}))
"""


def env_of() -> dict:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_"))
    }
    return env | {"PYTHONPATH": str(ROOT), "MLFLOW_LOGGING_LEVEL": "WARNING"}


def start_ui(project: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            zhpipe_argv("ui"),
            cwd=project,
            env=env_of(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def served(proc: subprocess.Popen, log: Path) -> tuple[str, str]:
    """(the printed address, the password) once `zhpipe ui` says it serves."""
    deadline = time.monotonic() + 240
    while (
        "log in as" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    found = re.search(
        r"MLflow UI on (http://127\.0\.0\.1:\d+)\S* \(log in as zhpipe, password (\S+);",
        log.read_text(),
    )
    assert found, log.read_text()[-3000:]
    return found.group(1), found.group(2)


def test_two_projects_uis_run_side_by_side_each_reached_through_its_own_alert_link(tmp_path):
    projects = {name: tmp_path / name for name in ("shop", "hotel")}
    links, procs = {}, []
    for name, folder in projects.items():
        done = subprocess.run(
            zhpipe_argv("init", str(folder)),
            cwd=tmp_path,
            env=env_of(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        made = subprocess.run(
            [sys.executable, "-c", LINK],
            cwd=folder,
            env=env_of(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert made.returncode == 0, made.stderr[-3000:]
        links[name] = json.loads(made.stdout.strip().splitlines()[-1])
    try:
        for name, folder in projects.items():
            procs.append((name, start_ui(folder, tmp_path / f"{name}-ui.log")))
        seen = {name: served(proc, tmp_path / f"{name}-ui.log") for name, proc in procs}
        bases = {name: links[name]["link"].split("/#/")[0] for name in projects}
        assert bases["shop"] != bases["hotel"]  # two ports: no "port 5000 already in use"
        for name in projects:
            base, password = seen[name]
            assert bases[name] == base  # the alert's link is the project's own UI
            other = next(n for n in projects if n != name)
            own = httpx.get(
                f"{base}/ajax-api/2.0/mlflow/runs/get",
                params={"run_id": links[name]["run"]},
                auth=("zhpipe", password),
                timeout=60,
            )
            assert own.status_code == 200 and own.json()["run"]["info"]["run_name"] == "a night"
            theirs = httpx.get(
                f"{base}/ajax-api/2.0/mlflow/runs/get",
                params={"run_id": links[other]["run"]},
                auth=("zhpipe", password),
                timeout=60,
            )
            assert theirs.status_code == 404  # the other project's run is not in this UI's store
            # a browser's login prompt
            assert httpx.get(links[name]["link"], timeout=60).status_code == 401
            assert 'Basic realm="zhpipe"' in httpx.get(base, timeout=60).headers["www-authenticate"]
        recorded = {
            name: (folder / ".prefect" / "zhpipe-ui-port").read_text().strip()
            for name, folder in projects.items()
        }
        # recorded: the next start keeps it
        assert all(bases[n].endswith(f":{recorded[n]}") for n in projects)
    finally:
        for _, proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
