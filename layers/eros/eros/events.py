"""Memory events (issue 32): what other systems act on when a user's memory changes. The changes write them
(an outbox, in their own transactions: sql/functions/events.sql); each sweep publishes them here, oldest first, and
removes what was published. Exactly once per change in the outbox; at least once to a subscriber (a sweep killed
between publishing and its commit publishes those again: a subscriber tells a repeat by ``id``); in order per user
(``seq`` 1, 2, 3...: a subscriber reorders by it, and a gap is an event it missed). docs/EVENTS.md is the schema.

Where they go (``Settings``): an EventBridge bus (EVENT_BUS_NAME; AWS, the template's EventBus), a JSON-lines file
(EVENTS_LOG; the local stack, which `eros events --follow` reads), or nowhere (neither set: drained and dropped).
And, for an app with a webhook, a delivery to its endpoint, written as the event is drained (eros.webhooks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import apps, clock
from .config import Settings
from .observability import logger, metrics
from .store import events as events_store
from .store import webhooks as webhooks_store

SCHEMA = "eros.memory-event/1"
SOURCE = "eros.memory"  # the EventBridge source; DetailType is the event's type
PUT_EVENTS_MAX = 10  # EventBridge takes at most 10 entries a PutEvents call


def envelope(row: dict) -> dict:
    """An outbox row as subscribers get it (docs/EVENTS.md): ids and metadata; ``content`` only when opted in. The
    user is named as their app knows them (``app``, and ``user_id`` the token's subject: eros.apps)."""
    app, subject = apps.split(row["user_id"])
    event = {"schema": SCHEMA, "id": str(row["id"]), "type": row["type"], "app": app, "user_id": subject,
             "seq": row["seq"], "occurred_at": row["occurred_at"].isoformat(),
             "memory_id": str(row["memory_id"]) if row["memory_id"] else None,
             "session_id": str(row["session_id"]) if row["session_id"] else None, "detail": row["detail"]}
    if row.get("content") is not None:
        event["content"] = row["content"]
    return event


class Publisher(Protocol):
    def publish(self, events: Sequence[dict]) -> int:
        """Publish ``events`` in order; how many of the first were accepted (the rest wait for the next sweep)."""


@dataclass
class EventBridgePublisher:
    bus: str
    client: Any = None  # a boto3 EventBridge client (made on first use)

    def publish(self, events: Sequence[dict]) -> int:
        import boto3

        client = self.client or boto3.client("events")
        accepted = 0
        for start in range(0, len(events), PUT_EVENTS_MAX):
            batch = events[start:start + PUT_EVENTS_MAX]
            answer = client.put_events(Entries=[
                {"Source": SOURCE, "DetailType": e["type"], "Detail": json.dumps(e), "EventBusName": self.bus}
                for e in batch])
            for entry in answer.get("Entries", []):
                if entry.get("ErrorCode"):  # the rest of this batch goes again next sweep (a subscriber dedupes)
                    logger.warning("an event was refused by EventBridge", extra={"error": entry["ErrorCode"]})
                    return accepted
                accepted += 1
        return accepted


@dataclass
class LogPublisher:
    path: str

    def publish(self, events: Sequence[dict]) -> int:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as log:
            log.write("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events))
            log.flush()
            os.fsync(log.fileno())  # on disk before the outbox rows go
        return len(events)


class Dropped:
    def publish(self, events: Sequence[dict]) -> int:
        return len(events)


def publisher(cfg: Settings) -> Publisher:
    if cfg.event_bus_name:
        return EventBridgePublisher(cfg.event_bus_name)
    if cfg.events_log:
        return LogPublisher(cfg.events_log)
    return Dropped()


def publish_pending(cfg: Settings, to: Publisher | None = None) -> int:
    """One sweep's publishing: the oldest EVENTS_PER_TICK events, in order, each removed once published; stops at
    the first that is not (the next sweep goes on from it). Returns how many were published."""
    to = to or publisher(cfg)
    with events_store.draining(cfg.events_per_tick, cfg.events_include_text) as batch:
        if batch is None:
            return 0
        conn, rows = batch
        if not rows:
            return 0
        envelopes = [envelope(r) for r in rows]
        try:
            accepted = to.publish(envelopes)
        except Exception:  # noqa: BLE001 - a publisher's failure waits for the next sweep; the events stay
            logger.exception("publishing memory events failed: they stay for the next sweep")
            accepted = 0
        done = rows[:accepted]
        # The deliveries to the apps' webhooks (eros.webhooks), in this transaction: each event's once.
        sent = zip(done, envelopes[:accepted], strict=True)
        webhooks_store.enqueue(conn, [{"app": r["webhook_app"], "user_id": r["user_id"], "event_id": r["id"],
                                       "seq": r["seq"], "payload": e} for r, e in sent if r["webhook_app"]],
                               clock.now())
        events_store.published(conn, [r["id"] for r in done])
    metrics.add_metric(name="MemoryEventsPublished", unit="Count", value=accepted)
    return accepted
