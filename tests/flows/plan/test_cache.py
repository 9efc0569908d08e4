"""The stage cache decides reuse: a published, sound output is found and restored; a missing one is
a miss; a corrupt one is reported, removed and missed; a forced rebuild starts from an empty scratch
folder."""

import logging

import pytest

from flows.plan.cache import StageCache
from flows.plan.store import Manifest, StageStore
from tasks.core import Facts
from tasks.errors import ZhpipeError


def _saved(cache: StageCache, key: str, text: str = "好") -> Manifest:
    tmp, _ = cache.begin("clean", key)
    (tmp / "data.txt").write_text(text, encoding="utf-8")
    manifest = Manifest(
        stage="clean",
        key=key,
        params={},
        inputs={},
        rows=1,
        seconds=0.1,
        metrics={"rows_dropped": 0},
        facts=Facts(labels=["0", "1"]).to_json(),
    )
    cache.save(tmp, manifest)
    return manifest


def test_a_saved_output_is_found_and_restored_and_a_missing_one_is_a_miss(tmp_path):
    cache = StageCache(StageStore(tmp_path))
    assert cache.lookup("clean", "k1") is None
    with pytest.raises(
        ZhpipeError,
        match="stage 'clean' has no cached output for this config .key k1.; run it first",
    ):
        cache.reuse("clean", "k1")
    _saved(cache, "k1")
    found = cache.lookup("clean", "k1")
    assert found is not None and found.key == "k1"
    result = cache.restore(found)
    assert (result.cache, result.rows, result.metrics, result.facts.labels) == (
        "hit",
        1,
        {"rows_dropped": 0},
        ["0", "1"],
    )
    assert (result.path / "data.txt").read_text(encoding="utf-8") == "好"
    assert cache.reuse("clean", "k1").key == "k1"


def test_a_corrupt_output_is_reported_removed_and_missed(tmp_path, caplog):
    cache = StageCache(StageStore(tmp_path))
    _saved(cache, "k1")
    # same size, other bytes
    (tmp_path / "clean" / "k1" / "data.txt").write_text("坏", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="zhpipe"):
        assert cache.lookup("clean", "k1") is None
    assert (
        "clean: cached output k1 is corrupt (data.txt: sha256 differs from the manifest); "
        "rebuilding it" in caplog.text
    )
    assert not (tmp_path / "clean" / "k1").exists()
    _saved(cache, "k2")
    (tmp_path / "clean" / "k2" / "data.txt").unlink()
    with pytest.raises(
        ZhpipeError, match="its cached output k2 failed verification and was removed"
    ):
        cache.reuse("clean", "k2")


def test_full_verification_finds_a_file_the_manifest_does_not_list(tmp_path):
    _saved(StageCache(StageStore(tmp_path)), "k1")
    (tmp_path / "clean" / "k1" / "extra.txt").write_text("x")
    # a quick check reads the listed files only
    assert StageCache(StageStore(tmp_path)).verify("clean", "k1") == []
    assert StageCache(StageStore(tmp_path), full=True).verify("clean", "k1") == [
        "extra.txt: not in the manifest"
    ]


def test_a_forced_build_starts_from_an_empty_scratch_folder_and_finds_nothing(tmp_path):
    """--force is the cache's to decide: a forced stage's units (a model's too) are not looked up
    and start from an empty scratch folder; what the run reads of them is still read."""
    cache = StageCache(StageStore(tmp_path))
    _saved(cache, "k1")
    _, scratch = cache.begin("clean", "k1")
    (scratch / "checkpoint.pt").write_bytes(b"epoch 3")
    # a rerun resumes
    assert (cache.begin("clean", "k1")[1] / "checkpoint.pt").exists()
    forced = StageCache(StageStore(tmp_path), force={"clean"})
    assert forced.lookup("clean", "k1") is None and cache.lookup("clean", "k1") is not None
    assert forced.reuse("clean", "k1").key == "k1"  # read, when the run only reads it
    assert forced.forced("clean.textcnn") and not forced.forced("split")
    assert list(forced.begin("clean", "k1")[1].iterdir()) == []  # --force starts over
