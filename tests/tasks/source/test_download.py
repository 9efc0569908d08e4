import gzip
import hashlib
import http.server
import io
import json
import tarfile
import threading
import time
import zipfile

import pandas as pd
import pytest

from tasks.classification.download import Params
from tasks.errors import DataError
from tasks.source.archives import extract
from tasks.source.fetch import ChecksumError, Validators, check_sha256, fetch, probe
from tasks.source.readers import empty_quarantine, labelled, no_rows, physical_lines, read_batches
from tasks.source.schema import Source as SourceConfig

ROWS = [("1", "房间很干净"), ("0", "服务太差了"), ("1", "早餐不错")]
# back-off in 50 ms steps, not seconds
FAST = Params(timeout_s=5, retries=2, deadline_s=30, retry_delay_s=0.05)


def src(**kw):
    return SourceConfig(**{"path": "x", "text_column": "review", "label_column": "label", **kw})


def read(path, **kw):
    """The whole file through the download's streaming reader: (rows, quarantined rows, facts)."""
    source, frames, bad, physical = src(**kw), [], [], 0
    for df, quarantine, lines in read_batches(path, source):
        frames.append(df)
        bad.append(quarantine)
        physical += lines
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    quarantine = pd.concat(bad, ignore_index=True) if bad else empty_quarantine()
    if df.empty:
        no_rows(path, quarantine["reason"].value_counts().to_dict())
    return (
        df,
        quarantine,
        {"lines_physical": physical, "labelled": labelled(source, path.suffix.lstrip("."))},
    )


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "gb18030", "gbk", "utf-16"])
def test_csv_encodings_detected(tmp_path, encoding):
    path = tmp_path / "c.csv"
    path.write_bytes(
        ("label,review\n" + "".join(f"{lab},{t}\n" for lab, t in ROWS)).encode(encoding)
    )
    df, quarantine, _ = read(path)
    assert df["text"].tolist() == [t for _, t in ROWS]
    assert df["label"].tolist() == ["1", "0", "1"]
    assert df["id"].tolist() == [0, 1, 2] and df["line"].tolist() == [2, 3, 4] and quarantine.empty


def test_tsv_jsonl_parquet_txt(tmp_path):
    (tmp_path / "a.tsv").write_text(
        "label\treview\n" + "".join(f"{lab}\t{t}\n" for lab, t in ROWS), encoding="utf-8"
    )
    (tmp_path / "a.jsonl").write_text(
        "".join(
            json.dumps({"label": lab, "review": t}, ensure_ascii=False) + "\n" for lab, t in ROWS
        ),
        encoding="utf-8",
    )
    pd.DataFrame({"label": [1, 0, 1], "review": [t for _, t in ROWS]}).to_parquet(
        tmp_path / "a.parquet"
    )
    for name in ("a.tsv", "a.jsonl", "a.parquet"):
        df, _, _ = read(tmp_path / name)
        assert df["text"].tolist() == [t for _, t in ROWS], name
        assert df["label"].tolist() == ["1", "0", "1"], name
    (tmp_path / "a.txt").write_text("第一行\n\n第二行\n", encoding="utf-8")
    df, _, _ = read(tmp_path / "a.txt", text_column="text", label_column=None)
    assert df["text"].tolist() == ["第一行", "第二行"] and "label" not in df


def test_lines_split_only_on_newline():
    assert physical_lines("a\u2028b\x85c\x1cd\r\ne\nf") == ["a\u2028b\x85c\x1cd", "e", "f"]


def test_jsonl_with_raw_line_separator_is_one_row(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(
        json.dumps({"review": "上句\u2028下句", "label": "1"}, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    df, quarantine, _ = read(path)
    assert df["text"].tolist() == ["上句\u2028下句"] and quarantine.empty


def test_stray_quote_is_quarantined_with_its_line_and_does_not_swallow_rows(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text('label,review\n1,好\n0,"坏的开始\n1,不错\n0,很差\n1,可以\n', encoding="utf-8")
    df, quarantine, facts = read(path)
    assert df["text"].tolist() == ["好", "不错", "很差", "可以"]
    assert (
        quarantine[["line", "reason", "raw"]].values.tolist() == [[3, "stray_quote", '0,"坏的开始']]
        and facts["lines_physical"] == 6
    )


def test_quoted_newline_inside_a_field_is_one_row(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text('label,review\n1,"第一行\n第二行"\n0,差\n', encoding="utf-8")
    df, quarantine, _ = read(path)
    assert df["text"].tolist() == ["第一行\n第二行", "差"] and quarantine.empty


def test_wrong_field_count_and_empty_label_are_quarantined_with_lines(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("label,review\n1,好\n0,差,多余\n,空标签\n1\n0,可以\n", encoding="utf-8")
    df, quarantine, facts = read(path)
    assert df["text"].tolist() == ["好", "可以"]
    assert quarantine[["line", "reason"]].values.tolist() == [
        [3, "fields_3_expected_2"],
        [4, "empty_label"],
        [5, "fields_1_expected_2"],
    ]
    assert facts["lines_physical"] == 6


def test_missing_text_is_quarantined_never_the_string_none(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(
        '{"review": null, "label": "1"}\n{"review": "好", "label": "0"}\n{broken\n',
        encoding="utf-8",
    )
    df, quarantine, _ = read(path)
    assert df["text"].tolist() == ["好"]
    assert quarantine["reason"].tolist()[0] == "missing_text" and quarantine["reason"].tolist()[
        1
    ].startswith("invalid_json")


def test_missing_column_lists_columns_found(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("label,content\n1,好\n", encoding="utf-8")
    with pytest.raises(
        DataError, match=r"no text column 'review' \(columns found: content, label\)"
    ):
        read(path)


def test_empty_corpus(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("label,review\n", encoding="utf-8")
    with pytest.raises(DataError, match="no readable rows"):
        read(path)


def test_unknown_suffix_needs_format(tmp_path):
    path = tmp_path / "c.data"
    path.write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match="set source.format"):
        read(path)


def test_checksum(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    good = hashlib.sha256(b"abc").hexdigest()
    assert check_sha256(path, good) == good
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        check_sha256(path, "0" * 64)


def test_source_sha256_must_be_hex():
    with pytest.raises(ValueError, match="64 hex digits"):
        src(sha256="abc")


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


def test_tar_extract_and_links_refused(tmp_path):
    good = tmp_path / "good.tar.gz"
    with tarfile.open(good, "w:gz") as tf:
        data = "label,review\n1,好\n".encode()
        info = tarfile.TarInfo("corpus/data.csv")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    assert extract(good, tmp_path / "x", None).read_text(encoding="utf-8").startswith("label")
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tf:
        link = tarfile.TarInfo("data.csv")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    with pytest.raises(DataError, match="is a link"):
        extract(evil, tmp_path / "y", None)


def test_gz_extract_and_bomb_refused(tmp_path):
    path = tmp_path / "data.csv.gz"
    with gzip.open(path, "wb") as f:
        f.write("label,review\n1,好\n".encode())
    assert extract(path, tmp_path / "x", None).name == "data.csv"
    bomb = tmp_path / "bomb.csv.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(b"0" * (50 << 20))  # 50 MiB of zeros in ~50 KB
    with pytest.raises(DataError, match="decompression bomb"):
        extract(bomb, tmp_path / "z", None)
    with pytest.raises(DataError, match="max_unpacked_bytes"):
        extract(bomb, tmp_path / "z", None, Params(max_unpacked_bytes=1 << 20, max_ratio=10_000))


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves `payloads` in turn (the last one repeats), with ETag, Range and If-Range support;
    fails the first `fail` requests with 503; `redirect` sends every request elsewhere; `drip`
    sleeps between bytes."""

    payloads: list = []
    etag = '"v1"'
    requests: list = []
    fail = 0
    redirect = None
    drip = 0.0
    no_head = False

    def _body(self):
        return _Handler.payloads[0] if len(_Handler.payloads) == 1 else _Handler.payloads.pop(0)

    def do_HEAD(self):
        if _Handler.no_head:
            self.send_error(405)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(_Handler.payloads[0])))
        self.send_header("ETag", _Handler.etag)
        self.end_headers()

    def do_GET(self):
        _Handler.requests.append(
            {"range": self.headers.get("Range"), "if_range": self.headers.get("If-Range")}
        )
        if _Handler.fail:
            _Handler.fail -= 1
            self.send_error(503)
            return
        if _Handler.redirect:
            self.send_response(302)
            self.send_header("Location", _Handler.redirect)
            self.end_headers()
            return
        payload = self._body()
        rng = self.headers.get("Range")
        if rng and self.headers.get("If-Range") == _Handler.etag:
            start = int(rng.split("=")[1].split("-")[0])
            body = payload[start:]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(payload) - 1}/{len(payload)}")
        else:
            body = payload
            self.send_response(200)
        if _Handler.gzip:  # the file sent compressed in transit, as web servers do
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", _Handler.etag)
        self.end_headers()
        if _Handler.drip:
            for i in range(len(body)):
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
                time.sleep(_Handler.drip)
        else:
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    (
        _Handler.payloads,
        _Handler.requests,
        _Handler.fail,
        _Handler.redirect,
        _Handler.drip,
        _Handler.etag,
    ) = (
        [],
        [],
        0,
        None,
        0.0,
        '"v1"',
    )
    _Handler.no_head, _Handler.gzip = False, False
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def test_resume_sends_if_range_and_checks_content_range(tmp_path, server):
    payload = ("label,review\n" + "1,房间很干净\n" * 5000).encode()
    _Handler.payloads = [payload]
    # a killed earlier attempt, its validator recorded
    (tmp_path / "corpus.csv.part").write_bytes(payload[:1000])
    (tmp_path / "corpus.csv.part.meta.json").write_text(json.dumps({"if_range": '"v1"'}))
    path = fetch(f"{server}/corpus.csv", tmp_path, FAST, sha(payload))
    assert path.read_bytes() == payload
    assert _Handler.requests == [{"range": "bytes=1000-", "if_range": '"v1"'}]


def test_resume_against_a_changed_file_starts_again(tmp_path, server):
    payload = b"label,review\n" + "1,新的文件\n".encode() * 300
    _Handler.payloads, _Handler.etag = [payload], '"v2"'
    (tmp_path / "c.csv.part").write_bytes(b"old bytes of another version")
    (tmp_path / "c.csv.part.meta.json").write_text(json.dumps({"if_range": '"v1"'}))
    assert fetch(f"{server}/c.csv", tmp_path, FAST, sha(payload)).read_bytes() == payload


def test_wrong_bytes_are_deleted_and_fetched_again(tmp_path, server):
    right = b"label,review\n1,right\n"
    _Handler.payloads = [b"label,review\n1,WRONG\n", right]
    assert fetch(f"{server}/c.csv", tmp_path, FAST, sha(right)).read_bytes() == right
    assert len(_Handler.requests) == 2


def test_always_wrong_bytes_end_in_one_line_and_nothing_kept(tmp_path, server):
    _Handler.payloads = [b"label,review\n1,WRONG\n"]
    with pytest.raises(ChecksumError, match=r"sha256 mismatch .* the file was deleted, 3 attempts"):
        fetch(f"{server}/c.csv", tmp_path, FAST, "0" * 64)
    assert not any(p.name.startswith("c.csv") for p in tmp_path.iterdir())


def test_5xx_is_retried(tmp_path, server):
    _Handler.payloads, _Handler.fail = [b"label,review\n1,x\n"], 1
    assert (
        fetch(f"{server}/c.csv", tmp_path, FAST, sha(b"label,review\n1,x\n")).read_bytes()
        == b"label,review\n1,x\n"
    )


def test_https_to_http_redirect_is_refused(tmp_path):
    from tasks.source.fetch import _send

    class Resp:
        status_code, headers = 302, {"location": "http://evil.example/c.csv"}

        class url:  # noqa: N801 - the shape of httpx.URL.join
            @staticmethod
            def join(location):
                return location

        def close(self):
            pass

    class Client:  # the redirect decision, without a TLS server on loopback
        def build_request(self, method, url, headers):
            return None

        def send(self, request, stream):
            return Resp()

    with pytest.raises(DataError, match="refused a redirect from https to http://"):
        _send(Client(), "GET", "https://example.org/c.csv", {}, time.monotonic() + 10)


def test_size_limit_and_deadline(tmp_path, server):
    _Handler.payloads = [b"x" * 5000]
    with pytest.raises(DataError, match="over the size limit"):
        fetch(f"{server}/big.csv", tmp_path, Params(max_bytes=1000, retries=0))
    _Handler.drip = 0.05
    t0 = time.monotonic()
    with pytest.raises(DataError, match="deadline"):
        fetch(f"{server}/slow.csv", tmp_path, Params(deadline_s=1, timeout_s=5, retries=0))
    assert time.monotonic() - t0 < 5


def test_unverified_download_is_keyed_and_rechecked_by_validators(tmp_path, server):
    _Handler.payloads = [b"label,review\n1,v1\n"]
    first = probe(f"{server}/c.csv", FAST)
    assert first == Validators('"v1"', None, len(b"label,review\n1,v1\n"))
    assert (
        fetch(f"{server}/c.csv", tmp_path, FAST, None, first).read_bytes()
        == b"label,review\n1,v1\n"
    )
    _Handler.payloads, _Handler.etag = [b"label,review\n1,version 2\n"], '"v2"'
    second = probe(f"{server}/c.csv", FAST)
    assert second.fingerprint() != first.fingerprint()
    assert (
        fetch(f"{server}/c.csv", tmp_path, FAST, None, second).read_bytes()
        == b"label,review\n1,version 2\n"
    )


def test_unreadable_files_are_one_line_errors(tmp_path):
    bad = tmp_path / "c.parquet"
    bad.write_bytes(b"\x00\x01 not parquet")
    with pytest.raises(DataError, match=r"c.parquet: unreadable parquet"):
        read(bad)


def test_validators_from_a_get_where_head_is_not_allowed(server):
    _Handler.payloads, _Handler.no_head = [b"label,review\n1,v1\n"], True
    assert probe(f"{server}/c.csv", FAST) == Validators('"v1"', None, len(b"label,review\n1,v1\n"))


def _messy_csv(rows: int) -> str:
    """Rows with quoted newlines, stray quotes, wrong field counts and blank lines scattered
    through."""
    out = ["label,review"]
    for i in range(rows):
        kind = i % 11
        if kind == 3:
            out.append(f'{i % 2},"第{i}行\n跨行的评论,带逗号"')
        elif kind == 5:
            out.append(f'{i % 2},"第{i}行没有闭合的引号')
        elif kind == 7:
            out.append(f"{i % 2},第{i}行,多一个字段")
        elif kind == 9:
            out.append("")
        else:
            out.append(f"{i % 2},第{i}行很好")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_streamed_batches_read_exactly_what_one_pass_reads(tmp_path, monkeypatch, fmt):
    import tasks.source.readers as download

    path = tmp_path / f"big.{fmt}"
    if fmt == "csv":
        # a multi-byte encoding across batch ends too
        path.write_text(_messy_csv(300), encoding="gb18030")
    else:
        lines = [
            json.dumps({"review": f"第{i}行", "label": str(i % 3)}, ensure_ascii=False)
            if i % 13
            else "{bad json"
            for i in range(300)
        ]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    whole = read(path)
    assert len(whole[0]) > 200 and len(whole[1]) > 10
    for batch_chars in (1, 40, 333):
        monkeypatch.setattr(download, "BATCH_CHARS", batch_chars)
        assert len(list(download.line_batches(path, "gb18030" if fmt == "csv" else "utf-8"))) > 5
        streamed = read(path)
        pd.testing.assert_frame_equal(streamed[0], whole[0])
        pd.testing.assert_frame_equal(streamed[1], whole[1])
        assert streamed[2] == whole[2]


def test_bad_bytes_after_the_detected_head_name_the_line(tmp_path, monkeypatch):
    import tasks.source.readers as download

    path = tmp_path / "c.csv"
    path.write_bytes(
        b"label,review\n" + "".join(f"1,第{i}行\n" for i in range(100)).encode() + b"0,\xff\xfe\n"
    )
    monkeypatch.setattr(download, "HEAD_BYTES", 64)
    monkeypatch.setattr(download, "BATCH_CHARS", 50)
    with pytest.raises(DataError, match=r"c.csv: cannot decode as utf-8 after line \d+"):
        read(path)


def test_a_gzip_encoded_transfer_is_decoded_counted_by_its_content_length_and_bounded(
    tmp_path, server
):
    payload = ("label,review\n" + "1,房间很干净\n" * 5000).encode()
    _Handler.payloads, _Handler.gzip = [payload], True
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    # Content-Length is the encoded size
    path = fetch(f"{server}/corpus.csv", tmp_path / "a", FAST, sha(payload))
    assert path.read_bytes() == payload
    # 60 MB that gzip sends as about 60 KB
    _Handler.payloads = [b"label,review\n" + b"0" * (60 << 20)]
    with pytest.raises(DataError, match="decompression bomb"):
        fetch(f"{server}/bomb.csv", tmp_path / "b", FAST, None)
    assert (
        not (tmp_path / "b" / "bomb.csv").exists()
        and not (tmp_path / "b" / "bomb.csv.part").exists()
    )


def test_an_origin_asks_the_server_once_so_the_key_and_the_recheck_agree(tmp_path, server):
    from tasks.source.origin import Origin
    from tasks.source.schema import Source

    _Handler.payloads, _Handler.etag = [b"label,review\n1,v1\n"], '"v1"'
    src = Source(path=f"{server}/o.csv", allow_unverified=True)
    origin = Origin(src, tmp_path, FAST)
    keyed = origin.fingerprint()
    assert keyed.startswith("unverified ") and 'etag="v1"' in keyed
    _Handler.etag = '"v2"'  # the file changes on the server after the key was planned
    # the download re-checks the planned answer
    assert origin.expect(src) == Validators('"v1"', None, len(b"label,review\n1,v1\n"))
    # the next run plans with the new one
    assert 'etag="v2"' in Origin(src, tmp_path, FAST).fingerprint()
    assert (
        Origin(Source(path=f"{server}/o.csv", sha256="a" * 64), tmp_path, FAST).fingerprint()
        == "a" * 64
    )


def test_an_origin_reads_a_local_source_once_however_often_it_is_asked(tmp_path, monkeypatch):
    import tasks.source.origin as origin_module
    from tasks.source.origin import Origin
    from tasks.source.schema import Source
    from tasks.util.io import file_sha256

    (tmp_path / "c.csv").write_text("label,review\n1,好\n", encoding="utf-8")
    reads = []
    monkeypatch.setattr(
        origin_module, "file_sha256", lambda path: reads.append(path) or file_sha256(path)
    )
    origin = Origin(Source(path="c.csv"), tmp_path, FAST)
    assert origin.fingerprint() == origin.fingerprint() == file_sha256(tmp_path / "c.csv")
    assert len(reads) == 1  # the key plan and the run's tags share one read of the file
