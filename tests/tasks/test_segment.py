from flows.config import SegmentConfig
from tasks.segment import segment_texts
from tasks.segmenter import Segmenter

TEXTS = ["我来到北京清华大学", "房间很干净，服务也好", "早餐太差了"]


def test_modes():
    assert Segmenter(SegmentConfig()).words(TEXTS[0]) == ["我", "来到", "北京", "清华大学"]
    full = Segmenter(SegmentConfig(mode="full")).words(TEXTS[0])
    assert {"清华", "华大", "大学", "清华大学"} <= set(full)
    search = Segmenter(SegmentConfig(mode="search")).words(TEXTS[0])
    assert "清华" in search and "清华大学" in search


def test_user_dict_stopwords_and_pos(tmp_path):
    (tmp_path / "user.txt").write_text("很干净 100 a\n", encoding="utf-8")
    (tmp_path / "stop.txt").write_text("，\n也好\n", encoding="utf-8")
    seg = Segmenter(SegmentConfig(user_dict=str(tmp_path / "user.txt"), stopwords=str(tmp_path / "stop.txt"), pos=True))
    rows = seg.rows([TEXTS[1]])
    assert rows["words"] == ["房间 很干净 服务"]  # "，" and "也好" are stopwords
    assert rows["chars"] == ["房 间 很 干 净 ， 服 务 也 好"]
    assert "房间/n" in rows["pos"][0].split()


def test_user_dict_does_not_leak_into_default_segmenter(tmp_path):
    (tmp_path / "user.txt").write_text("很干净 100 a\n", encoding="utf-8")
    Segmenter(SegmentConfig(user_dict=str(tmp_path / "user.txt")))
    assert "很干净" not in Segmenter(SegmentConfig()).words(TEXTS[1])


def test_parallel_output_identical_to_single_process():
    texts = TEXTS * 40
    single = segment_texts(texts, SegmentConfig(workers=1, chunk_rows=7, pos=True))
    parallel = segment_texts(texts, SegmentConfig(workers=2, chunk_rows=7, pos=True))
    assert single == parallel
    assert len(single["words"]) == len(texts)
