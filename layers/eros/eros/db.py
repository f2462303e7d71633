"""One database connection per Lambda container (per thread in the local server).

Opened lazily on first use, reopened when it is found closed or broken. Autocommit, so that
no transaction stays open between statements unless ``transaction()`` asks for one.
``prepare_threshold=None`` turns off server-side prepared statements: RDS Proxy (transaction
pooling) cannot pin them to a backend.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import psycopg
from pgvector.psycopg import register_vector
from psycopg.rows import dict_row

from .config import settings
from .credentials import database_dsn

_local = threading.local()


def connect(dsn: str, *, vector: bool = True) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None, connect_timeout=5, row_factory=dict_row)
    if vector:
        register_vector(conn)
    return conn


def connection() -> psycopg.Connection:
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


@contextmanager
def transaction() -> Iterator[psycopg.Connection]:
    conn = connection()
    with conn.transaction():
        yield conn
