"""`zhpipe gc` removes only what the store made and no pipeline uses: never a corpus, never anything
under data/raw, never through a symlink, never outside the store root, never a folder the store did
not publish."""

import os
import subprocess
from pathlib import Path

import pytest

from flows.plan.maintenance import collect_garbage
from flows.plan.store import Manifest, StageStore
from tests.helpers.procs import zhpipe_argv

ROOT = Path(__file__).resolve().parents[3]
UNUSED, USED = "0123456789abcdef", "fedcba9876543210"


def publish(root: Path, stage: str, key: str, payload: str = "x") -> Path:
    """An output as the store publishes it: `<root>/<stage>/<key>/` with a manifest naming both."""
    out = root / stage / key
    out.mkdir(parents=True)
    (out / "part.txt").write_text(payload)
    Manifest(stage=stage, key=key, params={}, inputs={}, rows=1, seconds=0.0).write(out)
    return out


@pytest.fixture
def planted(tmp_path):
    """A project's data/ folder with every case the audit found, plus one output that really is
    garbage."""
    data = tmp_path / "project" / "data"
    corpus = data / "raw" / "ChnSentiCorp_htl_all.csv"
    corpus.parent.mkdir(parents=True)
    corpus.write_text("label,review\n1,好\n")
    ner = data / "raw" / "ResumeNER"
    ner.mkdir()
    (ner / "train.char.bmes").write_text("张 B-NAME\n")
    publish(data / "raw", "nested", UNUSED)  # even a manifest-shaped folder under raw/ stays
    outside = tmp_path / "elsewhere"
    publish(outside, "clean", UNUSED)  # a store folder reached only through a symlink
    (data / "clean").symlink_to(outside / "clean")
    (outside / "mine").mkdir()
    (outside / "mine" / "notes.txt").write_text("keep")
    (data / "split").mkdir()
    (data / "split" / UNUSED).symlink_to(outside / "mine")  # an entry that is a symlink
    (data / "split" / "notes").mkdir()  # a user folder inside a stage folder, no manifest
    (data / "split" / "notes" / "a.txt").write_text("keep")
    liar = data / "split" / "aaaaaaaaaaaaaaaa"
    publish(data, "segment", "aaaaaaaaaaaaaaaa").rename(liar)  # its manifest names another stage
    garbage = publish(data, "segment", UNUSED)
    kept = publish(data, "segment", USED)
    (data / "segment" / f".tmp-{UNUSED}-999999999").mkdir()  # left by a killed build
    (data / "segment" / ".tmp-user-folder-1").mkdir()  # not a name the store makes
    (data / "train.textcnn").mkdir()
    (data / "train.textcnn" / f".scratch-{UNUSED}").mkdir()
    return {
        "data": data,
        "outside": outside,
        "garbage": garbage,
        "kept": kept,
        "keep": {("segment", USED)},
        "tmp": data / "segment" / f".tmp-{UNUSED}-999999999",
    }


def snapshot(*folders: Path) -> set[str]:
    return {str(p) for f in folders for p in f.rglob("*")}


def test_gc_removes_only_store_garbage(planted):
    data, outside = planted["data"], planted["outside"]
    before = snapshot(data, outside)
    listed = collect_garbage(StageStore(data), planted["keep"], dry_run=True)
    assert snapshot(data, outside) == before  # a dry run removes nothing
    paths = {Path(item["path"]).name for item in listed}
    assert paths == {UNUSED, f".tmp-{UNUSED}-999999999", f".scratch-{UNUSED}"}
    assert {Path(item["path"]).parent.name for item in listed} == {"segment", "train.textcnn"}

    removed = collect_garbage(StageStore(data), planted["keep"])
    assert [i["path"] for i in removed] == [i["path"] for i in listed]
    assert not planted["garbage"].exists() and not planted["tmp"].exists()
    assert planted["kept"].is_dir()
    assert (data / "raw" / "ChnSentiCorp_htl_all.csv").read_text().startswith("label,review")
    assert (data / "raw" / "ResumeNER" / "train.char.bmes").is_file()
    assert (data / "raw" / "nested" / UNUSED / "manifest.json").is_file()
    # not followed through the symlink
    assert (outside / "clean" / UNUSED / "manifest.json").is_file()
    assert (outside / "mine" / "notes.txt").read_text() == "keep"
    assert (data / "split" / UNUSED).is_symlink()
    assert (data / "split" / "notes" / "a.txt").is_file() and (
        data / "split" / "aaaaaaaaaaaaaaaa"
    ).is_dir()
    assert (data / "segment" / ".tmp-user-folder-1").is_dir()


def test_gc_on_any_folder_touches_nothing_the_store_did_not_make(tmp_path):
    """`gc --storage DIR` on a folder that is not a store: every file and folder stays."""
    home = tmp_path / "home"
    (home / "photos" / "2026").mkdir(parents=True)
    (home / "photos" / "2026" / "a.jpg").write_bytes(b"\xff\xd8")
    (home / "code").mkdir()
    (home / "code" / ".git").mkdir()
    (home / "code" / ".tmp-x").write_text("x")
    before = snapshot(home)
    assert collect_garbage(StageStore(home), set()) == []
    assert snapshot(home) == before


def test_gc_never_removes_a_pipelines_source(tmp_path):
    """A source file kept inside the store root (say a corpus unpacked next to the outputs)
    stays."""
    data = tmp_path / "data"
    out = publish(data, "download", UNUSED)
    source = out / "part.txt"
    assert collect_garbage(StageStore(data), set(), protect=(source,)) == []
    assert source.is_file()


def test_gc_command_in_a_new_project_keeps_the_corpus(tmp_path):
    """The CLI end to end in a `zhpipe init` project: the example corpus survives `gc`, dry run
    first."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ZHPIPE_DATA", "ZHPIPE_STORAGE", "ZHPIPE_PROJECT")
    }
    cli = zhpipe_argv()
    subprocess.run(
        [*cli, "init", str(tmp_path / "p")], check=True, capture_output=True, env=env, cwd=ROOT
    )
    corpus = tmp_path / "p" / "data" / "raw" / "example.csv"
    assert corpus.is_file()
    stale = publish(tmp_path / "p" / "data", "clean", UNUSED)
    for args in (["gc", "--dry-run"], ["gc"]):
        done = subprocess.run(
            [*cli, *args], capture_output=True, text=True, env=env, cwd=tmp_path / "p"
        )
        assert done.returncode == 0, done.stderr
        assert "example.csv" not in done.stdout and "raw" not in done.stdout
        assert f"clean/{UNUSED}" in done.stdout, done.stdout
    assert corpus.is_file() and not stale.exists()


@pytest.mark.e2e
def test_what_a_run_on_another_corpus_built_is_kept_until_forgotten(tmp_path):
    """`zhpipe run --source` is in no pipeline of pipelines.yaml: gc keeps its outputs (and says so)
    until `zhpipe gc --forget NAME`, and its runs go to an experiment of their own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ZHPIPE_DATA", "ZHPIPE_STORAGE", "ZHPIPE_PROJECT", "MLFLOW_TRACKING_URI")
    }
    cli = zhpipe_argv()
    project = tmp_path / "p"
    subprocess.run([*cli, "init", str(project)], check=True, capture_output=True, env=env, cwd=ROOT)
    other = tmp_path / "other.csv"
    other.write_text(
        (project / "data" / "raw" / "example.csv")
        .read_text(encoding="utf-8")
        .replace("下次还会再来", "还会来"),
        encoding="utf-8",
    )
    ran = subprocess.run(
        [*cli, "run", "--source", str(other), "--to", "clean"],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "experiment zhpipe-p-other," in ran.stdout
    built = {p.parent.parent.name for p in (project / "data").glob("*/*/manifest.json")}
    assert built == {"download", "clean"}

    dry = subprocess.run(
        [*cli, "gc", "--dry-run"], capture_output=True, text=True, env=env, cwd=project
    )
    assert dry.returncode == 0 and "would remove" not in dry.stdout, dry.stdout
    assert (
        "keeping what `p-other` built" in dry.stdout and "zhpipe gc --forget p-other" in dry.stdout
    )
    wrong = subprocess.run(
        [*cli, "gc", "--forget", "p-nope"], capture_output=True, text=True, env=env, cwd=project
    )
    assert (
        wrong.returncode == 2
        and "p-other" in wrong.stderr
        and len(wrong.stderr.strip().splitlines()) == 1
    )
    forgot = subprocess.run(
        [*cli, "gc", "--forget", "p-other"], capture_output=True, text=True, env=env, cwd=project
    )
    # (and their locks)
    assert forgot.returncode == 0 and forgot.stdout.count("not used by any pipeline") == 2, (
        forgot.stdout
    )
    assert not list((project / "data").glob("*/*/manifest.json")) and other.is_file()


def test_gc_on_an_object_store_keeps_what_any_machines_runs_hold_or_used(tmp_path):
    """A team's store in a bucket (memory:// here), gc from a machine whose mirror is empty: what a
    live run on another machine holds and what a run used within the retention period stay, with the
    reason; an output no pipeline plans and no run used goes, manifest first, with its stale
    record."""
    import json
    import time

    import fsspec

    from flows.plan import leases
    from flows.plan.maintenance import collect_remote

    url = f"memory://gc-{tmp_path.name}"
    writer = StageStore(url, cache=tmp_path / "machine-a")
    old = time.time() - 30 * 86400
    keys = {
        name: f"{i:016x}"
        for i, name in enumerate(("planned", "unused", "live", "used", "used-long-ago"), start=1)
    }
    for key in keys.values():
        tmp = writer.begin("clean", key)
        (tmp / "data.parquet").write_bytes(b"rows")
        writer.publish(
            tmp,
            Manifest(
                stage="clean", key=key, params={}, inputs={}, rows=1, seconds=0.0, created=old
            ),
        )
    fs, folder = fsspec.filesystem("memory"), f"/gc-{tmp_path.name}/_cache/leases"
    fs.pipe_file(
        f"{folder}/machine-b-1-live.json",
        json.dumps(
            {
                "host": "machine-b",
                "pid": 7,
                "started": time.time() - 60,
                "beat": time.time(),
                "keys": [["clean", keys["live"]]],
            }
        ).encode(),
    )
    fs.pipe_file(
        f"{folder}/machine-c-2-old.json",
        json.dumps(
            {
                "host": "machine-c",
                "pid": 8,
                "started": old,
                "beat": old,
                "ended": old,
                "keys": [["clean", keys["used-long-ago"]]],
            }
        ).encode(),
    )
    # a real run's lease: published, beating, then an ended record
    with leases.held(writer, {"clean": keys["used"]}):
        pass
    gc = StageStore(url, cache=tmp_path / "machine-d")
    kept: list[dict] = []
    dry = collect_remote(gc, {("clean", keys["planned"])}, True, 7 * 86400, time.time(), kept)
    assert sorted(d["path"].rsplit("/", 1)[-1] for d in dry) == sorted(
        [keys["unused"], keys["used-long-ago"]]
    )
    assert {k["path"].rsplit("/", 1)[-1]: k["why"] for k in kept} == {
        keys["live"]: "held by a live run on machine-b (pid 7)",
        keys["used"]: "used by a run within the retention period",
    }
    # a dry run removes nothing
    assert all(fs.exists(f"/gc-{tmp_path.name}/clean/{key}/manifest.json") for key in keys.values())
    removed = collect_remote(gc, {("clean", keys["planned"])}, False, 7 * 86400, time.time(), [])
    assert [r["path"] for r in removed] == [d["path"] for d in dry]
    left = {p.rsplit("/", 1)[-1] for p in fs.ls(f"/gc-{tmp_path.name}/clean", detail=False)}
    assert left == {keys["planned"], keys["live"], keys["used"]}
    assert {p.rsplit("/", 1)[-1] for p in fs.ls(folder, detail=False)} >= {"machine-b-1-live.json"}
    # a record older than the retention period goes
    assert not any("machine-c" in p for p in fs.ls(folder, detail=False))
