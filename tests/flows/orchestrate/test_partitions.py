"""A source that grows by one file a night: download, clean, split, segment and augment run per file
(a unit each), a new night builds only the new file's units, duplicates are found across files, and
every old row keeps its split."""

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.orchestrate.pipeline import pipeline_flow, select_stages
from flows.plan.config import load_pipeline
from flows.plan.keys import plan_keys
from tests.helpers.runs import without_profile

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e
DATA = ("download", "clean", "split", "segment", "augment")


@pytest.fixture
def nightly(tmp_path, prefect_harness):
    """The smoke reviews as three nightly files, a fourth to come; a project whose source is their
    glob."""
    rows = pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str)
    drops = tmp_path / "data" / "raw" / "reviews"
    drops.mkdir(parents=True)
    nights = [rows.iloc[:150], rows.iloc[150:200], rows.iloc[200:250], rows.iloc[250:]]
    for day, part in enumerate(nights[:3], 1):
        part.to_csv(drops / f"2026-12-0{day}.csv", index=False)
    # night 5 repeats night 1 (global deduplication's case): the quarantine check warns instead of
    # holding it out (holding out is tests/flows/orchestrate/test_nights.py's)
    doc = {
        "pipelines": {
            "nightly": {
                "source": {
                    "path": "data/raw/reviews/*.csv",
                    "text_column": "review",
                    "label_column": "label",
                },
                "stages": {"augment": {"method": "eda", "num_aug": 1}},
                "checks": {"quarantine": {"severity": "warn", "threshold": 0.5}},
            }
        }
    }
    (tmp_path / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    from flows.plan import project

    previous = project._CURRENT
    project.activate(project.Project(tmp_path))
    yield {"root": tmp_path, "drops": drops, "last": nights[3], "store": tmp_path / "store"}
    project._CURRENT = previous


def run(env):
    config = load_pipeline("nightly", env["root"] / "pipelines.yaml")
    out = pipeline_flow(
        "nightly",
        config_file=str(env["root"] / "pipelines.yaml"),
        storage=str(env["store"]),
        stages=without_profile("augment"),
    )
    return config, {u["stage"]: u for u in out["units"]}, {s["stage"]: s for s in out["stages"]}


def test_a_new_night_builds_only_its_own_partition(nightly):
    config, units, stages = run(nightly)
    assert {u: r["cache"] for u, r in units.items()} == {
        f"{s}:2026-12-0{d}.csv": "miss" for s in DATA for d in (1, 2, 3)
    }
    first = pd.read_parquet(
        nightly["store"] / "segment" / stages["segment"]["key"] / "test.parquet"
    )
    old_split = {
        t: name
        for name in ("train", "validation", "test")
        for t in pd.read_parquet(
            nightly["store"] / "segment" / stages["segment"]["key"] / f"{name}.parquet"
        )["text"]
    }

    nightly["last"].to_csv(nightly["drops"] / "2026-12-04.csv", index=False)
    # a night that repeats night 1
    shutil.copy(nightly["drops"] / "2026-12-01.csv", nightly["drops"] / "2026-12-05.csv")
    config, units, stages = run(nightly)
    built = {u for u, r in units.items() if r["cache"] == "miss"}
    # the old nights are reused
    assert built == {f"{s}:2026-12-0{d}.csv" for s in DATA for d in (4, 5)}
    segment = nightly["store"] / "segment" / stages["segment"]["key"]
    now = {
        t: name
        for name in ("train", "validation", "test")
        for t in pd.read_parquet(segment / f"{name}.parquet")["text"]
    }
    assert all(now[t] == split for t, split in old_split.items())  # every old row keeps its split
    assert set(first["text"]) <= set(pd.read_parquet(segment / "test.parquet")["text"])

    clean5 = units["clean:2026-12-05.csv"]
    quarantine = pd.read_parquet(nightly["store"] / "clean" / clean5["key"] / "quarantine.parquet")
    assert clean5["rows"] == 0 or len(quarantine) >= 100
    repeats = quarantine[quarantine["repeats"].notna()]
    assert len(repeats) >= 100 and set(repeats["repeats"]) == {"2026-12-01.csv"}
    assert set(repeats["reason"]) <= {"duplicate", "label_conflict"}
    gathered = pd.read_parquet(nightly["store"] / "clean" / stages["clean"]["key"] / "data.parquet")
    assert gathered["id"].is_unique and gathered["text"].is_unique  # deduplicated across all nights
    assert stages["download"]["metrics"]["partitions"] == 5
    from flows.track.runs import pipeline_runs, runs_table

    # what a nightly user reads in the morning
    latest = runs_table(pipeline_runs("nightly", 1)).iloc[0]
    assert (
        latest["partitions reused/built"] == "3/2"
        and latest["rows new"] == 200
        and latest["rows"] == 450
    )


def test_partition_keys_follow_their_own_file(nightly):
    run(nightly)
    keys = plan_keys(load_pipeline("nightly", nightly["root"] / "pipelines.yaml"))
    (nightly["drops"] / "2026-12-03.csv").write_text(
        (nightly["drops"] / "2026-12-03.csv").read_text() + "1,新的一条评论很好\n"
    )
    again = plan_keys(load_pipeline("nightly", nightly["root"] / "pipelines.yaml"))
    changed = {u for u in keys if keys[u] != again[u]}
    assert "download:2026-12-01.csv" not in changed and "segment:2026-12-02.csv" not in changed
    assert {
        "download:2026-12-03.csv",
        "clean:2026-12-03.csv",
        "segment:2026-12-03.csv",
        "download",
        "segment",
    } <= changed
    with pytest.raises(Exception, match="no files match"):
        load_pipeline(
            "nightly", nightly["root"] / "pipelines.yaml", ["source.path=data/raw/none/*.csv"]
        ) and plan_keys(
            load_pipeline(
                "nightly", nightly["root"] / "pipelines.yaml", ["source.path=data/raw/none/*.csv"]
            )
        )


def test_status_counts_partitions(nightly, capsys):
    from flows.cli import main

    run(nightly)
    nightly["last"].to_csv(nightly["drops"] / "2026-12-04.csv", index=False)
    assert (
        main(
            [
                "--project",
                str(nightly["root"]),
                "status",
                "nightly",
                "--storage",
                str(nightly["store"]),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "4 partitions" in out
        and "3 cached, 1 to build" in out
        and "to build: 2026-12-04.csv" in out
    )


@pytest.fixture
def appended(tmp_path, prefect_harness):
    """One CSV that grows at its end, read with `source.grows: append`."""
    rows = pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str)
    log = tmp_path / "data" / "raw" / "reviews.csv"
    log.parent.mkdir(parents=True)
    rows.iloc[:150].to_csv(log, index=False)
    doc = {
        "pipelines": {
            "log": {
                "source": {
                    "path": "data/raw/reviews.csv",
                    "grows": "append",
                    "text_column": "review",
                    "label_column": "label",
                }
            }
        }
    }
    (tmp_path / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    from flows.plan import project

    previous = project._CURRENT
    project.activate(project.Project(tmp_path))
    yield {"root": tmp_path, "log": log, "rest": rows.iloc[150:], "store": tmp_path / "store"}
    project._CURRENT = previous


def run_log(env):
    out = pipeline_flow(
        "log",
        config_file=str(env["root"] / "pipelines.yaml"),
        storage=str(env["store"]),
        stages=select_stages(stop="segment"),
    )
    return {u["stage"]: u for u in out["units"]}, {s["stage"]: s for s in out["stages"]}


def test_an_appended_file_is_read_one_append_at_a_time(appended):
    from tasks.errors import DataError

    units, stages = run_log(appended)
    assert {u for u, r in units.items() if r["cache"] == "miss"} == {
        f"{s}:reviews.csv@0000" for s in DATA[:4]
    }
    assert stages["download"]["rows"] == 150
    # the next night's rows, and a line still being written
    with open(appended["log"], "a", encoding="utf-8") as f:
        appended["rest"].iloc[:50].to_csv(f, index=False, header=False)
        f.write("1,写到一半")
    units, stages = run_log(appended)
    assert {u for u, r in units.items() if r["cache"] == "miss"} == {
        f"{s}:reviews.csv@0001" for s in DATA[:4]
    }
    assert stages["download"]["rows"] == 200  # the unfinished line waits for the next run
    with open(appended["log"], "a", encoding="utf-8") as f:
        f.write("的评论\n")
    units, stages = run_log(appended)
    assert (
        stages["download"]["rows"] == 201 and units["download:reviews.csv@0002"]["cache"] == "miss"
    )
    data = appended["log"].read_bytes()
    # an edit before the end of earlier runs
    appended["log"].write_bytes(data[:40] + b"X" + data[41:])
    with pytest.raises(DataError, match="differ from an earlier run's"):
        run_log(appended)


def test_vocab_merges_partition_counts_into_the_corpus_vocabulary(nightly, tmp_path):
    """vocab counts each partition once and merges the counts: the same vocabulary (and OOV rate) as
    counting the gathered corpus in one pass."""
    from tasks.classification import vocab
    from tasks.core import BuildContext, Facts

    config = load_pipeline("nightly", nightly["root"] / "pipelines.yaml")
    out = pipeline_flow(
        "nightly",
        config_file=str(nightly["root"] / "pipelines.yaml"),
        storage=str(nightly["store"]),
        stages=without_profile("vocab"),
    )
    stages, units = {s["stage"]: s for s in out["stages"]}, {u["stage"]: u for u in out["units"]}
    assert {u for u in units if u.startswith("vocab:")} == {
        f"vocab:2026-12-0{d}.csv" for d in (1, 2, 3)
    }
    merged = Path(stages["vocab"]["path"])
    whole = tmp_path / "whole"
    whole.mkdir()
    ctx = BuildContext(
        inputs={
            "augment": Path(stages["augment"]["path"]),
            "segment": Path(stages["segment"]["path"]),
        },
        facts={"augment": Facts()},
        out=whole,
        params=config.stages.vocab,
    )
    direct = vocab.build(ctx)
    for kind in ("words", "chars"):
        assert (merged / kind / "vocab.txt").read_bytes() == (
            whole / kind / "vocab.txt"
        ).read_bytes()
    assert (
        stages["vocab"]["metrics"]["words_validation_oov_rate"]
        == direct.metrics["words_validation_oov_rate"]
    )
    nightly["last"].to_csv(nightly["drops"] / "2026-12-04.csv", index=False)
    again = pipeline_flow(
        "nightly",
        config_file=str(nightly["root"] / "pipelines.yaml"),
        storage=str(nightly["store"]),
        stages=without_profile("vocab"),
    )
    built = {u["stage"] for u in again["units"] if u["cache"] == "miss"}
    assert {u for u in built if u.startswith("vocab:")} == {"vocab:2026-12-04.csv"}


def test_an_append_while_the_run_plans_waits_for_the_next_run(appended, monkeypatch):
    """Lines appended after the run has planned (its keys fixed) are not half-seen by its
    execution."""
    from flows.orchestrate import pipeline

    run_log(appended)
    labelled = pipeline.label_flow_run

    def append_then_label(run):  # called once the keys are planned, before any stage runs
        with open(appended["log"], "a", encoding="utf-8") as f:
            appended["rest"].iloc[:40].to_csv(f, index=False, header=False)
        return labelled(run)

    monkeypatch.setattr(pipeline, "label_flow_run", append_then_label)
    units, stages = run_log(appended)
    assert stages["download"]["rows"] == 150 and "download:reviews.csv@0001" not in units
    monkeypatch.setattr(pipeline, "label_flow_run", labelled)
    units, stages = run_log(appended)  # the next run takes them
    assert (
        stages["download"]["rows"] == 190 and units["download:reviews.csv@0001"]["cache"] == "miss"
    )


def test_a_file_gone_since_the_last_run_is_named(nightly, caplog):
    from tasks.errors import ZhpipeError

    run(nightly)
    (nightly["drops"] / "2026-12-02.csv").unlink()
    with caplog.at_level("WARNING", logger="zhpipe"):
        _, _, stages = run(nightly)
    warned = [r.getMessage() for r in caplog.records if "gone" in r.getMessage()]
    assert (
        len(warned) == 1
        and "2026-12-02.csv" in warned[0]
        and stages["download"]["metrics"]["partitions"] == 2
    )
    doc = yaml.safe_load((nightly["root"] / "pipelines.yaml").read_text())
    doc["pipelines"]["nightly"]["source"]["missing_partitions"] = "error"
    (nightly["root"] / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    (nightly["drops"] / "2026-12-03.csv").unlink()
    with pytest.raises(
        ZhpipeError, match=r"1 partition\(s\) of the last run are gone \(2026-12-03.csv\)"
    ):
        run(nightly)


@pytest.fixture
def exported(tmp_path, prefect_harness):
    """A source replaced every night by a full export (`source.grows: snapshot`), here a new file
    per night."""
    rows = pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str)
    drops = tmp_path / "data" / "raw" / "exports"
    drops.mkdir(parents=True)
    rows.iloc[:200].to_csv(drops / "export-2026-12-01.csv", index=False)
    doc = {
        "pipelines": {
            "export": {
                "source": {
                    "path": "data/raw/exports/export-*.csv",
                    "grows": "snapshot",
                    "text_column": "review",
                    "label_column": "label",
                }
            }
        }
    }
    (tmp_path / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    from flows.plan import project

    previous = project._CURRENT
    project.activate(project.Project(tmp_path))
    yield {"root": tmp_path, "drops": drops, "rows": rows, "store": tmp_path / "store"}
    project._CURRENT = previous


def run_export(env):
    out = pipeline_flow(
        "export",
        config_file=str(env["root"] / "pipelines.yaml"),
        storage=str(env["store"]),
        stages=select_stages(stop="segment"),
    )
    return {u["stage"]: u for u in out["units"]}, {s["stage"]: s for s in out["stages"]}


def test_a_full_export_each_night_builds_only_its_new_rows(exported):
    units, stages = run_export(exported)
    segment = exported["store"] / "segment" / stages["segment"]["key"]
    old_split = {
        t: s
        for s in ("train", "validation", "test")
        for t in pd.read_parquet(segment / f"{s}.parquet")["text"]
    }
    # night 2: the whole table again, reordered, with 60 new rows
    exported["rows"].iloc[:260].sample(frac=1, random_state=1).to_csv(
        exported["drops"] / "export-2026-12-02.csv", index=False
    )
    units, stages = run_export(exported)
    built = {u: r for u, r in units.items() if r["cache"] == "miss"}
    assert set(built) == {
        f"{s}:export-2026-12-02.csv@0001" for s in DATA[:4]
    }  # the old rows are not cleaned or segmented again
    assert (
        built["download:export-2026-12-02.csv@0001"]["rows"] == 60
        and stages["download"]["rows"] == 260
    )
    segment = exported["store"] / "segment" / stages["segment"]["key"]
    now = {
        t: s
        for s in ("train", "validation", "test")
        for t in pd.read_parquet(segment / f"{s}.parquet")["text"]
    }
    assert all(now[t] == s for t, s in old_split.items())  # every old row keeps its split
    # night 3: the same export again (or one that only drops rows): no new partition, nothing built
    exported["rows"].iloc[:250].to_csv(exported["drops"] / "export-2026-12-03.csv", index=False)
    units, _ = run_export(exported)
    assert all(r["cache"] == "hit" for r in units.values())
