"""An app's webhook and its deliveries (migration 0037; eros.webhooks): the endpoint its operator sets, the deliveries
the events' drain writes (``enqueue``, in the drain's transaction), and the sweep's claims and outcomes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from psycopg import Connection
from psycopg.types.json import Jsonb

from ..db import connection, one, transaction

# Made, or its url changed; its secret replaced when ``rotate`` (or when it is new: the secret given is then kept).
# ``made``: the row is new (xmax 0: no earlier version of it was updated).
_SET = """
INSERT INTO engine.app_webhooks AS w (app_id, url, secret) VALUES (%(app)s, %(url)s, %(secret)s)
ON CONFLICT (app_id) DO UPDATE SET url = EXCLUDED.url,
    secret = CASE WHEN %(rotate)s THEN EXCLUDED.secret ELSE w.secret END,
    secret_rotated_at = CASE WHEN %(rotate)s THEN now() ELSE w.secret_rotated_at END
RETURNING w.url, w.secret, w.created_at, w.secret_rotated_at, (w.xmax = 0) AS made
"""
_FIND = """
SELECT w.url, w.created_at, w.secret_rotated_at,
       (SELECT count(*) FROM engine.webhook_deliveries d
        WHERE d.app_id = w.app_id AND d.delivered_at IS NULL AND d.dead_at IS NULL) AS pending,
       (SELECT count(*) FROM engine.webhook_deliveries d WHERE d.app_id = w.app_id AND d.dead_at IS NOT NULL) AS dead
FROM engine.app_webhooks w WHERE w.app_id = %(app)s
"""
_DELETE = "DELETE FROM engine.app_webhooks WHERE app_id = %(app)s"
_REDRIVE = ("UPDATE engine.webhook_deliveries SET dead_at = NULL, attempts = 0, next_attempt_at = %(now)s"
            " WHERE app_id = %(app)s AND dead_at IS NOT NULL")
# Only while the app still has its webhook (one deleted since the drain read it writes nothing).
_ENQUEUE = ("INSERT INTO engine.webhook_deliveries (app_id, user_id, event_id, seq, payload, next_attempt_at)"
            " SELECT w.app_id, %(user_id)s, %(event_id)s, %(seq)s, %(payload)s, %(now)s"
            " FROM engine.app_webhooks w WHERE w.app_id = %(app)s"
            " ON CONFLICT (app_id, event_id) DO NOTHING")
# The due deliveries of every app, oldest first; each taken is held by pushing ``next_attempt_at`` to the lease's
# end in the same statement (its value is the claim's token: ``outcome`` writes only while it holds), so a
# concurrent sweep skips them while this one's locks are held and leaves them once they are committed. Not for an
# app being deleted (its deletion removes them).
_CLAIM = """
WITH due AS (
    SELECT d.id FROM engine.webhook_deliveries d
    WHERE d.next_attempt_at <= %(now)s AND d.delivered_at IS NULL AND d.dead_at IS NULL
    ORDER BY d.next_attempt_at, d.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE engine.webhook_deliveries d SET next_attempt_at = %(lease)s
FROM due, engine.app_webhooks w, engine.apps a
WHERE d.id = due.id AND w.app_id = d.app_id AND a.id = w.app_id AND a.deleted_at IS NULL
RETURNING d.id, d.app_id, d.user_id, d.event_id, d.seq, d.payload, d.attempts, d.next_attempt_at AS lease,
          w.url, w.secret
"""
# One attempt's outcome, by the claim that made it (its lease), for the delivery's user.
_OUTCOME = """
UPDATE engine.webhook_deliveries SET attempts = attempts + 1, last_status = %(status)s, last_error = %(error)s,
    delivered_at = CASE WHEN %(ok)s THEN %(now)s END,
    next_attempt_at = CASE WHEN %(ok)s THEN next_attempt_at ELSE %(retry_at)s END,
    dead_at = CASE WHEN NOT %(ok)s AND attempts + 1 >= %(max_attempts)s THEN %(now)s END
WHERE id = %(id)s AND user_id = %(user_id)s AND next_attempt_at = %(lease)s AND delivered_at IS NULL
    AND dead_at IS NULL
RETURNING dead_at IS NOT NULL AS dead
"""
_PRUNE = "DELETE FROM engine.webhook_deliveries WHERE delivered_at < %(before)s"


def set_webhook(app: str, url: str, secret: str, rotate: bool) -> dict:
    """Set the app's endpoint (made with ``secret`` when it has none; its secret replaced by it when ``rotate``)."""
    return one(connection().execute(_SET, {"app": app, "url": url, "secret": secret, "rotate": rotate}))


def find(app: str) -> dict | None:
    """The app's endpoint with its deliveries waiting and dead, never its secret; None: it has none."""
    return connection().execute(_FIND, {"app": app}).fetchone()


def delete(app: str) -> bool:
    """Remove the app's endpoint, and with it (ON DELETE CASCADE) its deliveries, dead ones too. False: it had
    none."""
    return connection().execute(_DELETE, {"app": app}).rowcount > 0


def redrive(app: str, now: datetime) -> int:
    """The app's dead deliveries due again now, with fresh attempts; how many."""
    return connection().execute(_REDRIVE, {"app": app, "now": now}).rowcount


def enqueue(conn: Connection, deliveries: Sequence[dict], now: datetime) -> None:
    """In the events' drain transaction: one delivery per (app, event), each once (``deliveries``: app, user_id,
    event_id, seq, payload)."""
    if deliveries:
        with conn.cursor() as cur:
            cur.executemany(_ENQUEUE, [d | {"payload": Jsonb(d["payload"]), "now": now} for d in deliveries])


def claim(now: datetime, lease: datetime, limit: int) -> list[dict]:
    """Take up to ``limit`` due deliveries until ``lease`` (committed on return), oldest first, with their app's
    endpoint and secret."""
    with transaction() as conn:
        rows = conn.execute(_CLAIM, {"now": now, "lease": lease, "limit": limit}).fetchall()
    return sorted(rows, key=lambda r: (r["event_id"], r["id"]))


def outcome(delivery: dict, *, ok: bool, status: int | None, error: str | None, now: datetime,
            retry_at: datetime, max_attempts: int) -> bool | None:
    """Record one attempt of a claimed ``delivery``; whether it is dead now (None: the claim was lost, a later
    sweep holds it or it is gone: nothing written)."""
    row = connection().execute(_OUTCOME, {"id": delivery["id"], "user_id": delivery["user_id"],
                                          "lease": delivery["lease"], "ok": ok, "status": status, "error": error,
                                          "now": now, "retry_at": retry_at, "max_attempts": max_attempts}).fetchone()
    return None if row is None else row["dead"]


def prune(before: datetime) -> int:
    """Forget the deliveries made before ``before`` (their payloads are the user's data)."""
    return connection().execute(_PRUNE, {"before": before}).rowcount
