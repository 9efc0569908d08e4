from flows.store import Manifest, StageStore, stage_key


def test_key_depends_on_params_inputs_and_version():
    base = stage_key("train", "1", {"epochs": 2}, {"vocab": "a"})
    assert base == stage_key("train", "1", {"epochs": 2}, {"vocab": "a"})
    assert base != stage_key("train", "1", {"epochs": 3}, {"vocab": "a"})
    assert base != stage_key("train", "1", {"epochs": 2}, {"vocab": "b"})
    assert base != stage_key("train", "2", {"epochs": 2}, {"vocab": "a"})


def _manifest(key):
    return Manifest(stage="clean", key=key, version="1", params={}, inputs={}, rows=3, seconds=0.1)


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
