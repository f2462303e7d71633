"""One database connection per Lambda container (per thread in the local server).

Opened lazily on first use, reopened when it is found closed or broken. Autocommit, so that
no transaction stays open between statements unless ``transaction()`` asks for one.
``prepare_threshold=None`` turns off server-side prepared statements: RDS Proxy multiplexes
connections between transactions, and a session that prepares a statement gets pinned to one backend
connection for its lifetime, which defeats the pooling. The statements a chat turn runs keep their plans
another way: they are PL/pgSQL functions (migrations 0015, 0016), whose plans the backend caches unseen by
the proxy.

A server that closes idle sessions (``idle_session_timeout``: the starter profile's Aurora, so that a frozen
Lambda container's connection does not keep it from pausing) is told apart on connect: a connection idle for
nearly that long is replaced before use rather than found closed by the request that uses it. And opening a
connection waits out a paused Aurora's resume (~15 s) instead of giving up after one attempt.
"""

from __future__ import annotations

import functools
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from pgvector.psycopg.vector import register_vector_info
from psycopg.rows import dict_row
from psycopg.types import TypeInfo

from .config import settings
from .credentials import database_dsn
from .observability import logger, metrics

_local = threading.local()
# Rows come back as dicts (dict_row); their shapes are the TypedDicts of eros.store.rows.
Connection = psycopg.Connection[Any]
# How many times one transaction is tried when the database aborts it to break a deadlock.
ATTEMPTS = 3
# Each attempt to connect may take this long; attempts that time out go on for up to CONNECT_WAIT_SECS in all:
# a paused Aurora Serverless v2 instance (MinCapacity 0) takes ~15 s to resume, and a request that asked for a
# connection meanwhile should get one, not a 503 (a database that is down costs that long before the 503).
CONNECT_TIMEOUT_SECS = 5
CONNECT_WAIT_SECS = 20
# A connection is replaced when it has been idle this much less than the server's idle_session_timeout.
IDLE_MARGIN_SECS = 10
# The server's idle_session_timeout of each open connection (seconds; 0 = never), read when it was opened.
_idle_limits: weakref.WeakKeyDictionary[Connection, float] = weakref.WeakKeyDictionary()


def connect(dsn: str, *, vector: bool = True) -> Connection:
    deadline = time.monotonic() + CONNECT_WAIT_SECS
    while True:
        try:
            conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None, connect_timeout=CONNECT_TIMEOUT_SECS,
                                   row_factory=dict_row)
            break
        except psycopg.OperationalError as exc:
            if "timeout expired" not in str(exc) or time.monotonic() + CONNECT_TIMEOUT_SECS > deadline:
                raise  # refused, a bad login, or waited long enough
            logger.info("the database did not answer in time (resuming?); connecting again")
    if vector:
        _register_vector(conn)
    return conn


def _register_vector(conn: Connection) -> None:
    """Teach the connection pgvector's ``vector`` type in one round trip. pgvector's ``register_vector`` looks
    up four types (vector, bit, halfvec, sparsevec), each in a transaction of its own: twelve round trips on
    every new connection (a cold container's first request, a reconnect through RDS Proxy) for three types
    the engine never uses. The same round trip reads the server's idle_session_timeout."""
    row = conn.execute("SELECT oid, typarray, extract(epoch FROM coalesce(current_setting('idle_session_timeout',"
                       " true), '0')::interval)::float8 AS idle_secs FROM pg_type WHERE oid = to_regtype('vector')"
                       ).fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the vector type is not in this database: CREATE EXTENSION vector")
    register_vector_info(conn, TypeInfo("vector", row["oid"], row["typarray"]))
    _idle_limits[conn] = row["idle_secs"]


def _outlived_its_session(conn: Connection) -> bool:
    """Whether the server may have closed ``conn`` for being idle (it would fail the statement that found out)."""
    limit = _idle_limits.get(conn, 0.0)
    return limit > 0 and time.monotonic() - getattr(_local, "used_at", 0.0) >= limit - IDLE_MARGIN_SECS


def connection() -> Connection:
    conn = getattr(_local, "conn", None)
    if conn is not None and not conn.closed and _outlived_its_session(conn):
        conn.close()
    if conn is None or conn.closed or conn.broken:
        conn = connect(database_dsn(settings()))
        _local.conn = conn
    _local.used_at = time.monotonic()
    return conn


def reset() -> None:
    """Forget this thread's connection (tests point the process at another database)."""
    conn = getattr(_local, "conn", None)
    if conn is not None and not conn.closed:
        conn.close()
    _local.conn = None


def one(cursor: psycopg.Cursor[Any]) -> Any:
    """The row of a statement that always returns one (an aggregate, an INSERT ... RETURNING)."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError("the statement returned no row")
    return row


# The SQLSTATE of sql/functions/embedding.sql's refusal: a vector of another model than the recorded one. After a
# re-embedding's switch (eros.dreaming.reembedding) a request that embedded with the old model just before meets it:
# nothing of it was written, and a retry embeds with the new model.
EMBEDDING_SWITCHED = "EM001"


def embedding_switched(exc: BaseException) -> bool:
    """Whether ``exc`` is the database refusing a vector of a model it no longer records (a retry will do)."""
    return getattr(exc, "sqlstate", None) == EMBEDDING_SWITCHED


@contextmanager
def transaction() -> Iterator[Connection]:
    conn = connection()
    with conn.transaction():
        yield conn


def retried[**P, R](work: Callable[P, R]) -> Callable[P, R]:
    """``work`` -- a function whose whole effect is one transaction -- tried again, up to ATTEMPTS times in all,
    when the database aborted it to break a deadlock (or a serialization failure): nothing of it was written,
    and the other transaction went on, so the next attempt waits for that one's locks and runs after it. The
    lock order (eros.store.consolidation.hold_user) makes a user's own writes never deadlock; this is the net
    for what it cannot order, so that a request answers after a bounded number of tries (and at most ~60 ms of
    waiting between them) instead of failing with what looks like an outage. Each retry is logged and counted
    (the DatabaseRetries metric)."""

    @functools.wraps(work)
    def attempt(*args: P.args, **kwargs: P.kwargs) -> R:
        for n in range(1, ATTEMPTS + 1):
            try:
                return work(*args, **kwargs)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
                if n == ATTEMPTS or connection().info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    raise  # out of tries, or inside a caller's transaction, which is aborted: the caller decides
                logger.warning("a transaction was aborted by the database; trying it again",
                               extra={"work": work.__qualname__, "attempt": n, "error_type": type(exc).__name__})
                metrics.add_metric(name="DatabaseRetries", unit="Count", value=1)
                # A few milliseconds, more each time, at random: the transaction that went on gets to finish
                # before this one takes its first lock again (an immediate retry can close the same cycle).
                time.sleep(random.uniform(0.005, 0.02) * n)
        raise AssertionError("unreachable")  # pragma: no cover

    return attempt
