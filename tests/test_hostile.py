"""Hostile inputs through the command line: crafted corpora, archives, servers and requests. Each
ends in a one-line error or in rows set aside with their reason, never a traceback, and for every
corpus that is read: rows in = rows kept + rows quarantined. docs/hostile-inputs.md lists every case
with its outcome.

The commands run through `flows.cli.main` in this process (the same code as the `zhpipe` script,
without paying Python's start-up per case); test_credentials_never_leave runs real `zhpipe`
processes."""

from __future__ import annotations

import csv
import gzip
import hashlib
import http.server
import io
import json
import os
import ssl
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.cli import in_process
from tests.helpers.procs import zhpipe_argv

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "tests" / "fixtures" / "smoke.csv"
pytestmark = pytest.mark.e2e


def base_rows() -> list[tuple[str, str]]:
    with open(SMOKE, encoding="utf-8", newline="") as f:
        return [(r["label"], r["review"]) for r in csv.DictReader(f)]


def write_csv(path: Path, rows, encoding="utf-8", header=("label", "review")) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    path.write_bytes(buf.getvalue().encode(encoding))
    return path


# ---- servers -------------------------------------------------------------------------------------


def csv_bytes(rows) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([("label", "review"), *rows])
    return buf.getvalue().encode()


GOOD = csv_bytes(base_rows())


class Handler(http.server.BaseHTTPRequestHandler):
    gets: dict[str, int] = {}
    redirect_to = ""

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(GOOD)))
        self.send_header("ETag", '"good-1"')
        self.end_headers()

    def do_GET(self):
        path = self.path.split("?")[0]
        Handler.gets[path] = Handler.gets.get(path, 0) + 1
        if path == "/private/corpus.csv" and "Authorization" not in self.headers:
            self.send_error(401)
            return
        if path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", Handler.redirect_to)
            self.end_headers()
            return
        body = GOOD
        if path == "/flip.csv" and Handler.gets[path] == 1 or path == "/wrong.csv":
            body = GOOD.replace(b"1,", b"0,", 5)  # wrong bytes (first time only for /flip.csv)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"good-1"')
        self.end_headers()
        if path == "/slow.csv":
            for i in range(0, len(body), 64):
                self.wfile.write(body[i : i + 64])
                self.wfile.flush()
                time.sleep(0.05)
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Quiet(http.server.ThreadingHTTPServer):
    # a client that hangs up (the deadline case) is expected
    def handle_error(self, request, client_address):
        pass


def serve(server) -> str:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


@pytest.fixture(scope="module")
def http_url():
    server = Quiet(("127.0.0.1", 0), Handler)
    port = serve(server)
    yield f"http://127.0.0.1:{port}"
    server.shutdown()


@pytest.fixture(scope="module")
def https_url(tmp_path_factory, http_url):
    """An https server on loopback with a self-signed certificate that the downloader is told to
    trust."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = Quiet(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    port = serve(server)
    Handler.redirect_to = f"{http_url}/corpus.csv"
    yield {"url": f"https://127.0.0.1:{port}", "ca": str(folder / "cert.pem")}
    server.shutdown()


# ---- running the CLI -----------------------------------------------------------------------------


def cli(capsys, *args) -> tuple[int, str, str]:
    """A command through `flows.cli.main` in this process (tests/helpers/cli.py), as (exit status,
    stdout, stderr)."""
    done = in_process(capsys, *args)
    return done.returncode, done.stdout, done.stderr


def one_line_error(result, needle: str) -> str:
    code, out, err = result
    assert code == 2, (out + err)[-3000:]
    assert "Traceback" not in out + err
    last = err.strip().splitlines()[-1]
    assert last.startswith("zhpipe: error: ") and needle in last, last
    return last


def outputs(store: Path, stage: str) -> Path:
    folders = [p for p in (store / stage).iterdir() if not p.name.startswith(".")]
    assert len(folders) == 1, folders
    return folders[0]


def accounting(store: Path) -> dict:
    """Rows read, kept (the three splits) and quarantined (by reason) across download, clean and
    split."""
    download, clean, split = (
        outputs(store, "download"),
        outputs(store, "clean"),
        outputs(store, "split"),
    )
    quarantined = pd.concat(
        [
            pd.read_parquet(f / "quarantine.parquet", columns=["reason"])
            for f in (download, clean, split)
        ]
    )
    rows_in = len(pd.read_parquet(download / "data.parquet", columns=["id"])) + len(
        pd.read_parquet(download / "quarantine.parquet", columns=["line"])
    )
    kept = sum(
        len(pd.read_parquet(split / f"{s}.parquet", columns=["id"]))
        for s in ("train", "validation", "test")
    )
    reasons = quarantined["reason"].str.replace(r":.*", "", regex=True).value_counts().to_dict()
    assert rows_in == kept + len(quarantined), (rows_in, kept, reasons)
    return {"rows_in": rows_in, "kept": kept, "reasons": reasons, "download": download}


def run_corpus(capsys, tmp_path, source, *extra, stop="split"):
    store = tmp_path / "store"
    code, out, err = cli(
        capsys,
        "run",
        "smoke",
        "--source",
        source,
        "--text-column",
        "review",
        "--storage",
        store,
        "--to",
        stop,
        *extra,
    )
    assert code == 0, (out + err)[-3000:]
    assert "Traceback" not in out + err
    return accounting(store)


# ---- corpora that are read, with what they cannot use set aside ----------------------------------


@pytest.mark.parametrize("encoding", ["utf-8-sig", "gb18030", "utf-16"])
def test_encodings_and_byte_order_marks(prefect_harness, capsys, tmp_path, encoding):
    got = run_corpus(capsys, tmp_path, write_csv(tmp_path / "c.csv", base_rows(), encoding))
    assert got["rows_in"] == 300 and got["kept"] == 300


def test_line_separators_inside_texts_do_not_split_rows(prefect_harness, capsys, tmp_path):
    rows = [
        (label, text + ("\u2028第二行\x85第三行\x1c尾" if i % 10 == 0 else ""))
        for i, (label, text) in enumerate(base_rows())
    ]
    got = run_corpus(capsys, tmp_path, write_csv(tmp_path / "c.csv", rows))
    assert got["rows_in"] == 300 and got["kept"] == 300


def test_jsonl_with_raw_u2028_is_valid(prefect_harness, capsys, tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        "".join(
            json.dumps({"label": label, "review": text + "\u2028换行"}, ensure_ascii=False) + "\n"
            for label, text in base_rows()
        ),
        encoding="utf-8",
    )
    got = run_corpus(capsys, tmp_path, path)
    assert got["rows_in"] == 300 and got["kept"] == 300


def test_stray_quote_quarantines_one_line_and_keeps_the_rest(prefect_harness, capsys, tmp_path):
    rows = base_rows()
    lines = (
        write_csv(tmp_path / "ok.csv", rows).read_text(encoding="utf-8").splitlines(keepends=True)
    )
    path = tmp_path / "c.csv"
    path.write_text(
        "".join(lines[:11]) + '1,"引号没有闭合的评论\n' + "".join(lines[11:]), encoding="utf-8"
    )
    got = run_corpus(capsys, tmp_path, path)
    assert got["rows_in"] == 301 and got["kept"] == 300 and got["reasons"] == {"stray_quote": 1}
    assert pd.read_parquet(got["download"] / "quarantine.parquet")["line"].tolist() == [12]


def test_nul_bytes_are_removed_not_fatal(prefect_harness, capsys, tmp_path):
    rows = [(label, text.replace("，", "\x00", 1)) for label, text in base_rows()]
    got = run_corpus(capsys, tmp_path, write_csv(tmp_path / "c.csv", rows))
    assert got["kept"] == 300
    split = outputs(tmp_path / "store", "split")
    assert not pd.read_parquet(split / "train.parquet")["text"].str.contains("\x00").any()


def test_a_one_megabyte_line_is_quarantined_as_too_long(prefect_harness, capsys, tmp_path):
    got = run_corpus(
        capsys, tmp_path, write_csv(tmp_path / "c.csv", [*base_rows(), ("1", "好" * 1_000_000)])
    )
    assert got["rows_in"] == 301 and got["reasons"] == {"too_long": 1}


def test_empty_labels_and_wrong_field_counts_are_quarantined_with_lines(
    prefect_harness, capsys, tmp_path
):
    rows = base_rows()
    path = write_csv(tmp_path / "c.csv", rows)
    path.write_text(
        path.read_text(encoding="utf-8") + ",没有标签\n1,多,一列\n0\n", encoding="utf-8"
    )
    got = run_corpus(capsys, tmp_path, path)
    assert got["rows_in"] == 303 and got["reasons"] == {
        "empty_label": 1,
        "fields_3_expected_2": 1,
        "fields_1_expected_2": 1,
    }
    assert pd.read_parquet(got["download"] / "quarantine.parquet")["line"].tolist() == [
        302,
        303,
        304,
    ]


def test_broken_json_lines_and_null_texts_are_quarantined(prefect_harness, capsys, tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [
        json.dumps({"label": label, "review": text}, ensure_ascii=False)
        for label, text in base_rows()
    ]
    lines[5] = "{not json"
    lines[6] = json.dumps({"label": "1", "review": None})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got = run_corpus(capsys, tmp_path, path)
    assert got["rows_in"] == 300 and got["reasons"] == {"invalid_json": 1, "missing_text": 1}


def test_one_row_classes_are_quarantined_by_split_with_a_warning(prefect_harness, capsys, tmp_path):
    got = run_corpus(
        capsys,
        tmp_path,
        write_csv(
            tmp_path / "c.csv",
            [*base_rows(), ("稀有", "只有一条的类别"), ("罕见", "另一条孤例评论")],
        ),
    )
    assert got["rows_in"] == 302 and got["reasons"] == {"class_under_3_rows": 2}


def test_ten_thousand_classes(prefect_harness, capsys, tmp_path):
    extra = [(f"类{i}", f"第{i}条各自成类的评论") for i in range(10_000)]
    got = run_corpus(capsys, tmp_path, write_csv(tmp_path / "c.csv", [*base_rows(), *extra]))
    assert (
        got["rows_in"] == 10_300
        and got["kept"] == 300
        and got["reasons"] == {"class_under_3_rows": 10_000}
    )


def test_labels_that_are_not_file_names(prefect_harness, capsys, tmp_path):
    rows = [("好/评" if label == "1" else "差:评?*", text) for label, text in base_rows()]
    got = run_corpus(capsys, tmp_path, write_csv(tmp_path / "c.csv", rows), stop="profile")
    assert got["kept"] == 300
    clouds = sorted(p.name for p in outputs(tmp_path / "store", "profile").glob("wordcloud_*.png"))
    assert len(clouds) == 2 and not any("/" in c or ":" in c or "?" in c for c in clouds)


# ---- corpora and sources that are refused in one line --------------------------------------------


def test_empty_file(prefect_harness, capsys, tmp_path):
    (tmp_path / "c.csv").write_text("label,review\n", encoding="utf-8")
    one_line_error(
        cli(
            capsys,
            "run",
            "smoke",
            "--source",
            tmp_path / "c.csv",
            "--text-column",
            "review",
            "--to",
            "download",
        ),
        "no readable rows",
    )


def test_gzip_bomb(prefect_harness, capsys, tmp_path):
    with gzip.open(tmp_path / "bomb.csv.gz", "wb") as f:
        f.write(b"label,review\n" + b"1," + b"0" * (200 << 20))
    one_line_error(
        cli(capsys, "run", "smoke", "--source", tmp_path / "bomb.csv.gz", "--to", "download"),
        "decompression bomb",
    )


def test_zip_slip(prefect_harness, capsys, tmp_path):
    with zipfile.ZipFile(tmp_path / "slip.zip", "w") as zf:
        zf.writestr("../../../evil.csv", "label,review\n1,好\n")
    one_line_error(
        cli(capsys, "run", "smoke", "--source", tmp_path / "slip.zip", "--to", "download"),
        "escapes the extraction folder",
    )


def test_tar_link(prefect_harness, capsys, tmp_path):
    with tarfile.open(tmp_path / "link.tar", "w") as tf:
        link = tarfile.TarInfo("corpus.csv")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    one_line_error(
        cli(capsys, "run", "smoke", "--source", tmp_path / "link.tar", "--to", "download"),
        "is a link",
    )


def test_invalid_pipeline_name(capsys, tmp_path):
    (tmp_path / "pipelines.yaml").write_text(
        "pipelines:\n  'a b/c':\n    source: {path: x.csv}\n", encoding="utf-8"
    )
    one_line_error(
        cli(capsys, "--project", tmp_path, "pipelines"), "pipeline name 'a b/c' is not allowed"
    )


# ---- downloads -----------------------------------------------------------------------------------


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_http_source_needs_a_sha256_or_allow_unverified(
    prefect_harness, capsys, tmp_path, http_url
):
    args = [
        "run",
        "smoke",
        "--source",
        f"{http_url}/corpus.csv",
        "--text-column",
        "review",
        "--storage",
        tmp_path / "store",
    ]
    one_line_error(cli(capsys, *args, "--to", "download"), "needs source.sha256")
    code, out, err = cli(capsys, *args, "--allow-unverified", "--to", "split")
    assert code == 0, err[-2000:]
    assert accounting(tmp_path / "store")["rows_in"] == 300


def test_allow_unverified_reaches_the_run_without_source(
    prefect_harness, capsys, tmp_path, http_url
):
    """The pipeline's own http source (here set with --set): --allow-unverified is part of the
    request the flow parses, not only of the config the command line checked."""
    args = [
        "run",
        "smoke",
        "--set",
        f"source.path={http_url}/corpus.csv",
        "--storage",
        tmp_path / "store",
    ]
    one_line_error(cli(capsys, *args, "--to", "download"), "needs source.sha256")
    code, out, err = cli(capsys, *args, "--allow-unverified", "--to", "download")
    assert code == 0, err[-2000:]


def test_wrong_bytes_then_right_bytes(prefect_harness, capsys, tmp_path, http_url):
    Handler.gets.pop("/flip.csv", None)
    got = run_corpus(
        capsys, tmp_path, f"{http_url}/flip.csv", "--set", f"source.sha256={sha(GOOD)}"
    )
    assert got["rows_in"] == 300 and Handler.gets["/flip.csv"] == 2


def test_always_wrong_bytes(prefect_harness, capsys, tmp_path, http_url):
    one_line_error(
        cli(
            capsys,
            "run",
            "smoke",
            "--source",
            f"{http_url}/wrong.csv",
            "--set",
            f"source.sha256={sha(GOOD)}",
            "--set",
            "download.retries=1",
            "--storage",
            tmp_path / "store",
            "--to",
            "download",
        ),
        "sha256 mismatch",
    )
    # nothing bad kept
    assert not [p for p in (tmp_path / "store" / "_downloads").rglob("*") if p.is_file()]


def test_slow_server_past_the_deadline(prefect_harness, capsys, tmp_path, http_url):
    t0 = time.monotonic()
    one_line_error(
        cli(
            capsys,
            "run",
            "smoke",
            "--source",
            f"{http_url}/slow.csv",
            "--set",
            f"source.sha256={sha(GOOD)}",
            "--set",
            "download.deadline_s=2",
            "--storage",
            tmp_path / "store",
            "--to",
            "download",
        ),
        "deadline",
    )
    assert time.monotonic() - t0 < 30


def test_https_to_http_redirect_is_refused(
    prefect_harness, capsys, tmp_path, https_url, monkeypatch
):
    monkeypatch.setenv("SSL_CERT_FILE", https_url["ca"])
    one_line_error(
        cli(
            capsys,
            "run",
            "smoke",
            "--source",
            f"{https_url['url']}/redirect.csv",
            "--set",
            f"source.sha256={sha(GOOD)}",
            "--storage",
            tmp_path / "store",
            "--to",
            "download",
        ),
        "refused a redirect from https to http://",
    )


def test_a_redirect_into_this_machine_or_a_private_network_is_refused(monkeypatch):
    """A public server may not send the download to loopback, a private network or the cloud
    metadata address. The loopback test server stands for the public one: only the address test is
    told which host is public."""
    from tasks.source import fetch as download
    from tasks.util.urls import is_internal

    assert (
        is_internal("http://127.0.0.1:9/")
        and is_internal("http://10.1.2.3/")
        and is_internal("http://169.254.169.254/latest")
    )
    assert (
        is_internal("http://[::1]/")
        and is_internal("http://localhost/")
        and not is_internal("http://93.184.216.34/")
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RedirectToLoopback)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # treated as public below; it redirects to 127.0.0.1
        public = f"http://localhost:{server.server_port}/start"
        monkeypatch.setattr(download, "is_internal", lambda url: "127.0.0.1" in url)
        with pytest.raises(
            download.DataError,
            match="refused a redirect to an address of this machine or a private network",
        ):
            with download._client(5) as client:
                download._send(client, "GET", public, {}, time.monotonic() + 10)
    finally:
        server.shutdown()


class RedirectToLoopback(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(302)
        self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/secret")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_planted_jieba_cache_in_the_shared_temporary_folder_is_not_read(tmp_path):
    """jieba's default cache is /tmp/jieba.cache; one planted there (a dictionary that makes
    你好世界 one word) must not change how text is cut."""
    import marshal

    with open(tmp_path / "jieba.cache", "wb") as f:
        marshal.dump(({"你好世界": 10**9, "你": 1, "好": 1, "世": 1, "界": 1}, 10**9 + 4), f)
    code = (
        "from tasks.util.segmenter import Segmenter, SegmenterParams; "
        "print(Segmenter(SegmenterParams(backend='jieba', "
        "hmm=False)).rows(['你好世界'])['words'][0])"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "你好 世界"
    private = tmp_path / f"zhpipe-jieba-{os.getuid()}"
    assert private.is_dir() and (private.stat().st_mode & 0o777) == 0o700


def test_a_negative_split_seed_is_one_line(capsys, tmp_path):
    one_line_error(
        cli(capsys, "run", "smoke", "--set", "split.seed=-5", "--storage", tmp_path / "store"),
        "split.seed",
    )


def test_a_stage_the_task_does_not_have_is_one_line(capsys, tmp_path):
    one_line_error(
        cli(capsys, "run", "mt-smoke", "--only", "embed", "--storage", tmp_path / "store"),
        "'embed' is not a stage",
    )


def test_deployment_stages_and_force_that_are_not_stages_are_one_line(prefect_harness):
    from flows.orchestrate.pipeline import pipeline_flow
    from flows.plan.config import load_pipeline
    from tasks.errors import ZhpipeError

    for parameters, needle in (
        ({"stages": ["nope"]}, "stages: 'nope' is not a stage of task classification"),
        ({"force": "train"}, "force: expected a list of stage names"),
        (
            {"stages": ["embed"], "pipeline": "mt-smoke"},
            "'embed' is not a stage of task translation",
        ),
        ({"pipeline": load_pipeline("smoke")}, "pipeline: expected a pipeline name"),
    ):
        with pytest.raises(ZhpipeError, match=needle):
            pipeline_flow(**{"pipeline": "smoke", **parameters})


# ---- prediction ----------------------------------------------------------------------------------


def test_predict_oversized_empty_and_missing_inputs(smoke, capsys, tmp_path):
    code, out, err = cli(
        capsys, "predict", "--pipeline", "smoke", "", "房" * 1_000_000, "房间很干净"
    )
    assert code == 0, err[-2000:]
    assert "Traceback" not in out + err
    assert [s in out for s in ("empty", "truncated", "ok")] == [
        True,
        True,
        True,
    ] and "version" in out
    # without --pipeline: the first pipeline's champion (none is registered in this test store)
    one_line_error(
        cli(capsys, "predict", "你好"), "cannot load model models:/zhpipe-chnsenticorp@champion"
    )
    pd.DataFrame({"content": ["好"] * 3}).to_csv(tmp_path / "in.csv", index=False)
    one_line_error(
        cli(
            capsys,
            "predict",
            "--pipeline",
            "smoke",
            "--input",
            tmp_path / "in.csv",
            "--output",
            tmp_path / "o.csv",
        ),
        "no text column 'review'",  # the pipeline's own (smoke's source.text_column)
    )


def test_predict_input_longer_than_max_rows_is_asked_in_calls_the_model_accepts(smoke):
    """predict.max_rows bounds one call to the model (a served model answers 400 past it); `zhpipe
    predict --input` reads a file of any length and asks in batches of at most that many texts."""
    import mlflow.pyfunc

    from flows.track.predict import predict_frame

    model = mlflow.pyfunc.load_model("models:/zhpipe-smoke@champion")
    model.unwrap_python_model().max_rows = 3
    texts = pd.DataFrame({"text": [f"房间很干净{i}" for i in range(10)]})
    with pytest.raises(Exception, match="at most 3"):
        model.predict(texts["text"].tolist())
    out = predict_frame(model, texts, "text")
    assert len(out) == 10 and set(out["status"]) == {"ok"}


def test_predict_answers_with_the_code_logged_with_the_model(smoke, tmp_path):
    """zhpipe predict and mlflow models serve give one answer per model version: a model whose
    logged code differs from the installed zhpipe answers from a process that runs its logged
    code."""
    import shutil
    import zipfile

    import mlflow

    from flows.track.predict import LoggedCodeModel, load_model, predict_frame
    from flows.track.serving import CODE_ARCHIVE

    # logged by this code: answered in this process
    same = load_model("models:/zhpipe-smoke@champion")
    assert not isinstance(same, LoggedCodeModel)
    folder = Path(
        mlflow.artifacts.download_artifacts(
            "models:/zhpipe-smoke@champion", dst_path=str(tmp_path / "download")
        )
    )
    changed = tmp_path / "changed"
    shutil.copytree(folder, changed)
    archive = changed / "code" / CODE_ARCHIVE  # the logged flows and tasks packages, one file
    with zipfile.ZipFile(archive) as zipped:
        sources = {n: zipped.read(n) for n in zipped.namelist()}
    serving = "tasks/classification/serving.py"  # the kind's inference pipeline
    text = sources[serving].decode("utf-8")
    assert 'out["status"] = statuses' in text
    sources[serving] = text.replace(
        'out["status"] = statuses', 'out["status"] = ["logged code"] * len(statuses)'
    ).encode()
    with zipfile.ZipFile(archive, "w") as zipped:
        for name, data in sources.items():
            zipped.writestr(name, data)
    mark = tmp_path / "loaded-by"  # the model's own code says which process ran it
    entry = changed / "pyfunc_model.py"
    entry.write_text(
        f"import os\nopen({str(mark)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        + entry.read_text(encoding="utf-8"),
        encoding="utf-8",
    )
    model = load_model(str(changed))
    assert isinstance(model, LoggedCodeModel)
    out = predict_frame(model, pd.DataFrame({"text": ["房间很干净", None]}), "text")
    assert out["status"].tolist() == ["logged code", "logged code"] and out["label"].notna().iloc[0]
    # run in the child only, never here
    assert mark.is_file() and str(os.getpid()) not in mark.read_text().split()
    child, errors = model.proc, model.errors
    assert errors.is_file()
    del model
    # the child and its log go with the model: nothing left in /tmp
    assert child.poll() is not None and not errors.exists()


# ---- credentials ---------------------------------------------------------------------------------


class Translator(http.server.BaseHTTPRequestHandler):
    """A stand-in for a LibreTranslate server (which cannot run here): reverses each text, and
    requires the credentials of the URL it is called with."""

    def do_POST(self):
        if "Authorization" not in self.headers:
            self.send_error(401)
            return
        q = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["q"]
        data = json.dumps({"translatedText": [t[::-1] for t in q]}, ensure_ascii=False).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_credentials_never_leave(prefect_harness, tmp_path, http_url, seed_mlflow):
    """Source, storage and translation-service URLs with a password: the run completes, and the
    password is in none of the MLflow store, the stage store, Prefect's database or what the command
    printed."""
    from pyftpdlib.authorizers import DummyAuthorizer
    from pyftpdlib.handlers import FTPHandler
    from pyftpdlib.servers import FTPServer

    secret = "S3cr3tPassw0rd"
    ftp_root = tmp_path / "ftp"
    ftp_root.mkdir()
    auth = DummyAuthorizer()
    auth.add_user("zhpipe", secret, str(ftp_root), perm="elradfmwMT")
    handler = type("Handler", (FTPHandler,), {"authorizer": auth})
    ftp = FTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=ftp.serve_forever, kwargs={"timeout": 0.5}, daemon=True).start()
    translator = Quiet(("127.0.0.1", 0), Translator)
    port = serve(translator)
    home = prefect_harness["home"]  # the session's Prefect server keeps its database there
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_harness["url"],
        "MLFLOW_TRACKING_URI": seed_mlflow(tmp_path / "mlflow.db"),
        "ZHPIPE_CACHE": str(tmp_path / "mirror"),
        "ZHPIPE_DATA": "",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }
    # a store's credentials go in ZHPIPE_STORAGE_OPTIONS (a storage URL with them is refused:
    # test_private.py)
    storage = f"ftp://127.0.0.1:{ftp.address[1]}/store"
    env["ZHPIPE_STORAGE_OPTIONS"] = json.dumps({"username": "zhpipe", "password": secret})
    corpus_port = http_url.rsplit(":", 1)[1]
    source = f"http://reader:{secret}@127.0.0.1:{corpus_port}/private/corpus.csv?token={secret}"
    args = [
        "run",
        "smoke",
        "--source",
        source,
        "--text-column",
        "review",
        "--set",
        f"source.sha256={sha(GOOD)}",
        "--storage",
        storage,
        "--set",
        "augment.method=backtranslation",
        "--set",
        "augment.backtranslation.backend=http",
        "--set",
        f"augment.backtranslation.http.url=http://tr:{secret}@127.0.0.1:{port}",
        "--set",
        "augment.backtranslation.http.requests_per_second=100",
        "--to",
        "augment",
    ]
    try:
        proc = subprocess.run(
            zhpipe_argv(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
    finally:
        ftp.close_all()
        translator.shutdown()
    printed = proc.stdout + proc.stderr
    assert proc.returncode == 0, printed[-3000:]
    assert "rows_added" in printed and (ftp_root / "store" / "augment").is_dir()
    mlflow_files = sorted(tmp_path.glob("mlflow.db*"))  # the database and its write-ahead log
    assert mlflow_files and sorted(home.glob("prefect.db*"))
    places = [*mlflow_files, home, ftp_root, tmp_path / "mirror"]
    leaks = [
        str(p)
        for place in places
        for p in ([place] if place.is_file() else place.rglob("*"))
        if p.is_file() and secret.encode() in p.read_bytes()
    ]
    assert not leaks and secret not in printed, leaks or printed[-2000:]
    # what MLflow shows instead (the source param)
    assert any(b"***@127.0.0.1" in p.read_bytes() for p in mlflow_files)


def test_every_case_is_in_the_docs_table():
    import inspect

    table = (ROOT / "docs" / "hostile-inputs.md").read_text(encoding="utf-8")
    cases = [
        name
        for name, fn in globals().items()
        if name.startswith("test_")
        and inspect.isfunction(fn)
        and name != "test_every_case_is_in_the_docs_table"
    ]
    assert len(cases) >= 20 and [c for c in cases if f"`{c}" not in table] == []
