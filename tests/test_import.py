"""`eros import`: a JSONL history of conversations, streamed into sessions as an app's appends are stored,
idempotent and resumable, bad lines reported by number; dreaming then takes the sessions oldest first."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from apiclient import Api
from fakes import Status

from eros.errors import ModelFailed
from eros.importing import import_conversations
from eros_dev.cli import main as eros
from eros_dev.dreaming import sweep_locally

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


def conversation(cid: str, user: str | None, start: datetime, *texts: str, persona: str = "luna") -> dict:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": text,
                 "created_at": (start + timedelta(minutes=i)).isoformat()} for i, text in enumerate(texts)]
    line = {"conversation_id": cid, "persona_id": persona, "messages": messages}
    return line | ({"user_id": user} if user else {})


def write(path: Path, *lines: dict | str) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
                    encoding="utf-8")
    return path


@pytest.fixture
def online(providers, env):
    fake_llm, _ = providers
    fake_llm.responder = lambda body: (json.dumps({"memories": []}) if body.get("response_format")
                                       else "fake reply")
    env(DREAMING_IDLE_SECS=1800)
    return providers


def sessions(db) -> list[dict]:
    return db.execute("SELECT id, user_id, external_id, last_active_at FROM engine.chat_sessions"
                      " ORDER BY user_id, external_id").fetchall()


def history_file(tmp_path: Path) -> Path:
    with_system = conversation("c-2", "alice", T0 + timedelta(days=400), "I moved to Lisbon", "Lovely!")
    with_system["messages"].insert(0, {"role": "system", "content": "You are Luna.",
                                       "created_at": (T0 + timedelta(days=400)).isoformat()})
    backwards = conversation("c-5", "bob", T0, "first", "second")
    backwards["messages"][1]["created_at"] = (T0 - timedelta(days=1)).isoformat()
    return write(tmp_path / "history.jsonl",
                 conversation("c-1", "alice", T0, "I live in Berlin", "Nice!", "I work at a bakery"),
                 with_system,
                 "{not json",
                 conversation("c-3", "bob", T0 + timedelta(days=3), "My dog is Rex", persona="kai"),
                 conversation("c-4", "bob", T0, "hello", persona="nobody"),
                 backwards,
                 conversation("c-6", None, T0, "who am I?"),
                 "",
                 json.dumps({"conversation_id": "c-7", "user_id": "bob", "persona_id": "luna", "messages": []}))


def test_a_history_is_imported_as_sessions_with_its_times_and_bad_lines_reported(online, db, tmp_path):
    _, fake_voyage = online
    done = import_conversations(history_file(tmp_path).open("rb"))
    assert (done.conversations, done.sessions_created, done.stored, done.skipped) == (3, 3, 6, 1)
    refused = dict(done.refused)
    assert sorted(refused) == [3, 5, 6, 7, 9]
    assert refused[3].startswith("not JSON")
    assert "no persona 'nobody'" in refused[5]
    assert "created_at" in refused[6] and "before the previous message" in refused[6]
    assert "no user_id" in refused[7]
    assert refused[9].startswith("messages: ")
    got = sessions(db)
    assert [(s["user_id"], s["external_id"]) for s in got] == [("alice", "c-1"), ("alice", "c-2"), ("bob", "c-3")]
    # Each session is quiet as of its last message; messages and utterances keep their times.
    assert got[0]["last_active_at"] == T0 + timedelta(minutes=2)
    rows = db.execute("SELECT m.role, m.content, m.sent_at, m.client_turn_id FROM engine.chat_messages m"
                      " WHERE m.session_id = %s ORDER BY m.id", (got[0]["id"],)).fetchall()
    assert [(r["role"], r["client_turn_id"], r["sent_at"]) for r in rows] == [
        ("user", "0", T0), ("assistant", "1", T0 + timedelta(minutes=1)), ("user", "2", T0 + timedelta(minutes=2))]
    said = db.execute("SELECT content, created_at FROM engine.companion_memories WHERE session_id = %s"
                      " ORDER BY created_at", (got[0]["id"],)).fetchall()
    assert [(u["content"], u["created_at"]) for u in said] == [("I live in Berlin", T0),
                                                               ("I work at a bakery", T0 + timedelta(minutes=2))]
    # The system message was skipped; one embedding batch per conversation.
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages WHERE content = 'You are Luna.'").fetchone()[
        "n"] == 0
    assert fake_voyage.calls == 3
    # Counted, not limited: an operator's import.
    assert db.execute("SELECT sum(calls) AS n FROM engine.user_model_usage WHERE user_id = 'alice'").fetchone()[
        "n"] == 2


def test_importing_again_stores_nothing_twice_and_pays_nothing(online, db, tmp_path):
    _, fake_voyage = online
    path = history_file(tmp_path)
    import_conversations(path.open("rb"))
    before = (db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"],
              db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"], fake_voyage.calls)
    again = import_conversations(path.open("rb"))
    assert (again.conversations, again.sessions_created, again.stored) == (3, 0, 0)
    assert (db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"],
            db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"],
            fake_voyage.calls) == before


def test_an_import_stopped_by_a_provider_failure_resumes_where_it_stopped(online, db, tmp_path):
    _, fake_voyage = online
    lines = [conversation(f"c-{i}", "alice", T0 + timedelta(days=i), f"day {i} was fine", "ok") for i in range(4)]
    path = write(tmp_path / "h.jsonl", *lines)

    def fail_third(done):  # after the second conversation, the embedder fails once
        if done.conversations == 2:
            fake_voyage.push(Status(503))

    with pytest.raises(ModelFailed):
        import_conversations(path.open("rb"), progress=fail_third)
    assert len(sessions(db)) == 3  # the third's session was made; its messages were not stored
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 4
    done = import_conversations(path.open("rb"))
    assert (done.conversations, done.stored) == (4, 4)
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 8
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == 4


def test_a_long_conversation_goes_in_batches(online, db, tmp_path):
    _, fake_voyage = online
    texts = [f"message number {i}" for i in range(250)]
    path = write(tmp_path / "long.jsonl", conversation("long", "alice", T0, *texts))
    done = import_conversations(path.open("rb"))
    assert (done.conversations, done.stored) == (1, 250)
    assert fake_voyage.calls == 3  # 100 + 100 + 50 messages, each batch's user messages embedded at once
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == 125


def test_a_line_of_another_user_is_refused_when_the_import_is_for_one(online, db, tmp_path):
    path = write(tmp_path / "h.jsonl", conversation("a", "alice", T0, "mine"), conversation("b", None, T0, "also"),
                 conversation("c", "mallory", T0, "sneaky"))
    done = import_conversations(path.open("rb"), user="alice")
    assert done.conversations == 2 and [n for n, _ in done.refused] == [3]
    assert {s["user_id"] for s in sessions(db)} == {"alice"}


def test_dreaming_takes_the_imported_sessions_oldest_first(online, db, tmp_path):
    fake_llm, _ = online
    path = write(tmp_path / "h.jsonl",
                 conversation("late", "alice", datetime(2025, 6, 2, tzinfo=UTC), "I moved to Lisbon"),
                 conversation("early", "alice", datetime(2024, 6, 2, tzinfo=UTC), "I live in Berlin"))
    import_conversations(path.open("rb"))
    # Quiet as of their last messages: idle at once. The sweep claims the older; its extraction goes on with the
    # newer (one at a time, oldest first), in the same invocation.
    result = sweep_locally()
    assert (result["claimed"], [job["followed"] for job in result["jobs"]]) == (1, [1]), result
    transcripts = [r["json"]["messages"][-1]["content"] for r in fake_llm.requests
                   if r["json"].get("response_format")]
    assert len(transcripts) == 2
    assert "2024-06-02" in transcripts[0] and "I live in Berlin" in transcripts[0]
    assert "2025-06-02" in transcripts[1] and "I moved to Lisbon" in transcripts[1]
    assert db.execute("SELECT count(*) AS n FROM engine.chat_sessions WHERE extracted_at IS NULL").fetchone()["n"] == 0


def test_a_users_imported_sessions_wait_for_the_older_ones_and_live_sessions_do_not(online, db, tmp_path, env):
    from eros.store import dreaming as dreaming_store

    path = write(tmp_path / "h.jsonl",
                 *[conversation(f"c{i}", "alice", datetime(2024, 1, 1 + i, tzinfo=UTC), f"day {i}") for i in range(3)],
                 conversation("b", "bob", datetime(2024, 5, 1, tzinfo=UTC), "bob's day"))
    import_conversations(path.open("rb"))
    live = Api()
    sid = live.session()
    assert live.call("POST", f"/v1/sessions/{sid}/turns", {"content": "hello today"})[0] == 200
    now = datetime.now(UTC) + timedelta(seconds=1)
    claimed = dreaming_store.claims.claim(dreaming_store.SESSIONS, 10, now, idle_before=now, stale_before=now)
    rows = {r["id"]: r for r in db.execute("SELECT id, user_id, external_id FROM engine.chat_sessions")}
    assert sorted((rows[c["id"]]["user_id"], rows[c["id"]]["external_id"] or "live") for c in claimed) == [
        ("alice", "c0"), ("alice", "live"), ("bob", "b")]


def test_the_command_reports_and_fails_on_refused_lines(online, db, tmp_path, capsys):
    path = history_file(tmp_path)
    assert eros(["import", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["conversations"] == 3 and [r["line"] for r in report["refused"]] == [3, 5, 6, 7, 9]
    good = write(tmp_path / "good.jsonl", conversation("x", "carol", T0, "hi"))
    assert eros(["import", str(good)]) == 0
    out = capsys.readouterr().out
    assert "imported 1 conversations" in out and "1 messages stored" in out
    assert eros(["import", str(tmp_path / "missing.jsonl")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_the_command_imports_the_users_of_an_app_under_their_apps_keys(online, db, tmp_path, capsys):
    """`--app`: the lines' user_id (and --user) are subjects of that app; a subject that would name another app's
    user is refused, and so is an app this database does not serve."""
    from eros.store import apps as app_store
    from eros.store import personas as persona_store

    app_store.create("acme", "Acme", {}, db)
    persona_store.keep_app("acme", "nova", "Nova", "", "You are Nova, a patient tutor.")
    path = write(tmp_path / "acme.jsonl", conversation("a-1", "alice", T0, "I live in Lisbon", persona="nova"),
                 conversation("a-2", "bob", T0, "I live in Porto", persona="nova"),
                 conversation("a-3", "alice", T0, "hello", persona="luna"),  # the first app's persona: not acme's
                 conversation("a-4", "globex\u001fmallory", T0, "I am someone else", persona="nova"))
    assert eros(["import", str(path), "--app", "acme", "--json"]) == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["conversations"] == 2 and [r["line"] for r in report["refused"]] == [3, 4]
    assert "no persona 'luna'" in report["refused"][0]["problem"]
    assert "U+001F" in report["refused"][1]["problem"]
    assert [(s["user_id"], s["external_id"]) for s in sessions(db)] == [("acme\x1falice", "a-1"),
                                                                         ("acme\x1fbob", "a-2")]

    one = write(tmp_path / "one.jsonl", conversation("a-5", None, T0, "I play the cello", persona="nova"))
    assert eros(["import", str(one), "--app", "acme", "--user", "carol"]) == 0
    assert ("acme\x1fcarol", "a-5") in [(s["user_id"], s["external_id"]) for s in sessions(db)]
    assert eros(["import", str(one), "--user", "carol"]) == 1  # the first app's carol: acme's persona is not hers
    assert not [s for s in sessions(db) if s["user_id"] == "carol"]
    capsys.readouterr()
    assert eros(["import", str(one), "--app", "globex"]) == 1
    assert capsys.readouterr().err.strip() == "eros import: there is no app 'globex' (`eros apps list` lists them)"
    assert eros(["import", str(one), "--app", "acme", "--user", "x\x1fy"]) == 2
    assert "U+001F" in capsys.readouterr().err


# --- through the API --------------------------------------------------------------------------------------

def test_the_api_imports_conversations_and_reports_the_backfill(online, db):
    api = Api()
    conversations = [{k: v for k, v in conversation(f"c{i}", None, T0 + timedelta(days=30 * i), f"month {i}", "ok")
                      .items()} for i in range(2)]
    conversations.append(conversation("bad", None, T0, "hi", persona="nobody"))
    assert api.call("GET", "/v1/imports")[1]["state"] == "none"
    status, body = api.call("POST", "/v1/imports", {"conversations": conversations})
    assert status == 200, body
    assert [(c["conversation_id"], c["created"], c["stored"]) for c in body["imported"]] == [
        ("c0", True, 2), ("c1", True, 2)]
    assert body["refused"] == [{"index": 2, "conversation_id": "bad", "problem": "persona_id: no persona 'nobody'"}]
    status, progress = api.call("GET", "/v1/imports")
    assert (progress["state"], progress["sessions"], progress["waiting"]) == ("backfilling", 2, 2), progress
    # Sent again: nothing stored twice.
    status, again = api.call("POST", "/v1/imports", {"conversations": conversations[:2]})
    assert [(c["created"], c["stored"]) for c in again["imported"]] == [(False, 0), (False, 0)]
    sweep_locally()
    status, progress = api.call("GET", "/v1/imports")
    assert (progress["state"], progress["extracted"]) == ("done", 2), progress
    assert progress["distilled_through"] == progress["newest"]
    # Another user sees none of it.
    assert api.call("GET", "/v1/imports", user="mallory")[1]["sessions"] == 0


@pytest.mark.parametrize("body, field", [
    ({"conversations": []}, "body.conversations"),
    ({"conversations": [conversation(f"c{i}", None, T0, "x") for i in range(51)]}, "body.conversations"),
    ({"conversations": [conversation("c", "bob", T0, "x")]}, "body.conversations.0.user_id"),
    ({"conversations": [{"conversation_id": "c", "persona_id": "luna", "messages": [
        {"role": "user", "content": "x", "created_at": "2024-01-01T10:00:00"}]}]},
     "body.conversations.0.messages.0.created_at"),
    ({"conversations": [{"conversation_id": "c", "persona_id": "luna", "messages": [
        {"role": "robot", "content": "x", "created_at": "2024-01-01T10:00:00Z"}]}]},
     "body.conversations.0.messages.0.role"),
    ({"conversations": [{"conversation_id": "", "persona_id": "luna", "messages": [
        {"role": "user", "content": "x", "created_at": "2024-01-01T10:00:00Z"}]}]},
     "body.conversations.0.conversation_id"),
])
def test_bad_imports_are_422_and_store_nothing(online, db, body, field):
    status, answer = Api().call("POST", "/v1/imports", body)
    assert status == 422, answer
    assert field in [e["field"] for e in answer["errors"]], answer
    assert sessions(db) == []


def test_an_api_import_is_held_to_the_spend_limits(online, db, env):
    env(TURNS_PER_MINUTE=1)
    api = Api()
    status, body = api.call("POST", "/v1/imports", {"conversations": [
        conversation("a", None, T0, "first"), conversation("b", None, T0 + timedelta(days=1), "second")]})
    assert status == 429 and body["code"] == "rate_limited", body
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 1  # the first's


def test_an_imported_2024_fact_is_superseded_by_the_2025_one_whatever_the_files_order(providers, db, tmp_path, env):
    """The file lists the 2025 conversation first; dreaming still extracts the 2024 one first, so the 2025 move
    supersedes the 2024 address, and not the reverse."""
    from test_consolidation import active, known_in, memory

    fake_llm, _ = providers
    env(DREAMING_IDLE_SECS=1800)

    def respond(body):
        if not body.get("response_format"):
            return "fake reply"
        transcript, known = body["messages"][-1]["content"], known_in(body)
        if "moved to Lisbon" in transcript:
            return json.dumps({"memories": [memory("Lives in Lisbon", supersedes=[known[k] for k in known
                                                                                   if "Berlin" in k])]})
        return json.dumps({"memories": [memory("Lives in Berlin")]})

    fake_llm.responder = respond
    path = write(tmp_path / "h.jsonl",
                 conversation("2025", "alice", datetime(2025, 4, 2, tzinfo=UTC), "I moved to Lisbon last month"),
                 conversation("2024", "alice", datetime(2024, 4, 2, tzinfo=UTC), "I live in Berlin now"))
    import_conversations(path.open("rb"))
    sweep_locally()
    assert active(db) == ["Lives in Lisbon"]
    berlin = db.execute("SELECT superseded_reason FROM engine.companion_memories WHERE content = 'Lives in Berlin'"
                        ).fetchone()
    assert berlin["superseded_reason"] == "changed"
