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


def wait_for(got: list, what: str, seconds: float = 60) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [g for g in got if what in g.get("subject", "")]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no {what} reached the webhook in {seconds} s (got {got})")


def test_a_held_partition_reaches_a_webhook_through_a_prefect_automation(prefect_harness, receiver):
    url, got = receiver
    names = alerts.setup(Alerts(webhook=url, allow_private_urls=True))
    assert "zhpipe: zhpipe.partition.held" in names and "zhpipe: zhpipe.alerts.test" in names
    assert alerts.setup(Alerts(webhook=url, allow_private_urls=True)) == names  # set up again: replaced, not doubled
    config = load_pipeline("smoke")
    alerts.emit("zhpipe.partition.held", config, {"message": "smoke: 2026-12-02.csv held out of the corpus (check labels)"})
    alerts.emit("zhpipe.check.failed", config, {"message": "smoke: check length failed"})
    alerts.flush()
    held = wait_for(got, "zhpipe.partition.held")
    assert held == {"subject": "zhpipe smoke: zhpipe.partition.held", "text": "smoke: 2026-12-02.csv held out of the corpus (check labels)"}
    wait_for(got, "zhpipe.check.failed")
    time.sleep(2)
    assert len([g for g in got if "partition.held" in g["subject"]]) == 1  # one automation per event, not two


def test_alerts_config_names_one_target():
    with pytest.raises(ValueError, match="exactly one of webhook, slack, block"):
        Alerts(webhook="http://127.0.0.1/hook", slack="https://hooks.slack.com/x")
    with pytest.raises(ValueError):
        Alerts(webhook="http://127.0.0.1/hook", events=["zhpipe.nothing"])
