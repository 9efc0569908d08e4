import hashlib
import os

import pandas as pd
import pytest

from flows.pools.chunks import DaskPool, shutdown
from tasks.shared.segment import Params as SegmentConfig
from tasks.shared.segment import segment_file
from tasks.util.io import write_parquet
from tasks.util.pool import ChunkPool
from tasks.util.segmenter import Segmenter

TEXTS = ["我来到北京清华大学", "房间很干净，服务也好", "早餐太差了"]


BACKENDS = pytest.mark.parametrize("backend", ["jieba", "jieba-rs"])


@BACKENDS
def test_modes(backend):
    assert Segmenter(SegmentConfig(backend=backend)).words(TEXTS[0]) == [
        "我",
        "来到",
        "北京",
        "清华大学",
    ]
    full = Segmenter(SegmentConfig(backend=backend, mode="full")).words(TEXTS[0])
    assert {"清华", "华大", "大学", "清华大学"} <= set(full)
    search = Segmenter(SegmentConfig(backend=backend, mode="search")).words(TEXTS[0])
    assert "清华" in search and "清华大学" in search


@BACKENDS
def test_user_dict_stopwords_and_pos(tmp_path, backend):
    (tmp_path / "user.txt").write_text("很干净 100 a\n", encoding="utf-8")
    (tmp_path / "stop.txt").write_text("，\n也好\n", encoding="utf-8")
    seg = Segmenter(
        SegmentConfig(
            backend=backend,
            user_dict=str(tmp_path / "user.txt"),
            stopwords=str(tmp_path / "stop.txt"),
            pos=True,
        )
    )
    rows = seg.rows([TEXTS[1]])
    assert rows["words"] == ["房间 很干净 服务"]  # "，" and "也好" are stopwords
    assert rows["chars"] == ["房 间 很 干 净 ， 服 务 也 好"]
    assert "房间/n" in rows["pos"][0].split() and "很干净/a" in rows["pos"][0].split()


@BACKENDS
def test_user_dict_does_not_leak_into_default_segmenter(tmp_path, backend):
    (tmp_path / "user.txt").write_text("很干净 100 a\n", encoding="utf-8")
    Segmenter(SegmentConfig(backend=backend, user_dict=str(tmp_path / "user.txt")))
    assert "很干净" not in Segmenter(SegmentConfig(backend=backend)).words(TEXTS[1])


def test_the_backends_agree_on_chinese_and_differ_on_digit_runs():
    py, rs = Segmenter(SegmentConfig(backend="jieba")), Segmenter(SegmentConfig(backend="jieba-rs"))
    for text in (*TEXTS, "酒店的早餐很丰富，服务员态度热情"):
        assert py.words(text) == rs.words(text)
    assert py.words("6月21-23日") == ["6", "月", "21", "-", "23", "日"] and rs.words(
        "6月21-23日"
    ) == [
        "6",
        "月",
        "21-23",
        "日",
    ]


def test_the_backend_is_part_of_the_segment_key():
    from flows.plan.config import load_pipeline
    from flows.plan.keys import plan_keys

    a, b = (
        plan_keys(load_pipeline("smoke", overrides=[f"segment.backend={x}"]))
        for x in ("jieba", "jieba-rs")
    )
    assert a["split"] == b["split"] and a["segment"] != b["segment"]


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_chunked_output_is_byte_identical_on_processes_and_dask(tmp_path):
    """One process, a local process pool and a 2-worker Dask LocalCluster write the same bytes, and
    the Dask chunks ran in the cluster's worker processes, one row group at a time."""
    texts = TEXTS * 100
    src = tmp_path / "split.parquet"
    write_parquet(
        pd.DataFrame(
            {"id": range(len(texts)), "text": texts, "label": [i % 2 for i in range(len(texts))]}
        ),
        src,
        row_group_rows=90,
    )
    params = SegmentConfig(chunk_rows=40, pos=True)
    outputs = {}
    pools = {"single": ChunkPool(1), "pool": ChunkPool(2), "dask": DaskPool("local", 2)}
    try:
        for name, pool in pools.items():
            counts = segment_file(src, tmp_path / f"{name}.parquet", params, pool, tmp_path)
            assert counts["rows"] == len(texts)
            outputs[name] = _digest(tmp_path / f"{name}.parquet")
    finally:
        shutdown()
    assert outputs["single"] == outputs["pool"] == outputs["dask"]
    dask_pids = {r["pid"] for r in pools["dask"].ran_on}
    # row groups of 90, 90, 90, 30 rows -> 3 + 3 + 3 + 1 chunks
    assert len(pools["dask"].ran_on) == 10
    assert os.getpid() not in dask_pids and len(dask_pids) == 2
    out = pd.read_parquet(tmp_path / "dask.parquet")
    assert out["text"].tolist() == texts and out["words"].iloc[0] == "我 来到 北京 清华大学"


def test_the_row_cache_answers_texts_cut_before_with_the_same_bytes(tmp_path):
    """Segmented twice through the store's row cache: the second time no text is cut, and both files
    are byte for byte the one a segmenter without the cache writes; another segmenter (POS tags) has
    its own namespace."""
    import hashlib

    import pyarrow as pa

    from tasks.shared.segment import _chunk_params, cache_namespace, segment_chunk, write_segments
    from tasks.util.io import chunk_plan
    from tasks.util.rowcache import Keeper, RowCache

    frame = pd.DataFrame(
        {"id": range(120), "text": [f"第{i}条评论：房间干净，服务很好" for i in range(120)]}
    )
    src = tmp_path / "src.parquet"
    frame.to_parquet(src, index=False)

    def segment(params, cache, name):
        tables = (
            pa.Table.from_pandas(
                segment_chunk(c, _chunk_params(params, tmp_path, cache)), preserve_index=False
            )
            for c in chunk_plan(src, 50)
        )
        keeper = Keeper(RowCache(cache, cache_namespace(params, tmp_path))) if cache else None
        counts = write_segments(tables, src, tmp_path / name, keeper)
        if keeper is not None:  # the driver keeps what its workers cut, when the stage ends
            keeper.close()
        return counts["kept"], hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()

    cache = tmp_path / "rowcache.sqlite"
    plain = SegmentConfig(chunk_rows=50)
    without = segment(plain, None, "plain.parquet")
    assert segment(plain, cache, "first.parquet") == (0, without[1])
    assert segment(plain, cache, "second.parquet") == (120, without[1])
    assert segment(SegmentConfig(chunk_rows=50, pos=True), cache, "pos.parquet")[0] == 0
