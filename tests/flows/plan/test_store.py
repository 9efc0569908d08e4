from flows.plan.store import Manifest, StageStore, stage_key


def test_key_depends_on_every_cause():
    causes = {
        "stage": "train",
        "params": {"epochs": 2},
        "inputs": {"vocab": "a"},
        "code": {"tasks.classification.train": "c1"},
        "libraries": {"torch": "2.13.0"},
        "files": {},
    }
    base = stage_key(causes)
    assert base == stage_key(dict(causes))
    for part, value in (
        ("params", {"epochs": 3}),
        ("inputs", {"vocab": "b"}),
        ("code", {"tasks.classification.train": "c2"}),
        ("libraries", {"torch": "2.14.0"}),
        ("files", {"dict.txt": "sha256:1"}),
    ):
        assert base != stage_key({**causes, part: value}), part


def _manifest(key):
    return Manifest(stage="clean", key=key, params={}, inputs={}, rows=3, seconds=0.1)


def test_unpublished_output_does_not_count(tmp_path):
    store = StageStore(tmp_path)
    tmp = store.begin("clean", "k1")
    (tmp / "data.parquet").write_bytes(b"half")
    assert not store.is_done("clean", "k1")  # a killed run leaves only a .tmp folder
    store.publish(tmp, _manifest("k1"))
    assert store.is_done("clean", "k1")
    assert (store.path("clean", "k1") / "data.parquet").read_bytes() == b"half"
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "clean").iterdir())


def test_republish_replaces_and_others_lists_stale(tmp_path):
    store = StageStore(tmp_path)
    for key in ("k1", "k2", "k2"):
        store.publish(store.begin("clean", key), _manifest(key))
    assert store.others("clean", "k1") == ["k2"]
    assert store.manifest("clean", "k2").rows == 3


def test_begin_removes_the_temporary_folders_of_dead_builds_only(tmp_path):
    import os
    import subprocess
    import sys

    store = StageStore(tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    (tmp_path / "clean" / f".tmp-k1-{dead}").mkdir(parents=True)  # a killed build of this key
    (tmp_path / "clean" / ".tmp-k1-1").mkdir()  # pid 1 is alive: another build still running
    (tmp_path / "clean" / f".tmp-k2-{dead}").mkdir()  # another key: not this build's business
    store.begin("clean", "k1")
    assert sorted(p.name for p in (tmp_path / "clean").iterdir()) == sorted(
        [".tmp-k1-1", f".tmp-k2-{dead}", f".tmp-k1-{os.getpid()}"]
    )


def test_status_explains_a_pipeline_by_its_own_builds_only(tmp_path):
    """A stage another pipeline built with other settings is not this pipeline's stale build: never
    built here is "missing", and a build of this pipeline's explains what changed."""
    from flows.plan.status import stage_states
    from flows.plan.store import Manifest, StageStore

    store = StageStore(tmp_path / "store")
    theirs = {
        "params": {"models": ["tfidf_lr", "fasttext"]},
        "inputs": {},
        "code": {},
        "libraries": {"fasttext": "0.9.3"},
    }
    for key, pipeline, causes in (("0123456789abcdef", "chnsenticorp", theirs),):
        out = tmp_path / "store" / "train" / key
        out.mkdir(parents=True)
        Manifest(
            stage="train",
            key=key,
            params={},
            inputs={},
            rows=1,
            seconds=0.0,
            causes=causes,
            pipeline=pipeline,
        ).write(out)
    mine = {"params": {"models": ["crf"]}, "inputs": {}, "code": {}, "libraries": {}}
    [row] = stage_states(
        store, {"train": mine}, {"train": "fedcba9876543210"}, pipeline="resume-ner"
    )
    assert row["state"] == "missing" and row["why"] == [
        "never built for this pipeline; pipeline chnsenticorp's build differs: param train.models: "
        "['tfidf_lr', 'fasttext'] -> ['crf']; library fasttext 0.9.3 -> none"
    ], row
    [row] = stage_states(
        store,
        {"train": {**theirs, "params": {"models": ["tfidf_lr"]}}},
        {"train": "fedcba9876543210"},
        pipeline="chnsenticorp",
    )
    assert row["state"] == "stale" and row["why"] == [
        "param train.models: ['tfidf_lr', 'fasttext'] -> ['tfidf_lr']"
    ]
