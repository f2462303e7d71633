"""Everything the engine holds about one user, as one unit: the export (``GET /v1/export``) and erasure
(``DELETE /v1/me``, ``eros forget``).

``export_document`` yields the user's whole record as JSON text, a page of rows at a time: sessions with
their messages, every memory with its history fields, usage per day. Pages are keyset reads (no cursor
held open between them, which RDS Proxy would pin to one connection), so a user with 100,000 messages is
exported in bounded memory.

``erase`` runs in one transaction and locks before it deletes, so that no dreaming work in flight can
write after it. It takes the user's memory lock first, as every writer of the user's memories does
(``consolidation.hold_user``, docs/DESIGN.md "the lock order"): it waits for the one such write in progress,
never deadlocks with one, and the user's writes queued behind it find nothing. Then:

* the user's sessions (``FOR UPDATE``): an extraction's final transaction locks its session row and
  re-checks its claim (``store.dreaming.finish``), so it either committed before the erasure (and its
  rows are deleted below, in later statements that see them) or finds no session and writes nothing;
  a chat turn's message insert needs the session row too and fails on the missing key;
* the user's deep-pass row (``user_deep_pass``, ``FOR UPDATE``): a deep pass applies its plan only
  while it holds that row with its claim token (``store.deep_pass``), so the same holds for it.

Then everything keyed by the user goes: both memory layers with their superseded history, messages,
sessions (and with them any dreaming claim on them), persona instances and the deep-pass row; then,
right after, the usage rows. Erasing a user with nothing stored erases nothing and succeeds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from .. import apps
from ..db import connection, one, retried, transaction
from ..memory import event_time_text
from . import consolidation
from .memories import FIELDS as MEMORY_FIELDS
from .memories import FROM as MEMORY_FROM

PAGE = 1000  # rows per read

_SESSIONS = ("SELECT s.id, i.persona_id, s.created_at, s.last_active_at, s.extracted_at, s.extraction_watermark"
             " FROM engine.chat_sessions s JOIN engine.persona_instances i ON i.id = s.instance_id"
             " WHERE s.user_id = %(user)s AND (s.created_at, s.id) > (%(at)s, %(id)s::uuid)"
             " ORDER BY s.created_at, s.id LIMIT %(page)s")
_MESSAGES = ("SELECT id, role, content, client_turn_id, sent_at FROM engine.chat_messages"
             " WHERE user_id = %(user)s AND session_id = %(session)s AND id > %(after)s ORDER BY id LIMIT %(page)s")
_MEMORIES = ("SELECT" + MEMORY_FIELDS + MEMORY_FROM +
             " WHERE m.user_id = %(user)s AND (m.created_at, m.id) > (%(at)s, %(id)s::uuid)"
             " ORDER BY m.created_at, m.id LIMIT %(page)s")
_PERSONAS = ("SELECT p.id, p.version, p.created_at, p.retired_at,"
             " (SELECT jsonb_agg(v ORDER BY v.version) FROM ("
             "   SELECT version, name, description, system_prompt, created_at"
             "   FROM engine.persona_versions WHERE persona_id = p.id) v) AS versions"
             " FROM engine.personas p WHERE p.owner_id = %s ORDER BY p.created_at, p.id")
_USAGE = ("SELECT day, tokens, chat_tokens, dream_tokens, turns FROM engine.user_usage WHERE user_id = %s"
          " ORDER BY day")
_USAGE_BY_MODEL = ("SELECT day, purpose, model, calls, input_tokens, output_tokens FROM engine.user_model_usage"
                   " WHERE user_id = %s ORDER BY day, purpose, model")
_START = (datetime(1, 1, 1, tzinfo=UTC), "00000000-0000-0000-0000-000000000000")

# Children before parents; each statement sees what was committed before it started (READ COMMITTED),
# so memories a finishing extraction committed while the locks were awaited are in the first DELETE.
_ERASE = (
    ("memories", "DELETE FROM engine.companion_memories WHERE user_id = %(user)s"),
    ("messages", "DELETE FROM engine.chat_messages WHERE user_id = %(user)s"),
    ("sessions", "DELETE FROM engine.chat_sessions WHERE user_id = %(user)s"),
    ("persona_instances", "DELETE FROM engine.persona_instances WHERE user_id = %(user)s"),
    # The characters the user made, with their versions, after the instances that used them, through a function
    # (the app role may not write the personas' tables: sql/functions/personas.sql); one row per character erased,
    # so that its rowcount counts them as the DELETEs' do.
    ("personas", "SELECT 1 FROM generate_series(1, engine.erase_user_personas(%(user)s))"),
    ("deep_pass", "DELETE FROM engine.user_deep_pass WHERE user_id = %(user)s"),
    ("reembedding", "DELETE FROM engine.user_reembedding WHERE user_id = %(user)s"),
    # The user's events not published yet go too (the changes they told of are gone), and one event says the user
    # was erased: its row, which names the user, is the one left until the next sweep publishes it (the deletions
    # above wrote no event of their own: engine.erasing). Then the user's event counter.
    ("events", "DELETE FROM engine.memory_events WHERE user_id = %(user)s AND type <> 'user.erased'"),
    ("erased_event", "SELECT engine.record_event(%(user)s, 'user.erased', NULL, NULL, '{}')"),
    ("event_sequence", "DELETE FROM engine.user_event_sequence WHERE user_id = %(user)s"),
    # The deliveries of the user's events to their app's webhook (migration 0037), made or not: their payloads are
    # the user's data (a memory's text, when the app opted in). The user.erased event's own is written when it is
    # published.
    ("webhook_deliveries", "DELETE FROM engine.webhook_deliveries WHERE user_id = %(user)s"),
)
# Usage goes in a statement of its own, after the transaction: a chat turn locks its user's usage rows and
# then the session (store.chat.open_turn, record_turn), so an erasure holding the sessions must not wait
# for them. The day rows go before the itemised ones, in the order a turn locks them (store.usage). Nothing
# can add to them afterwards: dreaming counts only while its session or deep-pass row exists (store.usage),
# and a turn's session is gone (its last statement fails on the missing session, usage and all).
_ERASE_USAGE = ("WITH days AS (DELETE FROM engine.user_usage WHERE user_id = %(user)s RETURNING 1),"
                " itemised AS (DELETE FROM engine.user_model_usage WHERE user_id = %(user)s"
                " AND (SELECT count(*) FROM days) >= 0 RETURNING 1)"
                " SELECT (SELECT count(*) FROM days) AS days, (SELECT count(*) FROM itemised) AS itemised")


def to_json(value: Any) -> str:
    """A value as the export writes it: compact, UTF-8 as is, times and ids as text."""
    return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))



def _pages(statement: str, values: dict) -> Iterator[dict]:
    """Every row of a keyset-paged statement over (created_at, id), a page per read."""
    at, last = _START
    while True:
        rows = connection().execute(statement, values | {"at": at, "id": last, "page": PAGE}).fetchall()
        yield from rows
        if len(rows) < PAGE:
            return
        at, last = rows[-1]["created_at"], rows[-1]["id"]


def _exported(memory: dict) -> dict:
    """A memory as the export holds it: its event time in the API's text form ("2026-W47", not its first day)."""
    return memory | {"occurred_at": event_time_text(memory["occurred_at"], memory["occurred_precision"])}


def _messages(user_id: str, session_id: Any) -> Iterator[dict]:
    after = 0
    while True:
        rows = connection().execute(_MESSAGES, {"user": user_id, "session": session_id, "after": after,
                                                "page": PAGE}).fetchall()
        yield from rows
        if len(rows) < PAGE:
            return
        after = rows[-1]["id"]


def _array(items: Iterator[str]) -> Iterator[str]:
    yield "["
    for n, item in enumerate(items):
        yield ("," if n else "") + item
    yield "]"


def _session(user_id: str, session: dict) -> Iterator[str]:
    yield to_json(session)[:-1] + ',"messages":'
    yield from _array(to_json(m) for m in _messages(user_id, session["id"]))
    yield "}"


def export_document(user_id: str, now: datetime) -> Iterator[str]:
    """The user's whole record as one JSON object, in pieces: ``app`` and ``user_id`` (the user as their app knows
    them: eros.apps), ``exported_at``, ``sessions``
    (oldest first, each with its ``messages``), ``memories`` (both layers, history included, oldest first,
    never an embedding), ``personas`` (the characters the user made, every version), ``usage`` (per UTC day)
    and ``usage_by_model`` (per day, purpose and model)."""
    app, subject = apps.split(user_id)
    yield ('{"app":' + to_json(app) + ',"user_id":' + to_json(subject) + ',"exported_at":'
           + to_json(now.isoformat()) + ',"sessions":')
    yield "["
    for n, session in enumerate(_pages(_SESSIONS, {"user": user_id})):
        yield "," if n else ""
        yield from _session(user_id, session)
    yield '],"memories":'
    yield from _array(to_json(_exported(m)) for m in _pages(_MEMORIES, {"user": user_id}))
    yield ',"personas":'
    yield from _array(to_json(p) for p in connection().execute(_PERSONAS, (user_id,)).fetchall())
    yield ',"usage":'
    yield from _array(to_json(u) for u in connection().execute(_USAGE, (user_id,)).fetchall())
    yield ',"usage_by_model":'
    yield from _array(to_json(u) for u in connection().execute(_USAGE_BY_MODEL, (user_id,)).fetchall())
    yield "}"


# What ``erase`` would delete, counted by the same keys (its kinds, in its order).
_STORED = ("SELECT (SELECT count(*) FROM engine.companion_memories WHERE user_id = %(user)s) AS memories,"
           " (SELECT count(*) FROM engine.chat_messages WHERE user_id = %(user)s) AS messages,"
           " (SELECT count(*) FROM engine.chat_sessions WHERE user_id = %(user)s) AS sessions,"
           " (SELECT count(*) FROM engine.persona_instances WHERE user_id = %(user)s) AS persona_instances,"
           " (SELECT count(*) FROM engine.personas WHERE owner_id = %(user)s) AS personas,"
           " (SELECT count(*) FROM engine.user_deep_pass WHERE user_id = %(user)s) AS deep_pass,"
           " (SELECT count(*) FROM engine.user_reembedding WHERE user_id = %(user)s) AS reembedding,"
           " (SELECT count(*) FROM engine.webhook_deliveries WHERE user_id = %(user)s) AS webhook_deliveries,"
           " (SELECT count(*) FROM engine.user_usage WHERE user_id = %(user)s) AS usage_days,"
           " (SELECT count(*) FROM engine.user_model_usage WHERE user_id = %(user)s) AS usage_by_model")


def stored(user_id: str) -> dict[str, int]:
    """How many rows of each kind ``erase`` would delete now (``eros forget`` shows them before it asks)."""
    return one(connection().execute(_STORED, {"user": user_id}))


def erase(user_id: str) -> dict[str, int]:
    """Delete every row of ``user_id``; returns how many of each kind went (all 0 the second time)."""
    erased = _erase_rows(user_id)
    usage = _erase_usage(user_id)
    return erased | {"usage_days": usage["days"], "usage_by_model": usage["itemised"]}


@retried
def _erase_rows(user_id: str) -> dict[str, int]:
    # The user's memory lock first, as every writer of the user's memories takes it (consolidation.hold_user):
    # erasure waits for the one such write in progress, and those that come after it find nothing.
    with transaction() as conn:
        consolidation.hold_user(conn, user_id)
        conn.execute("SELECT id FROM engine.chat_sessions WHERE user_id = %s ORDER BY id FOR UPDATE", (user_id,))
        conn.execute("SELECT user_id FROM engine.user_deep_pass WHERE user_id = %s FOR UPDATE", (user_id,))
        conn.execute("SELECT set_config('eros.erasing', 'on', true)")  # its deletions: one user.erased event
        erased = {kind: conn.execute(statement, {"user": user_id}).rowcount for kind, statement in _ERASE}
        for bookkeeping in ("erased_event", "event_sequence"):
            del erased[bookkeeping]
        return erased


@retried
def _erase_usage(user_id: str) -> dict[str, int]:
    return one(connection().execute(_ERASE_USAGE, {"user": user_id}))


# --- an app's deletion (eros.account.erase_app) ------------------------------------------------------------------
# Which rows are an app's is read from the catalog, not from a list kept here: every table of the engine schema
# (a partitioned one as a whole) with a column that names a user (user_id, owner_id: the user key names the app,
# engine.app_of reads it) or the app (app_id). A table a later migration adds is covered as it is created.
_APP_COLUMNS = ("SELECT c.relname AS table_name, array_agg(a.attname::text ORDER BY a.attname) AS columns"
                " FROM pg_catalog.pg_class c"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'engine'"
                " JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
                " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
                " AND a.attname IN ('user_id', 'owner_id', 'app_id')"
                " GROUP BY c.relname ORDER BY c.relname")
_USER_COLUMNS = ("user_id", "owner_id")


def _app_columns() -> dict[str, list[str]]:
    """Each table of the engine schema that holds an app's rows, with the columns that say whose a row is."""
    return {r["table_name"]: r["columns"] for r in connection().execute(_APP_COLUMNS).fetchall()}


def _the_apps(column: str) -> sql.Composable:
    """The condition that a row's ``column`` names the app (%(app)s): the app itself, or one of its users."""
    if column in _USER_COLUMNS:
        return sql.SQL("engine.app_of({column}::text) = %(app)s AND {column} IS NOT NULL").format(
            column=sql.Identifier(column))  # app_of(NULL) is the first app's (a bare subject): no owner is no one
    return sql.SQL("{}::text = %(app)s").format(sql.Identifier(column))


def app_users(app: str) -> list[str]:
    """Every user key of ``app`` that any table holds (a user with only a character, or only an event left, too).
    Cross-user by design (an app's deletion): on a sharded database, every shard."""
    selects = [sql.SQL("SELECT {column} AS user_id FROM engine.{table}"
                       " WHERE engine.app_of({column}) = %(app)s AND {column} IS NOT NULL").format(
        column=sql.Identifier(column), table=sql.Identifier(table))
        for table, columns in _app_columns().items() for column in columns if column in _USER_COLUMNS]
    if not selects:
        return []
    statement = sql.SQL("SELECT DISTINCT user_id FROM ({}) AS u ORDER BY user_id").format(
        sql.SQL(" UNION ALL ").join(selects))
    return [r["user_id"] for r in connection().execute(statement, {"app": app}).fetchall()]


def scan(app: str) -> dict[str, int]:
    """How many rows of each table of the engine schema are the app's (its users', its personas, its keys), and
    whether the app's own row is still there (``apps``): what an app's deletion leaves must be all zeros."""
    counts: list[sql.Composable] = [sql.SQL("(SELECT count(*) FROM engine.{table} WHERE {of_app}) AS {name}").format(
        table=sql.Identifier(table), name=sql.Identifier(table),
        of_app=sql.SQL(" OR ").join(_the_apps(column) for column in columns))
        for table, columns in _app_columns().items()]
    counts.append(sql.SQL("(SELECT count(*) FROM engine.apps WHERE id = %(app)s) AS apps"))
    return dict(one(connection().execute(sql.SQL("SELECT {}").format(sql.SQL(", ").join(counts)), {"app": app})))


def begin_app_deletion(app: str) -> bool:
    """Mark the app as being deleted (kept if it already was: an interrupted deletion is taken up again); from the
    commit on, no token or key of the app is accepted (eros.store.apps.find, identify). False: no such app."""
    return connection().execute("UPDATE engine.apps SET deleted_at = coalesce(deleted_at, now()) WHERE id = %(app)s"
                                " RETURNING id", {"app": app}).fetchone() is not None


# What is left of an app once each of its users is erased, in one transaction, children before parents: the
# user.erased event each erasure wrote (the app that would read it is going) and any event counter, the app's
# webhook with its deliveries (migration 0037),
# personas with their versions (the migrating user's: the app role may not delete persona rows), its keys, its row.
_ERASE_APP = (
    ("events", "DELETE FROM engine.memory_events WHERE engine.app_of(user_id) = %(app)s"),
    ("webhook_deliveries", "DELETE FROM engine.webhook_deliveries WHERE app_id = %(app)s"),
    ("webhook", "DELETE FROM engine.app_webhooks WHERE app_id = %(app)s"),
    ("event_sequences", "DELETE FROM engine.user_event_sequence WHERE engine.app_of(user_id) = %(app)s"),
    ("persona_versions", "DELETE FROM engine.persona_versions WHERE persona_id IN"
                         " (SELECT id FROM engine.personas WHERE app_id = %(app)s)"),
    ("personas", "DELETE FROM engine.personas WHERE app_id = %(app)s"),
    ("keys", "DELETE FROM engine.app_keys WHERE app_id = %(app)s"),
    ("app", "DELETE FROM engine.apps WHERE id = %(app)s AND deleted_at IS NOT NULL"),
)


@retried
def erase_app_rows(app: str) -> dict[str, int]:
    """Delete what is left of an app being deleted once its users are erased; how many rows of each kind went."""
    with transaction() as conn:
        return {kind: conn.execute(statement, {"app": app}).rowcount for kind, statement in _ERASE_APP}
