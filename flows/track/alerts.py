"""Alerts through Prefect: zhpipe emits Prefect events (a check failed, a partition held out, the champion promoted or
kept, a run failed), and `zhpipe alerts` sets up Prefect automations that send them to a notification block made
from the project's config (`alerts:` in pipelines.yaml: a webhook, a Slack webhook, or a block the user made, such as
an e-mail one). The server's automation services deliver them: a scheduled night that goes wrong reaches someone."""
from __future__ import annotations

import logging
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


def emit(event: str, config: Any, payload: dict[str, Any]) -> None:
    """A Prefect event about a pipeline (its `message` is the line an alert carries); never fails a run."""
    from prefect.events import emit_event

    payload = {"pipeline": config.name, **payload}
    payload.setdefault("message", f"{config.identity}: {EVENTS.get(event, event)}")
    try:
        emit_event(event=event, resource=resource(config.identity), payload=payload)
    except Exception as e:  # noqa: BLE001 - an event is a notice: a run goes on without it
        log.warning("could not emit the Prefect event %s: %s", event, e)


def flush() -> None:
    """Send the events emitted so far before the process ends."""
    from prefect.events.worker import EventsWorker

    try:
        EventsWorker.drain_all(timeout=10)
    except Exception as e:  # noqa: BLE001
        log.warning("could not send the Prefect events: %s", e)


def _block(alerts: Alerts):
    """The notification block the project's `alerts:` names (made or updated under `zhpipe-alerts`)."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock, NotificationBlock, SlackWebhook

    if alerts.block:
        return NotificationBlock.load(alerts.block)
    if alerts.webhook:
        block = CustomWebhookNotificationBlock(name="zhpipe", url=alerts.webhook, method="POST", allow_private_urls=alerts.allow_private_urls,
                                               json_data={"subject": "{{subject}}", "text": "{{body}}"})
    else:
        block = SlackWebhook(url=alerts.slack, allow_private_urls=alerts.allow_private_urls)
    block.save(BLOCK, overwrite=True)
    return block


def setup(alerts: Alerts) -> list[str]:
    """One Prefect automation per event of `alerts.events` (and the test event) that sends it to the block; the
    automations of an earlier setup are replaced. Returns their names."""
    from prefect.automations import Automation, EventTrigger, SendNotification

    block = _block(alerts)
    names = []
    for event in [*alerts.events, "zhpipe.alerts.test"]:
        name = f"zhpipe: {event}"
        remove([name])
        trigger = EventTrigger(expect={event}, match={"prefect.resource.id": "zhpipe.pipeline.*"}, posture="Reactive", threshold=1, within=0)
        action = SendNotification(block_document_id=block._block_document_id, subject=f"zhpipe {{{{ event.resource.name }}}}: {event}",
                                  body="{{ event.payload.message }}")
        Automation(name=name, description=EVENTS.get(event, ""), trigger=trigger, actions=[action]).create()
        names.append(name)
    return names


def remove(names: list[str]) -> None:
    """Delete the Prefect automations of these names (what `setup` made)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for name in names:
            for old in client.read_automations_by_name(name):
                client.delete_automation(old.id)
