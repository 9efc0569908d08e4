"""Alerts end to end: `zhpipe alerts` makes Prefect automations on a real Prefect server (the session's temporary one,
on loopback) that send zhpipe's events to a webhook; a receiver on loopback gets the message a held partition emits."""
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
    """Names of the automations a test sets up, removed after it: the session's Prefect server serves every test
    process, and an automation left there would send other tests' events to a receiver that is gone."""
    made: list[str] = []
    yield made
    alerts.remove(made)


def wait_for(got: list, text: str, seconds: float = 60) -> dict:
    """The first message the webhook got whose text is `text` (other tests' pipelines emit events too)."""
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
    assert set(alerts.setup(Alerts(webhook=url, allow_private_urls=True))) == set(names)  # set up again: replaced, not doubled
    config = load_pipeline("smoke")
    mark = uuid.uuid4().hex[:8]  # this test's messages, told apart from what other tests' runs emit meanwhile
    held_text, failed_text = f"smoke: 2026-12-02.csv held out of the corpus (check labels) {mark}", f"smoke: check length failed {mark}"
    alerts.emit("zhpipe.partition.held", config, {"message": held_text})
    alerts.emit("zhpipe.check.failed", config, {"message": failed_text})
    alerts.flush()
    assert wait_for(got, held_text) == {"subject": "zhpipe smoke: zhpipe.partition.held", "text": held_text}
    assert wait_for(got, failed_text)["subject"] == "zhpipe smoke: zhpipe.check.failed"
    time.sleep(2)
    assert len([g for g in got if g["text"] == held_text]) == 1  # one automation per event, not two


def test_alerts_config_names_one_target():
    with pytest.raises(ValueError, match="exactly one of webhook, slack, block"):
        Alerts(webhook="http://127.0.0.1/hook", slack="https://hooks.slack.com/x")
    with pytest.raises(ValueError):
        Alerts(webhook="http://127.0.0.1/hook", events=["zhpipe.nothing"])
