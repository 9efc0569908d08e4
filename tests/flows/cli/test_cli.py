"""The command line as a user meets it: real processes, one-line errors, non-zero exits."""

import csv
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import in_process
from tests.helpers.procs import zhpipe, zhpipe_argv

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e  # real zhpipe processes and servers: `make test-quick` leaves them out
SMOKE = ROOT / "tests" / "fixtures" / "smoke.csv"


@pytest.fixture(scope="module")
def api_env(prefect_harness, tmp_path_factory):
    """Environment for CLI subprocesses: the session's Prefect server, a fresh stage store."""
    from prefect.settings import PREFECT_API_URL

    return {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "ZHPIPE_DATA": str(tmp_path_factory.mktemp("cli-store")),
    }


@pytest.fixture
def here(api_env, monkeypatch, capsys):
    """The same command through `flows.cli.main` in this process, read like a finished process: for
    the error paths, which end before any work and would otherwise spend most of their time on a new
    process's imports, and a run whose point is its corpus. The runs that race each other, and
    `--debug`, stay real processes."""
    monkeypatch.setenv("ZHPIPE_DATA", api_env["ZHPIPE_DATA"])
    return lambda *args: in_process(capsys, *args)


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("zhpipe: error: ")
    for needle in needles:
        assert needle in last


def test_unknown_key_fails_before_running(here):
    proc = here("run", "smoke", "--set", "train.epoch=3")
    assert_one_line_error(proc, "unknown key 'stages.train.epoch'", "epochs")


def test_missing_column_names_the_columns_found(here):
    proc = here(
        "run", "smoke", "--source", str(SMOKE), "--text-column", "content", "--to", "download"
    )
    assert_one_line_error(proc, "no text column 'content'", "columns found: label, review")


def test_checksum_mismatch(here):
    proc = here("run", "smoke", "--set", "source.sha256=" + "0" * 64, "--to", "download")
    assert_one_line_error(proc, "sha256 mismatch")


def test_single_class_and_empty_and_unreadable(here, tmp_path):
    one = tmp_path / "one.csv"
    # the smoke pipeline's own columns
    one.write_text("label,review\n" + "好,房间很干净\n" * 20, encoding="utf-8")
    assert_one_line_error(
        here("run", "smoke", "--source", str(one), "--to", "split"), "a classifier needs at least 2"
    )
    empty = tmp_path / "empty.csv"
    empty.write_text("label,review\n", encoding="utf-8")
    assert_one_line_error(here("run", "smoke", "--source", str(empty), "--to", "download"), "empty")
    missing = tmp_path / "nope.csv"
    assert_one_line_error(
        here("run", "smoke", "--source", str(missing), "--to", "download"), "source not found"
    )


def test_debug_shows_traceback(api_env):
    proc = zhpipe(api_env, "--debug", "run", "smoke", "--set", "train.epoch=3")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_source_runs_on_ten_string_classes_with_other_columns(here, api_env, tmp_path):
    """--source: other column names, string labels, 10 classes, no file edited. Run through `main`
    in this process: its stdout is not a terminal either, as in a cron log."""
    rows = list(csv.DictReader(SMOKE.open(encoding="utf-8")))
    classes = [f"类别{i}" for i in range(10)]
    path = tmp_path / "ten.csv"
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["category", "content"])
        for i, r in enumerate(rows):
            w.writerow([classes[i % 10], r["review"]])
    proc = here(
        "run",
        "smoke",
        "--source",
        str(path),
        "--text-column",
        "content",
        "--label-column",
        "category",
        # the point is the corpus, not the pictures or the network: two labels' word clouds, the
        # quickest model
        "--set",
        "profile.max_labels=2",
        "--set",
        "train.models=[tfidf_lr]",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "best_test_accuracy=" in proc.stdout
    # another corpus: an experiment (and model) of its own
    assert "MLflow: experiment zhpipe-smoke-ten," in proc.stdout
    # piped (a cron log): every value whole, no cell cut at 80 columns
    assert "…" not in proc.stdout
    store = Path(api_env["ZHPIPE_DATA"])
    matrices = list((store / "evaluate.tfidf_lr").glob("*/evaluation/confusion_matrix.csv"))
    assert len(matrices) == 1
    header = matrices[0].read_text(encoding="utf-8").splitlines()[0].split(",")[1:]
    assert header == classes


def test_status_and_stages(api_env):
    proc = zhpipe(api_env, "stages")
    lines = proc.stdout.splitlines()
    assert (
        proc.returncode == 0
        and lines[0].startswith("task classification")
        and lines[1].split()[0] == "download"
    )
    assert (
        any(line.startswith("task ner") for line in lines) and "tasks/stages.py" not in proc.stdout
    )
    proc = zhpipe(api_env, "status", "smoke")
    assert proc.returncode == 0
    assert "download" in proc.stdout and "evaluate" in proc.stdout


def test_two_concurrent_runs_build_each_stage_once(api_env, tmp_path):
    """Two runs of one pipeline at once on one store: each stage key is built by one of them and
    reused by the other (a lock per stage key), both succeed, and the store holds one valid output
    per key."""
    import re

    from flows.plan.config import load_pipeline
    from flows.plan.keys import plan_keys
    from flows.plan.store import StageStore

    env = {**api_env, "ZHPIPE_DATA": str(tmp_path / "store")}
    # locks per stage key and per model unit: one quick model shows both
    sets = ["train.models=[tfidf_lr]"]
    args = zhpipe_argv("run", "smoke", "--to", "train", "--set", sets[0])
    procs = [
        subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [out[-1500:] for out in outputs]
    keys = plan_keys(load_pipeline("smoke", overrides=sets))
    store = StageStore(tmp_path / "store")
    # no model of the run starts from word vectors
    assert "zhpipe embed: building" not in "".join(outputs)
    for stage in ("download", "clean", "split", "segment", "augment", "vocab", "train"):
        built = sum(len(re.findall(rf"zhpipe {stage}: building", out)) for out in outputs)
        assert built == 1, (stage, outputs)
        assert store.is_done(stage, keys[stage]) and store.others(stage, keys[stage]) == []
        assert [
            p.name for p in (tmp_path / "store" / stage).iterdir() if not p.name.startswith(".lock")
        ] == [keys[stage]]


def test_two_machines_on_one_object_store_build_each_key_once(api_env, tmp_path):
    """Two runs with separate local mirrors (two machines, as far as the store can tell) on one
    fsspec URL (`local://`, which zhpipe treats like an object store: mirror, upload, manifest
    last). The file lock cannot see the other "machine"; the Prefect global concurrency limit per
    key does, so every stage is still built once and the other run reuses it."""
    import re

    from flows.plan.config import load_pipeline
    from flows.plan.keys import plan_keys
    from flows.plan.store import StageStore

    url = f"local://{tmp_path / 'bucket'}"
    args = zhpipe_argv("run", "smoke", "--to", "segment", "--storage", url)
    procs = [
        subprocess.Popen(
            args,
            cwd=ROOT,
            env={**api_env, "ZHPIPE_CACHE": str(tmp_path / f"machine-{i}")},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [out[-1500:] for out in outputs]
    keys = plan_keys(load_pipeline("smoke"))
    store = StageStore(url, cache=tmp_path / "machine-3")
    for stage in ("download", "clean", "split", "segment"):
        built = sum(len(re.findall(rf"zhpipe {stage}: building", out)) for out in outputs)
        assert built == 1, (stage, outputs)
        assert store.is_done(stage, keys[stage]) and store.others(stage, keys[stage]) == []
    assert sorted(p.name for p in store.local("segment", keys["segment"]).iterdir()) == [
        "manifest.json",
        "test.parquet",
        "train.parquet",
        "validation.parquet",
    ]


def test_every_kinds_summary_shows_each_models_metric_alike():
    """A NER run's models show their test F1 as a classifier's show their accuracy (crf's was
    blank)."""
    from rich.console import Console

    from flows.cli.run import summary_table

    rows = [
        {
            "stage": "evaluate",
            "cache": "miss",
            "seconds": 1.0,
            "rows": None,
            "metrics": {"best_test_f1": 0.8},
            "headline": "best_test_f1",
        }
    ]
    units = [
        {
            "stage": "evaluate.crf",
            "cache": "miss",
            "seconds": 0.5,
            "metrics": {"test_f1": 0.81234, "test_precision": 0.8},
        },
        {
            "stage": "evaluate.bilstm_crf",
            "cache": "hit",
            "seconds": 0.0,
            "metrics": {"test_f1": 0.75},
        },
    ]
    console = Console(width=200, record=True)
    console.print(summary_table(rows, 2.0, "ner-smoke", units))
    text = console.export_text()
    assert "best_test_f1=0.8" in text and "test_f1=0.8123" in text and "test_f1=0.75" in text


@pytest.mark.e2e
def test_runs_fits_the_terminal_with_whole_numbers_and_names(smoke, capsys, monkeypatch):
    """`zhpipe runs` in a 100-column terminal squeezed 16 columns and showed test accuracy as `0.…`:
    now it keeps the columns that fit whole (the run and its name always), `--columns` chooses them
    and `--json` gives every one."""
    import json

    monkeypatch.setenv("COLUMNS", "100")
    done = in_process(capsys, "runs", "smoke")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= 100, done.stdout
    # (a long `why` ends in … by design)
    assert "test acc" in done.stdout and "0.…" not in done.stdout, done.stdout
    records = [
        json.loads(line)
        for line in in_process(capsys, "runs", "smoke", "--json").stdout.splitlines()
    ]
    assert records and {"run", "name", "test acc", "why", "checks"} <= set(records[0])
    # every run id and accuracy whole; a name too long for the line wraps, every word kept
    for record in records:
        assert record["run"] in done.stdout
        if record["test acc"] is not None:
            assert f"{record['test acc']:.4f}" in done.stdout
        # a word longer than the name's share of the line (a path) folds; every other word is whole
        assert all(word in done.stdout for word in record["name"].split() if len(word) <= 33), (
            record["name"]
        )
    chosen = in_process(capsys, "runs", "smoke", "--columns", "run,test acc")
    assert (
        chosen.returncode == 0 and "best model" not in chosen.stdout and "test acc" in chosen.stdout
    )
    wrong = in_process(capsys, "runs", "--columns", "run,nope")
    assert wrong.returncode == 2 and "no column 'nope'" in wrong.stderr
