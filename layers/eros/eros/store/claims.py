"""A dreaming job's claim and lease, written once for every kind of job (a session's extraction, a user's deep
pass, ...). Each kind keeps its jobs in a table of its own (``JobTable``: which table, its key, the prefix of its
lifecycle columns) and its own claim statement; everything after the claim is here.

The claim token is the ``claimed_at`` value the claim set; the lease is the ``started_at`` the one delivery that
starts the work sets (``start``), so a duplicate delivery of the claim stops before any provider call. Every later
write of that job is guarded by both (``lock``: the job's row, row-locked), so a duplicate delivery, a retry after
success, or a worker whose claim went stale and was re-claimed by another, writes nothing. A failure gives the
claim back with a backoff, counted against whoever was at fault (``retry_later``, migration 0005); a job given up
on is stamped with why (``give_up``). Every statement names the job's user (``tests/test_shard_ready.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

from psycopg import sql

from .. import clock
from ..db import Connection, connection, transaction
from .rows import ClaimedJob

_LIFECYCLE = ("claimed_at", "started_at", "attempts", "retries", "retrying_since", "error", "next_attempt_at")


@dataclass(frozen=True)
class JobTable:
    """Where one kind of job keeps its claims. The lifecycle columns are ``prefix`` + claimed_at, started_at,
    attempts, retries, retrying_since, error, next_attempt_at (``extraction_`` on chat_sessions, none on
    user_deep_pass)."""

    table: LiteralString  # engine.<table>: a table of a user's data, keyed by user_id (and ``key``)
    claim: LiteralString  # the kind's claim: ONE statement, FOR UPDATE SKIP LOCKED (docs/DESIGN.md "The claim")
    key: tuple[LiteralString, ...] = ()  # the job's key besides user_id (a session: its id)
    prefix: LiteralString = ""
    pending: LiteralString = "TRUE"  # the row still has work for its claim (a session: not extracted yet)
    reads: tuple[LiteralString, ...] = ()  # what the kind's work reads besides the lifecycle
    given_up: LiteralString = "TRUE"  # the SET clause that stamps a job given up; %(why)s says why

    def names(self) -> dict[str, sql.Composable]:
        """The parts the statements below are made of."""
        columns: list[sql.Composable] = [sql.Identifier(c) for c in ("user_id", *self.key, *self.reads)]
        columns += [sql.SQL("{} AS {}").format(sql.Identifier(self.prefix + c), sql.Identifier(c))
                    for c in ("attempts", "retries", "retrying_since", "error")]
        columns.append(sql.SQL("{} AS lease").format(sql.Identifier(self.prefix + "started_at")))
        return {"table": sql.Identifier(self.table), "pending": sql.SQL(self.pending),
                "given_up": sql.SQL(self.given_up), "columns": sql.SQL(", ").join(columns),
                "key": sql.SQL("").join(sql.SQL(" AND {} = {}").format(sql.Identifier(k), sql.Placeholder(k))
                                        for k in self.key),
                **{c: sql.Identifier(self.prefix + c) for c in _LIFECYCLE}}


def _statement(template: LiteralString, table: JobTable) -> sql.Composed:
    return sql.SQL(template).format(**table.names())


def _key(table: JobTable, job: Mapping[str, Any]) -> dict[str, Any]:
    return {k: job[k] for k in ("user_id", *table.key)}


def user_claim(table: LiteralString, due: LiteralString, order: LiteralString) -> LiteralString:
    """The claim statement of a kind that keeps one job row per user (a deep pass, a re-embedding): the ``due`` rows
    of ``table`` (engine.<name>), oldest by ``order`` first, that are free or claimed so long ago that the worker is
    presumed dead (``%(stale_before)s``) and not backing off from a failure, stamped with the application clock
    (``%(now)s``: the claim token). Taking a claim counts nothing; re-taking a stale one whose worker had started
    (the lease is set) counts the user's own attempt (the worker died on it), one never started is our backlog (a
    retry, the world's fault): migration 0005 says why. The picked users are a MATERIALIZED CTE for the reason
    store.dreaming's claim gives: an ``IN (SELECT ... LIMIT ... SKIP LOCKED)`` can be rescanned by the plan and then
    claims every due user, whatever the limit."""
    return f"""
WITH picked AS MATERIALIZED (
    SELECT user_id FROM {table}
    WHERE {due}
      AND (claimed_at IS NULL OR claimed_at < %(stale_before)s)
      AND (next_attempt_at IS NULL OR next_attempt_at <= %(now)s)
    ORDER BY {order}
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} u
SET claimed_at = %(now)s,
    started_at = NULL,
    attempts = u.attempts + (u.started_at IS NOT NULL)::int,
    retries = u.retries + (u.claimed_at IS NOT NULL AND u.started_at IS NULL)::int,
    error = CASE WHEN u.started_at IS NOT NULL THEN 'the worker did not finish (its claim went stale)'
                 WHEN u.claimed_at IS NOT NULL THEN 'no worker started the claim before it went stale'
                 ELSE u.error END
FROM picked
WHERE u.user_id = picked.user_id
RETURNING u.user_id, u.claimed_at AS claim_token
"""


def claim(table: JobTable, limit: int, now: datetime | None = None, **cutoffs: datetime) -> list[dict]:
    """Claim up to ``limit`` jobs the kind's claim finds due by ``cutoffs``; ``now`` (default: the application's
    clock) stamps the claim: it is the claim token."""
    if limit <= 0:
        return []
    return connection().execute(table.claim, {**cutoffs, "limit": limit, "now": now or clock.now()}).fetchall()


def release(table: JobTable, job: Mapping[str, Any], claim_token: datetime) -> bool:
    """Give a claim back (its invoke failed), nothing counted, so the next sweep takes the job at once."""
    return connection().execute(_statement(
        "UPDATE engine.{table} SET {claimed_at} = NULL WHERE user_id = %(user_id)s{key}"
        " AND {claimed_at} = %(token)s AND {started_at} IS NULL RETURNING user_id", table),
        _key(table, job) | {"token": claim_token}).fetchone() is not None


def start(table: JobTable, job: Mapping[str, Any], claim_token: datetime, now: datetime
          ) -> tuple[str, ClaimedJob | None]:
    """Take the lease of this claim: ("started", job) for the one delivery that gets it; ("duplicate", None)
    when another delivery of the same claim holds it (running, or died: the claim then goes stale and a later
    sweep retakes it); ("not-claimed", None) when the claim no longer holds the job (done, released,
    re-claimed, or no such job)."""
    conn = connection()
    key = _key(table, job)
    row = conn.execute(_statement(
        "UPDATE engine.{table} SET {started_at} = %(now)s WHERE user_id = %(user_id)s{key}"
        " AND {claimed_at} = %(token)s AND {pending} AND {started_at} IS NULL RETURNING {columns}", table),
        key | {"token": claim_token, "now": now}).fetchone()
    if row is not None:
        return "started", row
    return ("duplicate" if held(table, key, claim_token) else "not-claimed"), None


def held(table: JobTable, job: Mapping[str, Any], claim_token: datetime) -> ClaimedJob | None:
    """The job if this claim still holds it (None: done, released, re-claimed)."""
    return connection().execute(_statement(
        "SELECT {columns} FROM engine.{table} WHERE user_id = %(user_id)s{key} AND {claimed_at} = %(token)s"
        " AND {pending}", table), _key(table, job) | {"token": claim_token}).fetchone()


def lock(conn: Connection, table: JobTable, job: Mapping[str, Any], claim_token: datetime) -> dict | None:
    """Row-lock the job if this claim and this delivery's lease still hold it (the guard of every later write):
    the job as it is now, or None."""
    return conn.execute(_statement(
        "SELECT {columns} FROM engine.{table} WHERE user_id = %(user_id)s{key} AND {claimed_at} = %(token)s"
        " AND {started_at} IS NOT DISTINCT FROM %(lease)s AND {pending} FOR UPDATE", table),
        _key(table, job) | {"token": claim_token, "lease": job.get("lease")}).fetchone()


def retry_later(table: JobTable, job: Mapping[str, Any], claim_token: datetime, error: str,
                next_attempt_at: datetime | None, counts: str | None, now: datetime) -> bool:
    """Give the claim back with the error and a backoff, counting the failure as the job's own
    (``counts='attempts'``), the world's (``'retries'``: the retry window starts at the first one) or
    nobody's (None: configuration, or the budget). False if this delivery no longer holds the claim."""
    with transaction() as conn:
        if lock(conn, table, job, claim_token) is None:
            return False
        conn.execute(_statement(
            "UPDATE engine.{table} SET {claimed_at} = NULL, {started_at} = NULL, {error} = %(error)s,"
            " {next_attempt_at} = %(next)s, {attempts} = {attempts} + (%(counts)s = 'attempts')::int,"
            " {retries} = {retries} + (%(counts)s = 'retries')::int,"
            " {retrying_since} = CASE WHEN %(counts)s = 'retries' THEN coalesce({retrying_since}, %(now)s)"
            "     ELSE {retrying_since} END"
            " WHERE user_id = %(user_id)s{key}", table),
            _key(table, job) | {"error": error[:1000], "next": next_attempt_at, "counts": counts or "", "now": now})
    return True


def give_up(table: JobTable, job: Mapping[str, Any], claim_token: datetime, error: str, why: str) -> bool:
    """Stamp the job with the error without doing it; ``why`` is 'attempts' (its own failures reached the
    cap) or 'retry-window' (the world kept failing for the whole window). The retry streak ends here: if the
    job becomes due again, its window starts afresh. False if this delivery no longer holds the claim."""
    with transaction() as conn:
        if lock(conn, table, job, claim_token) is None:
            return False
        conn.execute(_statement(
            "UPDATE engine.{table} SET {given_up}, {claimed_at} = NULL, {started_at} = NULL,"
            " {next_attempt_at} = NULL, {retries} = 0, {retrying_since} = NULL, {error} = %(error)s"
            " WHERE user_id = %(user_id)s{key}", table),
            _key(table, job) | {"error": error[:1000], "why": why})
    return True
