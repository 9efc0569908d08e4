"""Alerts end to end: `zhpipe alerts` makes Prefect automations on a real Prefect server (the
session's temporary one, on loopback) that send zhpipe's events to a webhook; a receiver on loopback
gets the message a held partition emits."""

import http.server
import json
import threading
import time

import pytest

from flows.plan.config import Alerts, load_pipeline
from flows.track import alerts

pytestmark = pytest.mark.e2e


@pytest.fixture
def receiver():
    """A webhook on loopback that keeps every JSON body posted to it."""
    got: list[dict] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()


@pytest.fixture
def automations(prefect_harness):
    """Names of the automations a test sets up, removed after it: the session's Prefect server
    serves every test process, and an automation left there would send other tests' events to a
    receiver that is gone."""
    made: list[str] = []
    yield made
    alerts.remove(made)


def wait_for(got: list, text: str, seconds: float = 60) -> dict:
    """The first message the webhook got whose text is `text` (other tests' pipelines emit events
    too)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [g for g in got if g.get("text") == text]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"{text!r} did not reach the webhook in {seconds} s (got {got})")


def test_a_held_partition_reaches_a_webhook_through_a_prefect_automation(receiver, automations):
    import uuid

    url, got = receiver
    names = alerts.setup(Alerts(webhook=url, allow_private_urls=True))
    automations.extend(names)
    assert "zhpipe: zhpipe.partition.held" in names and "zhpipe: zhpipe.alerts.test" in names
    # set up again: replaced, not doubled
    assert set(alerts.setup(Alerts(webhook=url, allow_private_urls=True))) == set(names)
    config = load_pipeline("smoke")
    # this test's messages, told apart from what other tests' runs emit meanwhile
    mark = uuid.uuid4().hex[:8]
    held_text, failed_text = (
        f"smoke: 2026-12-02.csv held out of the corpus (check labels) {mark}",
        f"smoke: check length failed {mark}",
    )
    alerts.emit("zhpipe.partition.held", config, {"message": held_text})
    alerts.emit("zhpipe.check.failed", config, {"message": failed_text})
    alerts.flush()
    assert wait_for(got, held_text) == {
        "subject": "zhpipe smoke: zhpipe.partition.held",
        "text": held_text,
    }
    assert wait_for(got, failed_text)["subject"] == "zhpipe smoke: zhpipe.check.failed"
    time.sleep(2)
    assert len([g for g in got if g["text"] == held_text]) == 1  # one automation per event, not two


def test_alerts_config_names_one_target():
    with pytest.raises(ValueError, match="exactly one of webhook, slack, block"):
        Alerts(webhook="http://127.0.0.1/hook", slack="https://hooks.slack.com/x")
    with pytest.raises(ValueError):
        Alerts(webhook="http://127.0.0.1/hook", events=["zhpipe.nothing"])


def _config(tmp_path, alerts_yaml: str):
    path = tmp_path / "alerts.yaml"
    path.write_text(f"pipelines:\n  smoke: {{source: {{path: x.csv}}}}\nalerts: {alerts_yaml}\n")
    return path


def test_a_private_webhook_is_named_with_the_setting_that_allows_it(tmp_path, capsys):
    """Prefect refuses a URL that resolves to a private address when it delivers, where nobody sees
    it: `zhpipe alerts` says so first, in one line, naming `allow_private_urls`."""
    from tests.helpers.cli import in_process

    done = in_process(
        capsys, "alerts", "--config", _config(tmp_path, "{webhook: 'http://127.0.0.1:9/hook'}")
    )
    assert (
        done.returncode == 2
        and "allow_private_urls: true" in done.stderr
        and "127.0.0.1" in done.stderr
    ), done
    assert len(done.stderr.strip().splitlines()) == 1


def test_alerts_test_reports_a_failed_delivery(tmp_path, capsys, automations):
    """`alerts --test` to a webhook nobody answers: it waits for the server's delivery and fails
    with the reason."""
    import socket

    from tests.helpers.cli import in_process

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    automations.extend(f"zhpipe: {e}" for e in alerts.EVENTS)
    done = in_process(
        capsys,
        "alerts",
        "--test",
        "--config",
        _config(
            tmp_path,
            f"{{webhook: 'http://127.0.0.1:{port}/hook', allow_private_urls: true, timeout_s: 5}}",
        ),
    )
    assert (
        done.returncode == 2
        and "was not delivered" in done.stderr
        and "Connection refused" in done.stderr
    ), done
    assert "delivered:" not in done.stdout


def test_alerts_test_to_a_slow_loopback_webhook_arrives_once(tmp_path, capsys, automations):
    """A webhook that answers after 12 s (Prefect's own limit is 10 s, after which it sent the event
    again, and again): `alerts --test` waits for it, says it was delivered, and the message arrives
    once."""
    import http.server

    from tests.helpers.cli import in_process

    got: list[dict] = []

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            # counted as it comes
            got.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
            time.sleep(11)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    automations.extend(f"zhpipe: {e}" for e in alerts.EVENTS)
    try:
        done = in_process(
            capsys,
            "alerts",
            "--test",
            "--config",
            _config(
                tmp_path,
                f"{{webhook: 'http://127.0.0.1:{server.server_port}/hook', allow_private_urls: "
                f"true}}",
            ),
        )
        assert done.returncode == 0 and "delivered:" in done.stdout, done
        # Prefect sent it again when it gave up, 10 s after the first: by now (11 s on) that would
        # have come
        time.sleep(2)
        tests = [g for g in got if "alerts --test" in g.get("text", "")]
        assert len(tests) == 1, got
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    "target, why",
    [
        ("file:///etc/passwd", "only http(s) URLs"),
        ("http://169.254.169.254/latest/meta-data/", "link-local or cloud metadata"),
        ("http://metadata.google.internal/computeMetadata/v1/", "cloud metadata service"),
    ],
)
def test_a_target_that_is_never_right_is_refused_even_with_private_urls_allowed(
    tmp_path, capsys, target, why
):
    """`file:///etc/passwd` was "target allowed" and `--test` then connected to localhost:80; with
    `allow_private_urls: true` the cloud metadata address was allowed too. Each is one line now,
    nothing sent."""
    from tests.helpers.cli import in_process

    done = in_process(
        capsys,
        "alerts",
        "--test",
        "--config",
        _config(tmp_path, f"{{webhook: '{target}', allow_private_urls: true}}"),
    )
    assert (
        done.returncode == 2 and why in done.stderr and len(done.stderr.strip().splitlines()) == 1
    ), done


def test_a_redirecting_webhook_is_named_once_and_never_sent_to_again(tmp_path, capsys):
    """A webhook that answered 307 was called four times by Prefect and reported "too slow": `alerts
    --test` asks it once, without following, and names the redirect (its target checked against the
    same rules)."""
    from tests.helpers.cli import in_process

    calls = []

    class Redirect(http.server.BaseHTTPRequestHandler):
        def _any(self):
            calls.append(self.command)
            self.send_response(307)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.end_headers()

        do_HEAD = do_POST = do_GET = _any

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = in_process(
            capsys,
            "alerts",
            "--test",
            "--config",
            _config(
                tmp_path,
                f"{{webhook: 'http://127.0.0.1:{server.server_port}/hook', allow_private_urls: "
                f"true}}",
            ),
        )
    finally:
        server.shutdown()
    assert (
        done.returncode == 2
        and "answers 307, a redirect" in done.stderr
        and "refused" in done.stderr
    ), done
    assert len(done.stderr.strip().splitlines()) == 1 and calls == ["HEAD"]
