"""Back-translation through real (tiny, random-weight) MarianMT models and a real HTTP service on
loopback."""

import http.server
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from tasks.classification.augment import Params as AugmentConfig
from tasks.classification.augment import augment_frame
from tasks.classification.augmenters import AugmentContext
from tasks.classification.backtranslation import chinese_share, reject_reason
from tasks.classification.translators import BackTranslationParams as BackTranslationConfig
from tasks.classification.translators import (
    CachedTranslation,
    HttpTranslator,
    Seq2SeqTranslator,
    TranslationCache,
    split_sentences,
)
from tasks.classification.translators import HttpTranslationParams as HttpTranslationConfig
from tasks.classification.translators import TranslationFilterParams as TranslationFilterConfig
from tasks.errors import ZhpipeError
from tasks.shared.segment import Params as SegmentConfig
from tasks.util.hub import ModelMissingError
from tasks.util.urls import conceal
from tests.helpers.tiny_marian import ZH, build_pair

ROOT = Path(__file__).resolve().parents[3]
TRAIN = pd.DataFrame(
    {
        "id": [1, 2, 3, 4],
        "text": ZH[:4],
        "words": ["房间 很 干净", "早餐 太 差 了", "位置 不错", "前台 态度 冷淡"],
        "chars": ["房 间", "早 餐", "位 置", "前 台"],
        "label": ["1", "0", "1", "0"],
    }
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("marian"))


def bt_params(models, **kw):
    zh_en, en_zh = models
    return BackTranslationConfig(
        pivots=[{"lang": "en", "forward": str(zh_en), "backward": str(en_zh)}],
        max_length=12,
        num_beams=1,
        batch_size=2,
        **kw,
    )


def test_split_sentences_round_trip():
    assert split_sentences("短句。", 10) == ["短句。"]
    text = "第一句话很长很长。第二句也不短！第三句？最后"
    pieces = split_sentences(text, 10)
    assert len(pieces) > 1 and "".join(pieces) == text and all(len(p) <= 10 for p in pieces[:-1])


def test_filters_each_reason():
    f = TranslationFilterConfig()
    src = "房间很干净，服务也很好，下次还来"
    assert reject_reason(src, src, f, set()) == "identical"
    assert reject_reason(src, "好", f, set()) == "length_ratio"
    assert reject_reason(src, "The room is clean and nice", f, set()) == "not_chinese"
    assert reject_reason(src, "房间很干净，服务也很好，下次还来啊", f, set()) == "too_similar"
    assert reject_reason(src, "今天股市大跌投资者损失惨重了", f, set()) == "too_dissimilar"
    good = "屋子非常干净，服务也不错，下回还来"
    assert reject_reason(src, good, f, set()) is None
    assert reject_reason(src, good, f, {good}) == "duplicate"
    assert chinese_share("abc中文") == 0.4


def test_seq2seq_batched_equals_one_by_one(models):
    t = Seq2SeqTranslator(str(models[0]), bt_params(models), "auto")
    batched = t.translate(ZH[:4], 1)
    single = [t.translate([s], 1)[0] for s in ZH[:4]]
    assert batched == single and all(len(v) == 1 for v in batched)
    assert len(t.translate(ZH[:2], 3)[0]) == 3  # three beams as variants


def test_cache_translates_nothing_twice(models, tmp_path):
    t = Seq2SeqTranslator(str(models[0]), bt_params(models), "auto")
    cache = TranslationCache(tmp_path / "c.sqlite")
    first = CachedTranslation(t, cache, "zh-en", {"n": 1}, 2)
    out = first(ZH[:4] + ZH[:2], 1)
    assert (first.hits, first.misses) == (0, 4) and set(out) == set(ZH[:4])
    again = CachedTranslation(t, cache, "zh-en", {"n": 1}, 2)
    assert again(ZH[:4], 1) == {k: out[k] for k in ZH[:4]} and (again.hits, again.misses) == (4, 0)
    # other settings, other key
    other = CachedTranslation(t, cache, "zh-en", {"n": 1, "num_beams": 4}, 2)
    other(ZH[:1], 1)
    assert other.misses == 1


_KILLED_CHILD = """
import sys, time
from pathlib import Path
from tasks.classification.translators import BackTranslationParams as BackTranslationConfig
from tasks.classification.translators import CachedTranslation, Seq2SeqTranslator, TranslationCache
texts = [f"第{i}句：" + s for i in range(40) for s in [sys.argv[3]]]
t = Seq2SeqTranslator(sys.argv[1], BackTranslationConfig(max_length=12, num_beams=1), "cpu")
class Bar:
    def update(self, n):
        print("batch", flush=True)
        time.sleep(0.2)
CachedTranslation(t, TranslationCache(Path(sys.argv[2])), "zh-en", {"n": 1}, 4)(texts, 1, Bar())
"""


def test_killed_translation_resumes_from_cache(models, tmp_path):
    cache_file = tmp_path / "c.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CHILD, str(models[0]), str(cache_file), ZH[0]],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    for _ in range(3):
        assert proc.stdout.readline().strip() == "batch"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    texts = [f"第{i}句：" + ZH[0] for i in range(40)]
    t = Seq2SeqTranslator(str(models[0]), BackTranslationConfig(max_length=12, num_beams=1), "cpu")
    resumed = CachedTranslation(t, TranslationCache(cache_file), "zh-en", {"n": 1}, 4)
    resumed(texts, 1)
    assert 12 <= resumed.hits < 40 and resumed.hits + resumed.misses == 40


def test_backtranslation_augmenter_with_provenance_and_rerun_hits(models, tmp_path):
    params = AugmentConfig(
        method="backtranslation",
        backtranslation=bt_params(
            models,
            num_variants=2,
            filters={
                "min_chinese": 0.0,
                "min_similarity": 0.0,
                "max_length_ratio": 10,
                "min_length_ratio": 0.0,
            },
        ),
    )
    heldout = {"早餐不好吃"}
    ctx = AugmentContext(params, SegmentConfig(), tmp_path / "cache.sqlite", heldout)
    out, result = augment_frame(TRAIN, ctx)
    assert result.method_used == "backtranslation"
    m = result.metrics
    assert m["candidates"] == 4 * 2
    assert m["candidates"] == result.metrics["candidates"] and m["cache_misses"] > 0
    kept = out[out["aug_method"] == "backtranslation"]
    assert len(kept) == m["candidates"] - sum(v for k, v in m.items() if k.startswith("filtered_"))
    for row in kept.itertuples():
        assert row.label == TRAIN.set_index("id").loc[row.source_id, "label"]
        assert (
            row.pivot == "en"
            and row.model_forward == str(models[0])
            and row.model_backward == str(models[1])
        )
        assert row.words.replace(" ", "") == row.text.replace(" ", "")
    assert not set(out["text"]) & heldout
    assert {"source", "pivot_text", "back_translation", "kept", "reason"} <= set(
        result.sample.columns
    )
    _, again = augment_frame(TRAIN, ctx)
    assert again.metrics["cache_hit_rate"] == 1.0 and again.metrics["cache_misses"] == 0


def test_missing_model_is_one_clear_error_or_falls_back_to_eda(tmp_path):
    params = AugmentConfig(
        method="backtranslation",
        backtranslation={"pivots": [{"lang": "en", "forward": "Helsinki-NLP/opus-mt-zh-en"}]},
    )
    ctx = AugmentContext(params, SegmentConfig(), tmp_path / "c.sqlite")
    with pytest.raises(
        ModelMissingError,
        match=r"'Helsinki-NLP/opus-mt-zh-en' not found locally.*HF_HOME.*huggingface-cli download",
    ):
        augment_frame(TRAIN, ctx)
    ctx.params = params.model_copy(update={"fallback": "eda"})
    out, result = augment_frame(TRAIN, ctx)
    assert result.method_used == "eda" and set(out["aug_method"]) == {"original", "eda"}


class _Service(http.server.BaseHTTPRequestHandler):
    """LibreTranslate-style /translate that answers 429, then 503, then translates (reverses the
    text)."""

    script: list = []
    bodies: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Service.bodies.append((time.monotonic(), body))
        status = _Service.script.pop(0) if _Service.script else 200
        if status != 200:
            self.send_response(status)
            self.send_header("Retry-After", "0")
            self.end_headers()
            return
        q = body["q"] if isinstance(body["q"], list) else [body["q"]]
        data = json.dumps({"translatedText": [t[::-1] for t in q]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_http_backend_retries_rate_limits_and_hides_key(service, monkeypatch, caplog):
    monkeypatch.setenv("ZH_MT_KEY", "s3cret-key")
    _Service.script, _Service.bodies = [429, 503], []
    params = HttpTranslationConfig(
        url=service, api_key_env="ZH_MT_KEY", requests_per_second=20, retries=3
    )
    t = HttpTranslator(params, "zh", "en")
    with caplog.at_level(logging.WARNING):
        out = t.translate(["你好", "再见"], 1)
    assert out == [["好你"], ["见再"]]
    assert len(_Service.bodies) == 3 and _Service.bodies[-1][1]["api_key"] == "s3cret-key"
    assert "429" in caplog.text and "503" in caplog.text and "s3cret-key" not in caplog.text
    # the pacing is the client's: timed as the requests leave it (the server's receive times bunch
    # up on a busy machine)
    sent, post = [], t.client.post
    monkeypatch.setattr(
        t.client, "post", lambda *a, **kw: sent.append(time.monotonic()) or post(*a, **kw)
    )
    _Service.bodies = []
    for _ in range(6):
        t.translate(["一"], 1)
    assert len(sent) == len(_Service.bodies) == 6
    # at most 20 requests per second (less the moment between slot and send)
    assert sent[-1] - sent[0] >= 5 / 20 * 0.9


def test_http_backend_gives_up_with_one_line(service):
    _Service.script = [500] * 10
    t = HttpTranslator(HttpTranslationConfig(url=service, api_key_env=None, retries=1), "zh", "en")
    with pytest.raises(Exception, match=r"gave up after 2 attempts \(HTTP 500\)"):
        t.translate(["你好"], 1)
    _Service.script = []


def test_http_backend_through_the_augmenter(service, tmp_path):
    """The service reverses text, so a round trip returns the source: every candidate is
    `identical`."""
    _Service.script, _Service.bodies = [], []
    params = AugmentConfig(
        method="backtranslation",
        backtranslation={
            "backend": "http",
            "pivots": [{"lang": "en"}, {"lang": "ja"}],
            "http": {"url": service, "api_key_env": None, "requests_per_second": 100},
        },
    )
    out, result = augment_frame(
        TRAIN, AugmentContext(params, SegmentConfig(), tmp_path / "c.sqlite")
    )
    assert result.metrics["candidates"] == 8 and result.metrics["filtered_identical"] == 8
    assert len(out) == len(TRAIN)
    targets = {(b["source"], b["target"]) for _, b in _Service.bodies}
    assert targets == {("zh", "en"), ("en", "zh"), ("zh", "ja"), ("ja", "zh")}


def test_http_batch_size_sets_texts_per_request(service, tmp_path):
    _Service.script, _Service.bodies = [], []
    params = AugmentConfig(
        method="backtranslation",
        backtranslation={
            "backend": "http",
            "batch_size": 16,
            "pivots": [{"lang": "en"}],
            "http": {
                "url": service,
                "api_key_env": None,
                "requests_per_second": 100,
                "batch_size": 3,
            },
        },
    )
    augment_frame(TRAIN, AugmentContext(params, SegmentConfig(), tmp_path / "c.sqlite"))
    assert max(len(b["q"]) for _, b in _Service.bodies) == 3


def test_api_key_goes_only_over_https_or_loopback(monkeypatch):
    monkeypatch.setenv("ZH_MT_KEY", "s3cret-key")
    with pytest.raises(ZhpipeError, match=r"sent only over https or to this machine"):
        HttpTranslator(
            HttpTranslationConfig(url="http://translate.example.org", api_key_env="ZH_MT_KEY"),
            "zh",
            "en",
        )
    HttpTranslator(
        HttpTranslationConfig(url="https://translate.example.org", api_key_env="ZH_MT_KEY"),
        "zh",
        "en",
    )
    HttpTranslator(
        HttpTranslationConfig(url="http://127.0.0.1:5000", api_key_env="ZH_MT_KEY"), "zh", "en"
    )


def test_refused_request_shows_neither_the_answer_nor_credentials(service):
    _Service.script = [400]
    t = HttpTranslator(
        HttpTranslationConfig(
            url=conceal(service.replace("http://", "http://u:pw@")), api_key_env=None
        ),
        "zh",
        "en",
    )
    with pytest.raises(ZhpipeError) as err:
        t.translate(["你好"], 1)
    assert (
        "HTTP 400" in str(err.value)
        and "pw" not in str(err.value)
        and "***@127.0.0.1" in str(err.value)
    )
    _Service.script = []
