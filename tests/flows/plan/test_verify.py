"""Verified outputs: the manifest records each file's size and sha256; a reused output that does not
match is reported in one line and rebuilt, never used; `zhpipe verify` and `zhpipe gc` keep a store
sound and small."""

import json
import logging
from pathlib import Path

import pytest

from flows.orchestrate.pipeline import pipeline_flow, select_stages
from tasks.util.io import file_sha256
from tests.helpers.cli import in_process

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e


def run(store, sets=(), **kw):
    out = pipeline_flow(
        "smoke", overrides=list(sets), storage=str(store), stages=select_stages(stop="split"), **kw
    )
    return {r["stage"]: r for r in out["stages"]}


@pytest.fixture(scope="module")
def store(prefect_harness, tmp_path_factory):
    folder = tmp_path_factory.mktemp("verify-store")
    run(folder)
    return folder


def test_manifest_records_every_file(store):
    split = next((store / "split").glob("[!.]*"))
    files = json.loads((split / "manifest.json").read_text())["files"]
    assert set(files) == {
        "train.parquet",
        "validation.parquet",
        "test.parquet",
        "quarantine.parquet",
    }
    for rel, facts in files.items():
        assert facts == {"size": (split / rel).stat().st_size, "sha256": file_sha256(split / rel)}


def test_a_truncated_output_is_rebuilt_not_used(store, caplog):
    split = next((store / "split").glob("[!.]*"))
    good = (split / "train.parquet").read_bytes()
    (split / "train.parquet").write_bytes(good[: len(good) // 2])
    with caplog.at_level(logging.WARNING, logger="zhpipe"):
        stages = run(store)
    assert stages["split"]["cache"] == "miss" and stages["clean"]["cache"] == "hit"
    assert (split / "train.parquet").read_bytes() == good  # rebuilt, same bytes
    assert any(
        "split: cached output" in r.message and "is corrupt (train.parquet:" in r.message
        for r in caplog.records
    )


def test_an_edited_file_of_the_same_size_is_caught(store):
    split = next((store / "split").glob("[!.]*"))
    data = bytearray((split / "test.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (split / "test.parquet").write_bytes(bytes(data))
    assert run(store)["split"]["cache"] == "miss"


def test_verify_and_gc_commands(store, monkeypatch, capsys):
    """The commands in this process (their parsing and output are the CLI's own; subprocess runs of
    the CLI are in test_cli.py)."""

    monkeypatch.setenv("ZHPIPE_STORAGE", str(store))

    def cli(*args):  # the command in this process (tests/helpers/cli.py)
        return in_process(capsys, *args)

    ok = cli("verify")
    assert ok.returncode == 0 and "0 corrupt" in ok.stdout, ok.stdout + ok.stderr
    run(store, ["split.seed=7"])  # an output no pipeline in pipelines.yaml uses
    clean = next((store / "clean").glob("[!.]*"))
    (clean / "quarantine.parquet").write_bytes(b"x")
    bad = cli("verify")
    assert (
        bad.returncode == 1
        and f"clean/{clean.name}: quarantine.parquet: 1 bytes, manifest says" in bad.stdout
    )
    (store / "split" / ".tmp-0123456789abcdef-999999999").mkdir()  # left by a killed build
    dry = cli("gc", "--dry-run")
    assert (
        dry.returncode == 0
        and "would remove" in dry.stdout
        and ".tmp-0123456789abcdef-999999999" in dry.stdout
    )
    assert len(list((store / "split").glob("[!.]*"))) == 2
    done = cli("gc")
    assert done.returncode == 0 and "freed" in done.stdout
    assert (
        len(list((store / "split").glob("[!.]*"))) == 1
        and not (store / "split" / ".tmp-0123456789abcdef-999999999").exists()
    )


def test_verify_catches_unlisted_files_and_paths_outside_the_output(tmp_path):
    """A tampered file whose manifest entry was removed, and a manifest entry that points outside
    the output."""
    from flows.plan.store import Manifest, StageStore

    store = StageStore(tmp_path / "store")
    out = tmp_path / "store" / "clean" / "0123456789abcdef"
    out.mkdir(parents=True)
    (out / "data.parquet").write_bytes(b"good")
    (tmp_path / "secret").write_bytes(b"outside")
    files = {"data.parquet": {"size": 4, "sha256": file_sha256(out / "data.parquet")}}
    Manifest(
        stage="clean",
        key="0123456789abcdef",
        params={},
        inputs={},
        rows=1,
        seconds=0.0,
        files=files,
    ).write(out)
    assert store.verify("clean", "0123456789abcdef", full=True) == []
    (out / "extra.parquet").write_bytes(b"planted")
    assert store.verify("clean", "0123456789abcdef", full=True) == [
        "extra.parquet: not in the manifest"
    ]
    (out / "extra.parquet").unlink()
    files["../../../secret"] = {"size": 7, "sha256": file_sha256(tmp_path / "secret")}
    Manifest(
        stage="clean",
        key="0123456789abcdef",
        params={},
        inputs={},
        rows=1,
        seconds=0.0,
        files=files,
    ).write(out)
    assert store.verify("clean", "0123456789abcdef", full=True) == [
        "../../../secret: a manifest path outside the output"
    ]


def test_a_truncated_manifest_is_one_warning_a_rebuild_a_corrupt_count_and_a_status_row(
    store, caplog, capsys, monkeypatch
):
    from flows.cli import main

    monkeypatch.setenv("ZHPIPE_STORAGE", str(store))
    [clean] = [p for p in (store / "clean").glob("[!.]*") if p.name == run(store)["clean"]["key"]]
    manifest = clean / "manifest.json"
    good = manifest.read_bytes()
    manifest.write_bytes(good[: len(good) // 3])  # truncated by a crash or a full disk
    assert main(["verify"]) == 1
    out = capsys.readouterr().out
    assert f"clean/{clean.name}:" in out and "unreadable manifest" in out and "0 corrupt" not in out
    assert main(["status", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "corrupt" in out and "unreadable manifest" in out
    with caplog.at_level(logging.WARNING, logger="zhpipe"):
        stages = run(store)
    warned = [r.getMessage() for r in caplog.records if "unreadable manifest" in r.getMessage()]
    assert len(warned) == 1 and str(manifest) in warned[0] and "rebuilding it" in warned[0]
    assert (
        stages["clean"]["cache"] == "miss" and json.loads(manifest.read_text())["key"] == clean.name
    )
    assert main(["verify"]) == 0 and "0 corrupt" in capsys.readouterr().out


def test_verify_on_an_object_store_reads_the_bucket_not_the_mirror(tmp_path):
    """A team's store on an object store (memory:// here, in this process): `verify` checks what
    every machine reads, the objects themselves, even from a machine whose mirror is empty; a
    tampered, a missing and an unlisted object are each named."""
    import fsspec

    from flows.plan.maintenance import verify_store
    from flows.plan.store import Manifest, StageStore

    url = f"memory://verify-{tmp_path.name}"
    writer = StageStore(url, cache=tmp_path / "machine-a")
    for key in ("0123456789abcdef", "fedcba9876543210"):
        tmp = writer.begin("clean", key)
        (tmp / "data.parquet").write_bytes(b"rows " + key.encode())
        (tmp / "quarantine.parquet").write_bytes(b"none")
        writer.publish(
            tmp, Manifest(stage="clean", key=key, params={}, inputs={}, rows=1, seconds=0.0)
        )
    reader = StageStore(url, cache=tmp_path / "machine-b")  # another machine: nothing in its mirror
    assert [r["problems"] for r in verify_store(reader)] == [[], []]
    fs, base = fsspec.filesystem("memory"), f"/verify-{tmp_path.name}/clean"
    # same size, other bytes
    fs.pipe_file(f"{base}/0123456789abcdef/data.parquet", b"rows 0123456789abcdeX")
    fs.rm_file(f"{base}/fedcba9876543210/quarantine.parquet")
    fs.pipe_file(f"{base}/fedcba9876543210/extra.bin", b"x")
    found = {r["key"]: r["problems"] for r in verify_store(reader)}
    assert found == {
        "0123456789abcdef": ["data.parquet: sha256 differs from the manifest"],
        "fedcba9876543210": ["extra.bin: not in the manifest", "quarantine.parquet: missing"],
    }
    assert not (tmp_path / "machine-b").exists() or not any(
        (tmp_path / "machine-b").rglob("*.parquet")
    )
