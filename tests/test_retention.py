"""Transcript retention (TRANSCRIPT_RETENTION_DAYS): the sweep deletes messages older than the setting once
their session has been extracted through them; what dreaming has not read stays; memories keep working."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from apiclient import Api

from eros import dreaming
from eros.config import settings
from eros.dreaming import tick


@pytest.fixture
def transcripts(db):
    """alice: an extracted session with two messages 40 days old and one 10 days old; a session extracted
    only through its first message; a session never extracted (both 40 days old). bob: an extracted one, 40
    days old. Inserted oldest first, as messages are stored (sent_at is the time of the insert)."""
    api = Api()
    now = datetime.now(UTC)
    sessions = {name: api.session(user=user) for name, user in
                (("old_done", "alice"), ("partly", "alice"), ("never", "alice"), ("bob", "bob"))}
    plan = [("old_done", 41), ("old_done", 40), ("partly", 40), ("partly", 39), ("never", 39), ("never", 38),
            ("bob", 38), ("old_done", 10)]
    ids: dict[str, list[int]] = {name: [] for name in sessions}
    for n, (name, age) in enumerate(plan):
        ids[name].append(db.execute(
            "INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, sent_at)"
            " SELECT id, user_id, 'user', %s, %s, %s FROM engine.chat_sessions WHERE id = %s RETURNING id",
            (f"said {n}", f"t{n}", now - timedelta(days=age), sessions[name])).fetchone()["id"])
    for name, through, extracted in (("old_done", 2, True), ("partly", 0, False), ("never", None, False),
                                     ("bob", 0, True)):
        db.execute("UPDATE engine.chat_sessions SET extraction_watermark = %s, extracted_at = %s WHERE id = %s",
                   (ids[name][through] if through is not None else None, now if extracted else None, sessions[name]))
    return ids


def sweep() -> int:
    """One sweep (its fan-out recorded, not invoked): the messages it expired."""
    sent: list[dict] = []
    return dreaming.sweep(settings(), sent.append).messages_expired


def left(db) -> set[int]:
    return {r["id"] for r in db.execute("SELECT id FROM engine.chat_messages").fetchall()}


def test_off_by_default_nothing_is_deleted(db, transcripts):
    before = left(db)
    assert sweep() == 0
    assert left(db) == before


def test_extracted_messages_older_than_the_setting_go_and_what_dreaming_has_not_read_stays(db, env, transcripts):
    env(TRANSCRIPT_RETENTION_DAYS=30)
    memory = db.execute(
        "INSERT INTO engine.companion_memories (user_id, content, embedding, category, source, session_id,"
        " from_message_id, through_message_id) SELECT 'alice', 'Said things', embedding, 'fact', 'dreaming',"
        " session_id, %s, %s FROM engine.chat_messages m, LATERAL (SELECT array_fill(0.1, ARRAY[512])::vector"
        " AS embedding) e WHERE m.id = %s RETURNING id",
        (transcripts["old_done"][0], transcripts["old_done"][1], transcripts["old_done"][0])).fetchone()["id"]
    assert sweep() == 4
    assert left(db) == {transcripts["old_done"][2], transcripts["partly"][1], *transcripts["never"]}
    # The memory distilled from the deleted messages is still there, with its provenance.
    kept = Api().call("GET", f"/v1/memories/{memory}")[1]
    assert (kept["from_message_id"], kept["through_message_id"]) == tuple(transcripts["old_done"][:2])
    assert sweep() == 0  # nothing more is due


def test_a_backlog_is_deleted_over_several_sweeps(db, env, transcripts, monkeypatch):
    env(TRANSCRIPT_RETENTION_DAYS=30)
    monkeypatch.setattr(tick, "RETENTION_PER_TICK", 2)
    assert [sweep() for _ in range(4)] == [2, 2, 0, 0]


def test_a_negative_retention_is_refused(env):
    from pydantic import ValidationError

    from eros.config import Settings

    with pytest.raises(ValidationError, match="transcript_retention_days"):
        Settings(transcript_retention_days=-1)
