"""Alerts through Prefect: zhpipe emits Prefect events (a check failed, a partition held out, the
champion promoted or kept, a run failed), and `zhpipe alerts` sets up Prefect automations that send
them to a notification block made from the project's config (`alerts:` in pipelines.yaml: a webhook,
a Slack webhook, or a block the user made, such as an e-mail one). The server's automation services
deliver them: a scheduled night that goes wrong reaches someone."""

from __future__ import annotations

import logging
from datetime import UTC
from typing import Any

from flows.plan.config import Alerts

log = logging.getLogger("zhpipe")

EVENTS = {
    "zhpipe.check.failed": "a data check failed (warn, or block on an accepted partition)",
    "zhpipe.partition.held": "a blocking check held a partition (or the corpus) out",
    "zhpipe.champion.promoted": "a new version became the champion",
    "zhpipe.champion.kept": "a new version did not beat the champion, which stays",
    "zhpipe.run.failed": "a pipeline run failed",
    "zhpipe.alerts.test": "`zhpipe alerts --test`",
}
BLOCK = "zhpipe-alerts"


def resource(identity: str) -> dict[str, str]:
    return {"prefect.resource.id": f"zhpipe.pipeline.{identity}", "prefect.resource.name": identity}


def emit(event: str, config: Any, payload: dict[str, Any]):
    """A Prefect event about a pipeline (its `message` is the line an alert carries); never fails a
    run. The event sent, or None."""
    from prefect.events import emit_event

    payload = {"pipeline": config.name, **payload}
    payload.setdefault("message", f"{config.identity}: {EVENTS.get(event, event)}")
    try:
        return emit_event(event=event, resource=resource(config.identity), payload=payload)
    except Exception as e:  # noqa: BLE001 - an event is a notice: a run goes on without it
        log.warning("could not emit the Prefect event %s: %s", event, e)
        return None


def flush() -> None:
    """Send the events emitted so far before the process ends."""
    from prefect.events.worker import EventsWorker

    try:
        EventsWorker.drain_all(timeout=10)
    except Exception as e:  # noqa: BLE001
        log.warning("could not send the Prefect events: %s", e)


def _block(alerts: Alerts):
    """The notification block the project's `alerts:` names (made or updated under
    `zhpipe-alerts`)."""
    from prefect.blocks.notifications import (
        CustomWebhookNotificationBlock,
        NotificationBlock,
        SlackWebhook,
    )

    if alerts.block:
        return NotificationBlock.load(alerts.block)
    if alerts.webhook:
        # a slow webhook is waited for (timeout_s): one Prefect gives up on is sent the event again,
        # more than once
        block = CustomWebhookNotificationBlock(
            name="zhpipe",
            url=alerts.webhook,
            method="POST",
            allow_private_urls=alerts.allow_private_urls,
            json_data={"subject": "{{subject}}", "text": "{{body}}"},
            timeout=alerts.timeout_s,
        )
    else:
        block = SlackWebhook(url=alerts.slack, allow_private_urls=alerts.allow_private_urls)
    block.save(BLOCK, overwrite=True)
    return block


def _addresses(url: str) -> list:
    """The IP addresses `url`'s host resolves to (none when it does not resolve here)."""
    import ipaddress
    import socket
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname
    if not host:
        return []
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return []  # unresolvable here: the delivery says so
    return [ipaddress.ip_address(a.split("%")[0]) for a in sorted(found)]


def private_address(url: str) -> str | None:
    """The private, loopback or link-local address `url`'s host resolves to (Prefect refuses to send
    there unless `allow_private_urls`), or None."""
    for ip in _addresses(url):
        if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved:
            return str(ip)
    return None


# cloud metadata services (AWS, GCP, Azure, OpenStack at 169.254.169.254; AWS's IPv6 one;
# Alibaba's): never an alert target, whatever `allow_private_urls` says, as every link-local address
METADATA_HOSTS = {"metadata.google.internal", "metadata", "instance-data"}


def refused_address(url: str) -> str | None:
    """Why `url` is never an alert target: not http(s), a link-local or cloud-metadata address; None
    otherwise."""
    import ipaddress
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"only http(s) URLs are alert targets (given a {parts.scheme or 'schemeless'} URL)"
    if parts.hostname.lower().rstrip(".") in METADATA_HOSTS:
        return f"{parts.hostname} is a cloud metadata service"
    for ip in _addresses(url):
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip
        if mapped.is_link_local or str(mapped) in ("100.100.100.200", "fd00:ec2::254"):
            return f"it resolves to {ip}, a link-local or cloud metadata address"
    return None


def check_target(alerts: Alerts) -> None:
    """A target that can never be right (not http(s), link-local, a cloud metadata service: refused
    even with `allow_private_urls`), and a webhook on a private network, which Prefect refuses at
    delivery time, where nobody sees it: said now, in one line (with the setting that allows a
    private one)."""
    from tasks.errors import ConfigError
    from tasks.util.urls import redact_webhook

    url = alerts.webhook or alerts.slack
    if url and (why := refused_address(url)):
        raise ConfigError(f"alerts: {redact_webhook(url)} is refused: {why}")
    address = private_address(url) if url and not alerts.allow_private_urls else None
    if address:
        raise ConfigError(
            f"alerts: {redact_webhook(url)} resolves to the private address {address}, and Prefect "
            f"refuses to send alerts there; if it is yours (an internal chat relay, a gateway "
            f"on this machine), set "
            "`alerts: {allow_private_urls: true}` in pipelines.yaml"
        )


def check_answer(alerts: Alerts, timeout: float = 10) -> None:
    """`zhpipe alerts --test`, before anything is sent through Prefect: one HEAD request to the
    webhook, redirects not followed. A redirect is one line naming where it points (Prefect's
    webhook does not follow redirects, so each event would fail and be sent again); its target is
    checked against the same rules."""
    import httpx

    from tasks.errors import ConfigError
    from tasks.util.urls import redact_webhook

    url = alerts.webhook or alerts.slack
    if not url:
        return
    try:
        answer = httpx.head(url, follow_redirects=False, timeout=timeout)
    except httpx.HTTPError:
        return  # unreachable from here: the delivery says why
    if answer.is_redirect:
        location = (
            str(answer.next_request.url)
            if answer.next_request
            else answer.headers.get("location", "?")
        )
        why = refused_address(location)
        raise ConfigError(
            f"alerts: {redact_webhook(url)} answers {answer.status_code}, a redirect to "
            f"{redact_webhook(location)}{f' (refused: {why})' if why else ''}; Prefect does not "
            "follow "
            f"redirects: give the address it redirects to"
        )


def setup(alerts: Alerts) -> dict[str, str]:
    """One Prefect automation per event of `alerts.events` (and the test event) that sends it to the
    block; the automations of an earlier setup are replaced. Returns their names and ids."""
    from prefect.automations import Automation, EventTrigger, SendNotification

    check_target(alerts)
    block = _block(alerts)
    names = {}
    for event in [*alerts.events, "zhpipe.alerts.test"]:
        name = f"zhpipe: {event}"
        remove([name])
        trigger = EventTrigger(
            expect={event},
            match={"prefect.resource.id": "zhpipe.pipeline.*"},
            posture="Reactive",
            threshold=1,
            within=0,
        )
        action = SendNotification(
            block_document_id=block._block_document_id,
            subject=f"zhpipe {{{{ event.resource.name }}}}: {event}",
            body="{{ event.payload.message }}",
        )
        names[name] = str(
            Automation(
                name=name, description=EVENTS.get(event, ""), trigger=trigger, actions=[action]
            )
            .create()
            .id
        )
    return names


def delivery(
    automation_id: str, event_id: str, wait_s: float, url: str | None = None
) -> tuple[bool | None, str]:
    """What the server's automation did with one event: (True, "") delivered, (False, reason) failed
    or refused, (None, why) no outcome within `wait_s` seconds. Read from the action events Prefect
    records; a delivery that raised (connection refused, say) leaves no outcome event (Prefect
    retries it, then drops it), so once the action has fired and nothing came of it for a while, the
    webhook's address is tried from here for the reason."""
    import time
    from datetime import datetime, timedelta

    from prefect.client.orchestration import get_client
    from prefect.events.filters import (
        EventFilter,
        EventNameFilter,
        EventOccurredFilter,
        EventResourceFilter,
    )

    from tasks.util.urls import redact_text

    start = time.monotonic()
    deadline = start + wait_s
    since = datetime.now(UTC) - timedelta(minutes=5)
    # the filter's default end is the moment it is made
    until = datetime.now(UTC) + timedelta(seconds=wait_s + 60)
    wanted = EventFilter(
        occurred=EventOccurredFilter(since=since, until=until),
        event=EventNameFilter(prefix=["prefect.automation."]),
        resource=EventResourceFilter(id=[f"prefect.automation.{automation_id}"]),
    )
    fired = None
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            for found in client.read_events(filter=wanted, limit=50).events:
                if not any(r.id == f"prefect.event.{event_id}" for r in found.related):
                    continue
                if found.event.endswith(".executed"):
                    return True, ""
                if found.event.endswith(".failed"):
                    log_lines = found.payload.get("notification_log")
                    detail = (
                        f" ({str(log_lines).strip().splitlines()[-1][:200]})" if log_lines else ""
                    )
                    return False, redact_text(str(found.payload.get("reason") or "failed") + detail)
                fired = fired or time.monotonic()
            if fired and url and time.monotonic() - fired > FIRED_GRACE_S:
                unreachable = _unreachable(url)
                if unreachable:
                    return False, f"the server's attempts failed; from here, {unreachable}"
            time.sleep(0.5)
    if not fired:
        return (
            None,
            f"the automation did not fire within {wait_s:.0f} s (is the Prefect server's "
            f"automation service running?)",
        )
    return (
        None,
        f"no outcome within {wait_s:.0f} s (the webhook answers too slowly, or the server's log "
        "says why)",
    )


FIRED_GRACE_S = 8  # an action that fired and has no outcome after this long is looked into


def _unreachable(url: str) -> str | None:
    """Why `url`'s host and port cannot be reached from here (one line), or None when a connection
    opens."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{parts.scheme or 'a schemeless'} URL is not an alert target"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=5):
            return None
    except OSError as e:
        return f"connecting to {parts.hostname}:{port} failed: {e.strerror or e}"


def remove(names: list[str]) -> None:
    """Delete the Prefect automations of these names (what `setup` made)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for name in names:
            for old in client.read_automations_by_name(name):
                client.delete_automation(old.id)
