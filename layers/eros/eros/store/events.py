"""The memory events' outbox (migration 0035; the triggers that write it: sql/functions/events.sql): the events
to publish, oldest first, and their removal once published. One drainer at a time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from psycopg import Connection

from ..db import one, transaction

# A second drainer (an overlapping sweep) does not wait: it leaves the events to the one draining, whose order it
# would otherwise break (the lock is the transaction's: released at commit, as RDS Proxy multiplexes).
_ONE_DRAINER = "SELECT pg_try_advisory_xact_lock(hashtextextended('eros.memory-events', 0)) AS drainer"
# Oldest first: per user that is ``seq`` order (a user's changes commit in the order they number their events).
# The text, only when the deployment or the user's app opts in (its settings' events_include_text, eros.apps), as
# the memory reads now (none when it was deleted since). ``webhook_app``: the user's app, when it has a webhook
# (migration 0037: the drain writes the event's delivery too, eros.webhooks).
_PENDING = """
SELECT e.id, e.user_id, e.seq, e.type, e.memory_id, e.session_id, e.detail, e.occurred_at,
       CASE WHEN coalesce((a.settings ->> 'events_include_text')::boolean, %(text)s) THEN m.content END AS content,
       w.app_id AS webhook_app
FROM engine.memory_events e
LEFT JOIN engine.companion_memories m ON m.id = e.memory_id AND m.user_id = e.user_id
LEFT JOIN engine.apps a ON a.id = engine.app_of(e.user_id)
LEFT JOIN engine.app_webhooks w ON w.app_id = engine.app_of(e.user_id)
ORDER BY e.id
LIMIT %(limit)s
"""


@contextmanager
def draining(limit: int, include_text: bool) -> Iterator[tuple[Connection, list[dict]] | None]:
    """The oldest ``limit`` events, in a transaction that is the only drainer (None: another drains now). Delete
    what was published with ``published`` before the block ends: it commits with the transaction."""
    with transaction() as conn:
        if not one(conn.execute(_ONE_DRAINER))["drainer"]:
            yield None
            return
        yield conn, conn.execute(_PENDING, {"limit": limit, "text": include_text}).fetchall()


def published(conn: Connection, ids: Sequence[int]) -> None:
    conn.execute("DELETE FROM engine.memory_events WHERE id = ANY(%s)", (list(ids),))

