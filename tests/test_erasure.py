"""Erasure: ``DELETE /v1/me`` and ``eros forget USER`` leave nothing of the user in any table, touch
nobody else, are idempotent, and a dreaming pass running at the same time writes nothing afterwards."""

from __future__ import annotations

import io
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from apiclient import Api
from helpers import go_idle

from eros import dreaming
from eros.config import settings
from eros_dev import cli
from eros_dev.dreaming import sweep_locally
from eros_dev.lambda_runtime import LambdaContext, load_function
from eros_dev.server import http_api_event

USER = "erasure-7f3a-user"  # unique strings: a scan for them finds nothing else
OTHER = "erasure-other-user"
SAID = "my tortoise Zebulon"
EXTRACTED = json.dumps({"memories": [
    {"content": "Has a tortoise named Zebulon", "category": "relation", "importance": 0.8},
    {"content": "Lives in Porto", "category": "fact", "importance": 0.6},
], "episode": {"content": f"The user told Luna about {SAID}; Luna asked what he eats", "occurred_at": None}})


@pytest.fixture
def online(providers, env):
    fake_llm, _ = providers
    fake_llm.responder = lambda body: EXTRACTED if body.get("response_format") else "fake reply"
    env(DREAMING_IDLE_SECS=1800, TURNS_PER_MINUTE=20, DAILY_TOKEN_BUDGET=1000000)
    return providers


def a_full_history(db, api: Api, user: str) -> str:
    """Two sessions of turns (messages, relationship rows, usage), one dreamed (profile rows), a
    superseded version, a deep-pass record and one session left claimed: every kind of row there is."""
    sid = api.session(user=user)
    for text in (f"I love {SAID} of {user}", "He eats dandelions"):
        assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": text}, user=user)[0] == 200
    go_idle(db)
    assert sweep_locally()["invoked"] == 1
    old = db.execute("SELECT id FROM engine.companion_memories WHERE user_id = %s AND category = 'fact'",
                     (user,)).fetchone()["id"]
    db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, source, superseded_by,"
               " superseded_at, superseded_reason) SELECT user_id, 'Lived in Lisbon', embedding, 'fact', 'dreaming',"
               " id, now(), 'changed' FROM engine.companion_memories WHERE id = %s", (old,))
    pending = api.session(user=user, persona="kai")
    assert api.call("POST", f"/v1/sessions/{pending}/turns", {"content": f"{SAID} of {user} is asleep"},
                    user=user)[0] == 200
    db.execute("UPDATE engine.chat_sessions SET extraction_claimed_at = now() WHERE id = %s", (pending,))
    db.execute("INSERT INTO engine.user_deep_pass (user_id, changed_at) VALUES (%s, now())"
               " ON CONFLICT (user_id) DO NOTHING", (user,))
    return pending


def rows_mentioning(db, *needles: str) -> dict[str, int]:
    """For every table of the engine schema: rows whose text (every column, as Postgres prints the row)
    contains any of ``needles``."""
    tables = [r["table_name"] for r in db.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'engine'"
        " AND table_type = 'BASE TABLE' ORDER BY table_name").fetchall()]
    assert {"chat_messages", "chat_sessions", "companion_memories", "persona_instances", "user_deep_pass",
            "user_usage", "user_model_usage"} <= set(tables)
    found = {}
    for table in tables:
        clauses = " OR ".join("r::text LIKE %s" for _ in needles)
        n = db.execute(f"SELECT count(*) AS n FROM engine.{table} AS r WHERE {clauses}",  # noqa: S608 - names from the catalog
                       [f"%{needle}%" for needle in needles]).fetchone()["n"]
        if n:
            found[table] = n
    return found


def erased_everywhere(db, *needles: str) -> dict[str, int]:
    """``rows_mentioning`` once the erasure's one event is published: until then the outbox holds it, the one row
    that names the erased user (migration 0035; nothing else of theirs is pending)."""
    from eros import events
    from eros.config import settings

    pending = db.execute("SELECT type FROM engine.memory_events WHERE user_id = ANY(%s)", (list(needles),)).fetchall()
    assert [r["type"] for r in pending] in ([], ["user.erased"]), pending
    events.publish_pending(settings())
    return rows_mentioning(db, *needles)


def outbox_aside(found: dict[str, int]) -> dict[str, int]:
    """What a scan found but the events' outbox, whose rows go as each sweep publishes them."""
    return {table: n for table, n in found.items() if table not in ("memory_events", "user_event_sequence")}


def erase(api: Api, user: str | None) -> tuple[int, dict]:
    return api.call("DELETE", "/v1/me", user=user)


def test_erasure_leaves_nothing_of_the_user_in_any_table_and_keeps_everyone_else(online, db):
    api = Api()
    a_full_history(db, api, USER)
    a_full_history(db, api, OTHER)
    before = rows_mentioning(db, USER)
    # (messages carry the text, not the user id)
    assert {"chat_messages", "chat_sessions", "companion_memories", "persona_instances", "user_deep_pass",
            "user_usage", "user_model_usage"} <= set(before) | {"chat_messages"}
    assert rows_mentioning(db, f"{SAID} of {USER}")["chat_messages"] >= 2
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories WHERE user_id = %s AND source = 'episode'"
                      " AND content LIKE %s", (USER, f"%{SAID}%")).fetchone()["n"] == 1
    others = rows_mentioning(db, OTHER)

    status, body = erase(api, USER)
    assert status == 200
    erased = body["erased"]
    assert erased["sessions"] == 2 and erased["messages"] == 6 and erased["persona_instances"] == 2
    assert erased["memories"] == 2 + 1 + 3 + 1  # two dreamed, one superseded version, three utterances, an episode
    assert erased["deep_pass"] == 1 and erased["usage_days"] == 1
    assert erased["usage_by_model"] >= 3  # chat and extraction, each with the LLM and the embedder

    assert erased_everywhere(db, USER, f"{SAID} of {USER}") == {}  # the id and what they said: nowhere
    assert rows_mentioning(db, f"about {SAID}; Luna") == {"companion_memories": 1}  # OTHER's episode alone
    assert outbox_aside(rows_mentioning(db, OTHER)) == outbox_aside(others)  # nobody else lost anything


def test_erasing_again_erases_nothing_and_succeeds(online, db):
    api = Api()
    a_full_history(db, api, USER)
    assert erase(api, USER)[0] == 200
    status, body = erase(api, USER)
    assert status == 200 and set(body["erased"].values()) == {0}
    assert erase(api, "never-seen-user") == (200, {"erased": dict.fromkeys(body["erased"], 0)})


def test_erasure_needs_a_token_and_takes_no_user_from_the_request(online, db):
    api = Api()
    a_full_history(db, api, USER)
    event = http_api_event("DELETE", f"/v1/me?user_id={USER}", {"content-type": "application/json"},
                           json.dumps({"user_id": USER}).encode(), None)
    result = load_function("chat").lambda_handler(event, LambdaContext("chat"))
    assert result["statusCode"] == 401
    # A token for someone else erases that someone, whatever the query or body name.
    event = http_api_event("DELETE", f"/v1/me?user_id={USER}", {"content-type": "application/json"},
                           json.dumps({"user_id": USER}).encode(), {"sub": OTHER, "iss": "test", "aud": "test"})
    assert load_function("chat").lambda_handler(event, LambdaContext("chat"))["statusCode"] == 200
    assert rows_mentioning(db, USER)


def test_a_turn_in_an_erased_session_is_session_not_found(online, db):
    api = Api()
    sid = api.session(user=USER)
    assert erase(api, USER)[0] == 200
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "still there?"}, user=USER)
    assert status == 404 and body["message"] == "session not found"
    assert erased_everywhere(db, USER) == {}


def test_an_extraction_running_during_the_erasure_writes_nothing_after_it(online, db):
    fake_llm, _ = online
    api = Api()
    sid = api.session(user=USER)
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": f"I love {SAID}"}, user=USER)[0] == 200
    go_idle(db)
    sent: list[dict] = []
    dreaming.sweep(settings(), sent.append)
    [payload] = sent
    asked, answer = threading.Event(), threading.Event()

    def held_extraction(body):
        if not body.get("response_format"):
            return "fake reply"
        asked.set()
        assert answer.wait(20)
        return EXTRACTED

    fake_llm.responder = held_extraction
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(load_function("extract").lambda_handler, payload, LambdaContext("extract", 120))
        assert asked.wait(20), "the extraction never reached its model call"
        assert erase(api, USER)[0] == 200  # while the model is still answering
        answer.set()
        result = running.result(30)
    assert result["outcome"] == "lost-claim" and result.get("memories", 0) == 0
    assert erased_everywhere(db, USER, SAID) == {}


def test_eros_forget_erases_the_same_way_for_an_operator(online, db, capsys):
    api = Api()
    a_full_history(db, api, USER)
    assert cli.main(["forget", USER, "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"erased {USER}: " in out and "2 sessions" in out and "1 deep pass" in out
    assert erased_everywhere(db, USER) == {}


class Terminal(io.StringIO):
    """What a person types at a terminal."""

    def isatty(self) -> bool:
        return True


def test_eros_forget_shows_what_it_erases_and_asks_for_the_user_id(online, db, env, tmp_path, monkeypatch, capsys):
    """Issue 29: `eros forget USER` erased with no confirmation, and reported an erasure for a user that never
    existed."""
    env(EXPORT_DIR=str(tmp_path), EXPORT_BASE_URL="http://127.0.0.1:3000/local")
    api = Api()
    a_full_history(db, api, USER)
    assert api.call("GET", "/v1/export", user=USER)[0] == 200
    stored = rows_mentioning(db, USER)
    messages, memories = (db.execute(f"SELECT count(*) AS n FROM engine.{table} WHERE user_id = %s",  # noqa: S608
                                     (USER,)).fetchone()["n"] for table in ("chat_messages", "companion_memories"))
    shown = (f"stored about {USER}: 2 sessions, {messages} messages, {memories} memories, 2 persona instances,"
             " 1 deep pass, 1 usage day")
    capsys.readouterr()

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # a script's stdin, no terminal: refused without --yes
    assert cli.main(["forget", USER]) == 2
    out, err = capsys.readouterr()
    assert out.startswith(shown) and out.rstrip().endswith(", 1 export") and "--yes" in err and "at a terminal" in err
    assert rows_mentioning(db, USER) == stored

    monkeypatch.setattr("sys.stdin", Terminal(f"{OTHER}\n"))  # the wrong id: nothing erased
    assert cli.main(["forget", USER]) == 1
    out, err = capsys.readouterr()
    assert f"Type the user id ({USER}) to confirm" in out and f"nothing was erased: the answer was not '{USER}'" in err
    assert rows_mentioning(db, USER) == stored

    monkeypatch.setattr("sys.stdin", Terminal(""))  # Ctrl-D
    assert cli.main(["forget", USER]) == 1 and rows_mentioning(db, USER) == stored
    capsys.readouterr()

    monkeypatch.setattr("sys.stdin", Terminal(f"{USER}\n"))
    assert cli.main(["forget", USER]) == 0
    out = capsys.readouterr().out
    assert out.startswith(shown) and f"erased {USER}: 2 sessions, {messages} messages, {memories} memories" in out
    assert erased_everywhere(db, USER) == {} and not list(tmp_path.rglob("*.json"))

    erased = []
    monkeypatch.setattr("eros.account.erase", erased.append)
    assert cli.main(["forget", USER]) == 0  # again, or a user who never existed: said, and not pretended
    assert capsys.readouterr().out == f"nothing was stored about {USER}\n" and erased == []


def test_an_erasure_and_a_turn_that_has_counted_itself_do_not_deadlock(online, db, database_url):
    """A turn locks its user's usage row, then needs the session (store.chat.open_turn); an erasure that held
    the sessions while waiting for the usage row would deadlock with it. Here the "turn" is a connection
    that takes the same two locks in the same order, around an erasure."""
    from eros import db as eros_db
    from eros.account import erase as erase_user
    from eros.db import connect

    api = Api()
    sid = a_full_history(db, api, USER)
    outcome: dict = {}

    def erasing():
        try:
            outcome["erased"] = erase_user(USER)
        except Exception as exc:  # a deadlock would land here
            outcome["error"] = exc
        finally:
            eros_db.reset()

    with connect(database_url) as turn, turn.transaction():
        turn.execute("SELECT 1 FROM engine.user_usage WHERE user_id = %s FOR UPDATE", (USER,))
        worker = threading.Thread(target=erasing)
        worker.start()
        deadline = time.monotonic() + 20
        while db.execute("SELECT count(*) AS n FROM engine.chat_sessions WHERE user_id = %s", (USER,)
                         ).fetchone()["n"]:  # the erasure's own transaction committed without the usage row
            assert time.monotonic() < deadline, "the erasure waited for the turn's usage row"
            time.sleep(0.02)
        assert turn.execute("SELECT id FROM engine.chat_sessions WHERE id = %s FOR KEY SHARE", (sid,)).fetchall() == []
    worker.join(20)
    assert "error" not in outcome and outcome["erased"]["usage_days"] == 1
    assert erased_everywhere(db, USER) == {}
