"""eros.db's connection against a server that closes idle sessions (the starter profile's Aurora, which may
only pause once no connection is open) and one that is slow to answer while it resumes from a pause."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from eros import db


@pytest.fixture
def idle_closing_server(database_url, monkeypatch):
    """Connections that the server closes after 1.5 s idle (idle_session_timeout, as Aurora's parameter group)."""
    db.reset()
    monkeypatch.setattr(db, "database_dsn", lambda cfg: make_conninfo(
        database_url, options="-c idle_session_timeout=1500"))
    monkeypatch.setattr(db, "IDLE_MARGIN_SECS", 0.5)
    yield
    db.reset()


def test_a_connection_the_server_closes_when_idle_is_replaced_before_use(idle_closing_server):
    first = db.connection()
    assert first.execute("SELECT 1 AS one").fetchone() == {"one": 1}
    time.sleep(0.2)
    assert db.connection() is first  # well within the server's timeout: kept
    time.sleep(1.8)  # the server has closed it; the client has not noticed (nothing was sent)
    assert not first.closed and not first.broken
    second = db.connection()
    assert second is not first and first.closed
    assert second.execute("SELECT 1 AS one").fetchone() == {"one": 1}  # the request goes on, no 503


def test_without_a_server_timeout_a_connection_is_kept_however_long_idle(database_url, monkeypatch):
    db.reset()
    monkeypatch.setattr(db, "database_dsn", lambda cfg: database_url)
    monkeypatch.setattr(db, "IDLE_MARGIN_SECS", 1e9)  # would replace it at once if a timeout had been read
    try:
        first = db.connection()
        assert db.connection() is first
    finally:
        db.reset()


def _slow_then_real(monkeypatch, timeouts: int, error: str = "connection to server failed: timeout expired"):
    real = psycopg.connect
    attempts: list[float] = []

    def connect(*args, **kwargs):
        attempts.append(time.monotonic())
        if len(attempts) <= timeouts:
            raise psycopg.OperationalError(error)
        return real(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", connect)
    return attempts


def test_connecting_waits_out_a_resuming_database(database_url, monkeypatch):
    attempts = _slow_then_real(monkeypatch, timeouts=2)
    with db.connect(database_url) as conn:
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
    assert len(attempts) == 3


def test_a_database_that_stays_silent_fails_after_the_wait(database_url, monkeypatch):
    monkeypatch.setattr(db, "CONNECT_WAIT_SECS", 0)  # no time for a second attempt
    attempts = _slow_then_real(monkeypatch, timeouts=5)
    with pytest.raises(psycopg.OperationalError, match="timeout expired"):
        db.connect(database_url)
    assert len(attempts) == 1


def test_a_refused_login_is_not_tried_again(database_url, monkeypatch):
    attempts = _slow_then_real(monkeypatch, timeouts=5, error='password authentication failed for user "x"')
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        db.connect(database_url)
    assert len(attempts) == 1
