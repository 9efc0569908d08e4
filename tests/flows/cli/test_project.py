"""A project folder: zhpipe installed as a wheel (not editable), `zhpipe init` in an empty folder,
`zhpipe run` there; everything it writes is in that folder (caches of other libraries aside, which
the test lists)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tasks.util.io import file_sha256
from tests.helpers.cli import in_process
from tests.helpers.procs import zhpipe_argv

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e


def _files(folder: Path) -> set[str]:
    return (
        {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
        if folder.exists()
        else set()
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """zhpipe built as a wheel from a copy of the source and installed into a folder of its own."""
    src, target = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("site")
    for name in ("flows", "tasks", "pyproject.toml", "README.md"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def test_init_and_run_in_an_empty_folder_write_only_there(installed, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_"))
    }
    # none left behind (test_server.py)
    env.update(PYTHONPATH=str(installed), HOME=str(home), ZHPIPE_SERVER="temporary")
    zhpipe = zhpipe_argv()
    where = subprocess.run(
        [sys.executable, "-c", "import flows; print(flows.__file__)"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(installed))  # the wheel, not this checkout
    site_before = _files(installed)

    # under loose umasks (000 for init, 022 for the run), as on many machines: the project stays its
    # owner's only
    init = subprocess.run(
        [*zhpipe, "init", "reviews"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0),
    )
    assert init.returncode == 0, init.stderr
    project = work / "reviews"
    assert (project / "pipelines.yaml").is_file() and (
        project / "data" / "raw" / "example.csv"
    ).is_file()
    again = subprocess.run(
        [*zhpipe, "init", "reviews"], env=env, cwd=work, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 2 and "already exists" in again.stderr

    run = subprocess.run(
        [*zhpipe, "run", "--set", "train.models=[tfidf_lr, fasttext]"],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    from tests.test_private import open_to_others

    # data/, mlruns/ (the logged model's code too), .prefect/, pipelines.yaml
    assert open_to_others(project) == []
    assert (
        "evaluate" in run.stdout
        and (project / "mlruns" / "mlflow.db").is_file()
        and (project / ".prefect").is_dir()
    )
    assert any((project / "data" / "evaluate").iterdir())
    assert _files(installed) == site_before  # nothing written into the installed package
    assert set(os.listdir(work)) == {"reviews"}
    # fontconfig and matplotlib keep caches there
    stray = {f for f in _files(home) if not f.startswith(".cache/")}
    assert stray == set()
    # MLflow's schema, for the next new store
    assert any(f.startswith(".cache/zhpipe/mlflow-") for f in _files(home))
    assert open_to_others(home / ".cache" / "zhpipe") == []

    outside = subprocess.run(
        [*zhpipe, "status"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert (
        outside.returncode == 2
        and "no pipelines.yaml" in outside.stderr
        and len(outside.stderr.strip().splitlines()) == 1
    )
    given = subprocess.run(
        [*zhpipe, "--project", str(project), "status"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert given.returncode == 0 and "cached" in given.stdout


def test_init_csv_copies_pins_and_refuses_an_edited_file(tmp_path, capsys):
    """`init --csv` copies the corpus under data/raw/ and pins its sha256: the project still works
    after a move, and an edited corpus is a one-line error instead of silently another corpus."""
    import yaml

    from tasks.classification.starter import example_corpus

    corpus = tmp_path / "mine.csv"
    example_corpus().to_csv(corpus, index=False)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_"))
    }
    # the session's Prefect server: no background server left behind (test_server.py tests it), and
    # no temporary one started per command (the test above runs on one)
    env.update(PREFECT_API_URL=os.environ["PREFECT_API_URL"], ZHPIPE_SERVER="temporary")
    zhpipe = zhpipe_argv()
    # the runs below are processes of their own
    init = in_process(capsys, "init", tmp_path / "p", "--csv", corpus)
    assert init.returncode == 0, init.stderr
    copy = tmp_path / "p" / "data" / "raw" / "mine.csv"
    assert copy.read_bytes() == corpus.read_bytes() and not copy.is_symlink()
    source = next(
        iter(yaml.safe_load((tmp_path / "p" / "pipelines.yaml").read_text())["pipelines"].values())
    )["source"]
    assert source["path"] == "data/raw/mine.csv" and source["sha256"] == file_sha256(corpus)
    corpus.unlink()  # the project no longer needs the original
    shutil.move(tmp_path / "p", tmp_path / "moved")
    run = [*zhpipe, "run", "--to", "clean"]
    ok = subprocess.run(
        run, env=env, cwd=tmp_path / "moved", capture_output=True, text=True, timeout=300
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    with open(tmp_path / "moved" / "data" / "raw" / "mine.csv", "a", encoding="utf-8") as f:
        f.write("一条新评论,1\n")
    bad = subprocess.run(
        run, env=env, cwd=tmp_path / "moved", capture_output=True, text=True, timeout=300
    )
    assert bad.returncode != 0 and "sha256" in bad.stderr, bad.stderr[-2000:]
    errors = [line for line in bad.stderr.splitlines() if line.startswith("zhpipe: error:")]
    assert len(errors) == 1 and "sha256 mismatch" in errors[0] and "set source.sha256" in errors[0]
    linked = in_process(
        capsys,
        "init",
        tmp_path / "q",
        "--csv",
        tmp_path / "moved" / "data" / "raw" / "mine.csv",
        "--link",
    )
    assert linked.returncode == 0 and (tmp_path / "q" / "data" / "raw" / "mine.csv").is_symlink()


@pytest.mark.parametrize("name", ["my reviews #1.csv", "reviews: hotel.csv", 'it\'s "quoted".csv'])
def test_init_csv_with_yaml_characters_in_its_name_writes_a_config_that_reads_back(tmp_path, name):
    import yaml

    from flows.plan.init import init_project
    from tasks.classification.starter import example_corpus

    corpus = tmp_path / name
    example_corpus().to_csv(corpus, index=False)
    init_project(tmp_path / "p", corpus)
    source = next(
        iter(yaml.safe_load((tmp_path / "p" / "pipelines.yaml").read_text())["pipelines"].values())
    )["source"]
    assert source["path"] == f"data/raw/{name}" and (tmp_path / "p" / source["path"]).is_file()


def test_init_csv_reads_a_gb18030_header_and_names_an_unreadable_file(tmp_path):
    from flows.plan.init import init_project
    from tasks.classification.starter import example_corpus
    from tasks.errors import DataError

    corpus = tmp_path / "gbk.csv"
    example_corpus().rename(columns={"text": "评论", "label": "标签"}).to_csv(
        corpus, index=False, encoding="gb18030"
    )
    init_project(tmp_path / "p", corpus, text_column="评论", label_column="标签")
    with pytest.raises(DataError, match="no text column 'text' .*评论"):
        init_project(tmp_path / "q", corpus)
    broken = tmp_path / "broken.csv"
    broken.write_bytes(b'text,label\n"never closed,1\n' + b"x" * 10)
    with pytest.raises(DataError, match=r"--csv .*broken.csv: not a readable CSV"):
        init_project(tmp_path / "r", broken)


def test_predict_in_a_fresh_project_is_one_line_and_leaves_no_folders(tmp_path):
    from flows.plan.init import init_project

    init_project(tmp_path / "p")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ZHPIPE_", "MLFLOW_", "PREFECT_"))
    }
    done = subprocess.run(
        zhpipe_argv("predict", "房间很干净"),
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path / "p",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        done.returncode == 2
        and done.stderr.startswith("zhpipe: error: no models yet")
        and len(done.stderr.splitlines()) == 1
    )
    assert not (tmp_path / "p" / "mlruns").exists() and not (tmp_path / "p" / ".prefect").exists()


def test_init_makes_a_project_for_every_kind_of_corpus(tmp_path):
    """A folder of nightly files, a tagged NER file and a file of sentence pairs each start like a
    CSV does: their own pipeline (named after the folder, so their own experiment and registered
    model), planned without an edit."""
    from flows.plan import project
    from flows.plan.config import load_pipeline
    from flows.plan.init import init_project
    from flows.plan.keys import plan_keys
    from tasks.errors import DataError

    nights = tmp_path / "drops"
    nights.mkdir()
    pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str).iloc[:100].to_csv(
        nights / "2026-12-01.csv", index=False
    )
    made = {
        "nightly": init_project(tmp_path / "shop-nightly", nights, "nightly", text_column="review"),
        "ner": init_project(tmp_path / "msra", ROOT / "tests/fixtures/ner/train.bmes", "ner"),
        "pairs": init_project(
            tmp_path / "pairs",
            ROOT / "tests/fixtures/mt/pairs.tsv",
            "pairs",
            columns="en,zh,credit",
        ),
    }
    previous = project._CURRENT
    try:
        for kind, folder, task, name in (
            ("nightly", "shop-nightly", "classification", "shop-nightly"),
            ("ner", "msra", "ner", "msra"),
            ("pairs", "pairs", "translation", "pairs"),
        ):
            assert made[kind][-2] == tmp_path / folder / "pipelines.yaml"
            project.activate(project.Project(tmp_path / folder))
            config = load_pipeline(name, tmp_path / folder / "pipelines.yaml")
            # experiment zhpipe-<name>, its own registered model
            assert config.task == task and config.identity == name
            assert plan_keys(config)  # plans as written
        assert load_pipeline(
            "shop-nightly", tmp_path / "shop-nightly" / "pipelines.yaml"
        ).source.partitioned
        assert load_pipeline("msra", tmp_path / "msra" / "pipelines.yaml").models() == [
            "crf"
        ]  # minutes on a CPU, not an hour
    finally:
        project._CURRENT = previous
    with pytest.raises(DataError, match="no text column 'text'.*--text-column"):
        init_project(tmp_path / "other", nights, "nightly")
    with pytest.raises(DataError, match="expected a folder of CSV files"):
        init_project(tmp_path / "empty", tmp_path / "nothing", "nightly")


def test_no_usage_reports_leave_the_machine_unless_the_user_opts_in(monkeypatch):
    from flows.plan import project

    for var in ("MLFLOW_DISABLE_TELEMETRY", "PREFECT_SERVER_ANALYTICS_ENABLED"):
        monkeypatch.delenv(var, raising=False)
    current = project.current()
    project.activate(current)
    assert (
        os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
        and os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    )
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")  # the user's own choice stays
    project.activate(current)
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "false"
