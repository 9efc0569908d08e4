"""A project folder: zhpipe installed as a wheel (not editable), `zhpipe init` in an empty folder, `zhpipe run`
there; everything it writes is in that folder (caches of other libraries aside, which the test lists)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """zhpipe built as a wheel from a copy of the source and installed into a folder of its own."""
    src, target = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("site")
    for name in ("flows", "tasks", "pyproject.toml", "README.md"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(src)], check=True, capture_output=True, timeout=300)
    return target


def test_init_and_run_in_an_empty_folder_write_only_there(installed, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_"))}
    env.update(PYTHONPATH=str(installed), HOME=str(home))
    zhpipe = [sys.executable, "-m", "flows.cli"]
    where = subprocess.run([sys.executable, "-c", "import flows; print(flows.__file__)"], env=env, cwd=work,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(installed))  # the wheel, not this checkout
    site_before = _files(installed)

    init = subprocess.run([*zhpipe, "init", "reviews"], env=env, cwd=work, capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stderr
    project = work / "reviews"
    assert (project / "pipelines.yaml").is_file() and (project / "data" / "raw" / "example.csv").is_file()
    again = subprocess.run([*zhpipe, "init", "reviews"], env=env, cwd=work, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already exists" in again.stderr

    run = subprocess.run([*zhpipe, "run", "--set", "train.models=[tfidf_lr, fasttext]"], env=env, cwd=project,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "evaluate" in run.stdout and (project / "mlruns" / "mlflow.db").is_file() and (project / ".prefect").is_dir()
    assert any((project / "data" / "evaluate").iterdir())
    assert _files(installed) == site_before  # nothing written into the installed package
    assert set(os.listdir(work)) == {"reviews"}
    stray = {f for f in _files(home) if not f.startswith(".cache/")}  # fontconfig and matplotlib keep caches there
    assert stray == set()

    outside = subprocess.run([*zhpipe, "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert outside.returncode == 2 and "no pipelines.yaml" in outside.stderr and len(outside.stderr.strip().splitlines()) == 1
    given = subprocess.run([*zhpipe, "--project", str(project), "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert given.returncode == 0 and "cached" in given.stdout
