"""What the alarms and the dashboard read, emitted by the code with the right values: the dreaming backlog's
age (every sweep), a turn's recalled rows and every provider call's tokens (the spend alarm)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from apiclient import Api
from helpers import emitted_metrics, instance

from eros.store import dreaming as dreaming_store
from eros_dev.dreaming import sweep_locally


def session(db, user: str, quiet_for: timedelta, **columns) -> None:
    sets = "".join(f", {k} = %({k})s" for k in columns)
    sid = db.execute("INSERT INTO engine.chat_sessions (user_id, instance_id) VALUES (%s, %s) RETURNING id",
                     (user, instance(db, user))).fetchone()["id"]
    db.execute(f"UPDATE engine.chat_sessions SET last_active_at = now() - %(quiet)s{sets} WHERE id = %(id)s",
               {"quiet": quiet_for, "id": sid, **columns})


def test_the_backlog_age_is_how_long_the_oldest_quiet_session_has_waited(db):
    now = datetime.now(UTC)
    idle_before = now - timedelta(minutes=30)
    assert dreaming_store.load(now, idle_before) == (0, 0.0)
    session(db, "alice", timedelta(hours=2))  # quiet for 2 h: due for 1.5 h
    session(db, "bob", timedelta(minutes=5))  # not quiet long enough: not waiting yet
    session(db, "carol", timedelta(days=3), extracted_at=now)  # done
    in_flight, age = dreaming_store.load(now - timedelta(minutes=10), idle_before)
    assert in_flight == 0 and age == pytest.approx(5400, abs=5)


def test_every_sweep_reports_the_backlog_age(db, capsys):
    session(db, "alice", timedelta(hours=2), extraction_next_attempt_at=datetime.now(UTC) + timedelta(hours=1))
    sweep_locally()  # the session waits out a backoff: not claimed, still waiting
    assert emitted_metrics(capsys.readouterr().out)["DreamingBacklogAge"] == pytest.approx(5400, abs=10)


def test_a_turn_reports_its_recalled_rows_and_tokens(providers, db, capsys):
    api = Api()
    db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, source)"
               " SELECT 'alice', 'Plays the cello', embedding, 'fact', 'dreaming' FROM (SELECT array_fill(0.1::real,"
               " ARRAY[512])::vector AS embedding) v")
    sid = api.session()
    capsys.readouterr()
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "my cello lesson"})[0] == 200
    out = capsys.readouterr().out
    spent = db.execute("SELECT sum(input_tokens + output_tokens) AS n FROM engine.user_model_usage").fetchone()["n"]
    metrics = emitted_metrics(out)
    assert metrics["ProviderTokens"] == spent > 0 and metrics["RecallRows"] == 1
