import gzip
import hashlib
import http.server
import json
import threading
import zipfile

import pandas as pd
import pytest

from tasks.download import ChecksumError, extract, fetch, read_table, verify
from tasks.download import Source as SourceConfig
from tasks.errors import DataError

ROWS = [("1", "房间很干净"), ("0", "服务太差了"), ("1", "早餐不错")]


def src(**kw):
    return SourceConfig(**{"path": "x", "text_column": "review", "label_column": "label", **kw})


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "gb18030", "gbk"])
def test_csv_encodings_detected(tmp_path, encoding):
    path = tmp_path / "c.csv"
    path.write_bytes(("label,review\n" + "".join(f"{l},{t}\n" for l, t in ROWS)).encode(encoding))
    df = read_table(path, src())
    assert df["text"].tolist() == [t for _, t in ROWS]
    assert df["label"].tolist() == ["1", "0", "1"]
    assert df["id"].tolist() == [0, 1, 2]


def test_tsv_jsonl_parquet_txt(tmp_path):
    (tmp_path / "a.tsv").write_text("label\treview\n" + "".join(f"{l}\t{t}\n" for l, t in ROWS), encoding="utf-8")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"label": l, "review": t}, ensure_ascii=False) + "\n" for l, t in ROWS), encoding="utf-8")
    pd.DataFrame({"label": [1, 0, 1], "review": [t for _, t in ROWS]}).to_parquet(tmp_path / "a.parquet")
    for name in ("a.tsv", "a.jsonl", "a.parquet"):
        df = read_table(tmp_path / name, src())
        assert df["text"].tolist() == [t for _, t in ROWS], name
        assert df["label"].tolist() == ["1", "0", "1"], name
    (tmp_path / "a.txt").write_text("第一行\n\n第二行\n", encoding="utf-8")
    df = read_table(tmp_path / "a.txt", src(text_column="text", label_column=None))
    assert df["text"].tolist() == ["第一行", "第二行"] and "label" not in df


def test_missing_column_lists_columns_found(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("label,content\n1,好\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"no text column 'review' \(columns found: label, content\)"):
        read_table(path, src())


def test_empty_corpus_and_empty_label(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("label,review\n", encoding="utf-8")
    with pytest.raises(DataError, match="empty"):
        read_table(path, src())
    path.write_text("label,review\n1,好\n,差\n", encoding="utf-8")
    with pytest.raises(DataError, match="1 rows have an empty label.*row 2"):
        read_table(path, src())


def test_unknown_suffix_needs_format(tmp_path):
    path = tmp_path / "c.data"
    path.write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match="set source.format"):
        read_table(path, src())


def test_checksum(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    good = hashlib.sha256(b"abc").hexdigest()
    assert verify(path, good) == good
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        verify(path, "0" * 64)


def test_zip_extract_and_zip_slip_refused(tmp_path):
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("corpus/data.csv", "label,review\n1,好\n")
        zf.writestr("README.md", "x")
    out = extract(good, tmp_path / "x", None)
    assert out.read_text(encoding="utf-8").startswith("label")
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../../escape.csv", "a")
    with pytest.raises(DataError, match="escapes the extraction folder"):
        extract(evil, tmp_path / "y", None)
    assert not (tmp_path / "escape.csv").exists()


def test_gz_extract(tmp_path):
    path = tmp_path / "data.csv.gz"
    with gzip.open(path, "wb") as f:
        f.write("label,review\n1,好\n".encode())
    assert extract(path, tmp_path / "x", None).name == "data.csv"


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves one payload with Range support; fails the first `fail` requests with 503."""

    payload = b""
    ranges: list = []
    fail = 0

    def do_GET(self):
        if _Handler.fail:
            _Handler.fail -= 1
            self.send_error(503)
            return
        rng = self.headers.get("Range")
        _Handler.ranges.append(rng)
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        body = self.payload[start:]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_http_download_resumes_partial_file(tmp_path, server):
    payload = ("label,review\n" + "1,房间很干净\n" * 5000).encode()
    _Handler.payload, _Handler.ranges = payload, []
    (tmp_path / "corpus.csv.part").write_bytes(payload[:1000])  # a killed earlier attempt
    path = fetch(f"{server}/corpus.csv", tmp_path, timeout_s=5)
    assert path.read_bytes() == payload
    assert _Handler.ranges == ["bytes=1000-"]
    verify(path, hashlib.sha256(payload).hexdigest())


def test_http_5xx_raises_retryable_error(tmp_path, server):
    import httpx

    _Handler.payload, _Handler.fail = b"label,review\n1,x\n", 1
    with pytest.raises(httpx.HTTPStatusError):  # not a ZhpipeError: Prefect retries it
        fetch(f"{server}/c.csv", tmp_path, timeout_s=5)
    assert fetch(f"{server}/c.csv", tmp_path, timeout_s=5).read_bytes() == b"label,review\n1,x\n"


def test_unreadable_files_are_one_line_errors(tmp_path):
    bad = tmp_path / "c.parquet"
    bad.write_bytes(b"\x00\x01 not parquet")
    with pytest.raises(DataError, match=r"c.parquet: unreadable parquet"):
        read_table(bad, src())
    broken = tmp_path / "c.jsonl"
    broken.write_text('{"review": "好", "label": 1}\n{not json\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"c.jsonl: unreadable jsonl"):
        read_table(broken, src())
