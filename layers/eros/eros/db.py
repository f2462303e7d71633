"""One database connection per Lambda container (per thread in the local server).

Opened lazily on first use, reopened when it is found closed or broken. Autocommit, so that
no transaction stays open between statements unless ``transaction()`` asks for one.
``prepare_threshold=None`` turns off server-side prepared statements: RDS Proxy multiplexes
connections between transactions, and a session that prepares a statement gets pinned to one backend
connection for its lifetime, which defeats the pooling. The statements a chat turn runs keep their plans
another way: they are PL/pgSQL functions (migrations 0015, 0016), whose plans the backend caches unseen by
the proxy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from pgvector.psycopg.vector import register_vector_info
from psycopg.rows import dict_row
from psycopg.types import TypeInfo

from .config import settings
from .credentials import database_dsn

_local = threading.local()
# Rows come back as dicts (dict_row); their shapes are the TypedDicts of eros.store.rows.
Connection = psycopg.Connection[Any]


def connect(dsn: str, *, vector: bool = True) -> Connection:
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None, connect_timeout=5, row_factory=dict_row)
    if vector:
        _register_vector(conn)
    return conn


def _register_vector(conn: Connection) -> None:
    """Teach the connection pgvector's ``vector`` type in one round trip. pgvector's ``register_vector`` looks
    up four types (vector, bit, halfvec, sparsevec), each in a transaction of its own: twelve round trips on
    every new connection (a cold container's first request, a reconnect through RDS Proxy) for three types
    the engine never uses."""
    row = conn.execute("SELECT oid, typarray FROM pg_type WHERE oid = to_regtype('vector')").fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the vector type is not in this database: CREATE EXTENSION vector")
    register_vector_info(conn, TypeInfo("vector", row["oid"], row["typarray"]))


def connection() -> Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = connect(database_dsn(settings()))
        _local.conn = conn
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


@contextmanager
def transaction() -> Iterator[Connection]:
    conn = connection()
    with conn.transaction():
        yield conn
