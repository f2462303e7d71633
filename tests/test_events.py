"""Every file in events/ (what `sam local invoke -e` feeds each function) through its real handler."""

from __future__ import annotations

import json
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from helpers import EVENTS, event, invoke

from eros_dev.lambda_runtime import load_function

FUNCTION_OF = {"chat": "chat", "sweeper": "sweeper", "extract": "extract", "migrate": "migrate"}


def test_every_event_file_is_covered_here():
    assert {p.name for p in EVENTS.glob("*.json")} == {
        "chat_health.json", "chat_personas.json", "chat_turn.json", "chat_stream_turn.json", "sweeper_schedule.json",
        "extract_session.json", "extract_deep_pass.json", "migrate_create.json"}


SAMPLE_INSTANCE = "0b9e8d7c-6a5f-4e3d-9c2b-1a0f9e8d7c6b"  # the persona instance of the sample's session


def seed_session_of_the_sample_events(db) -> dict:
    """The session, user and claim the sample events name, so that they act on real rows."""
    sample = event("extract_session.json")
    db.execute("INSERT INTO engine.persona_instances (id, user_id, persona_id) VALUES (%s, %s, 'luna')",
               (SAMPLE_INSTANCE, sample["user_id"]))
    db.execute("INSERT INTO engine.chat_sessions (id, user_id, instance_id, last_active_at, extraction_claimed_at)"
               " VALUES (%s, %s, %s, now() - interval '2 hours', %s)",
               (sample["session_id"], sample["user_id"], SAMPLE_INSTANCE,
                datetime.fromisoformat(sample["claim_token"])))
    return sample


def test_chat_health_event(db):
    result = invoke("chat", event("chat_health.json"))
    assert result["statusCode"] == 200 and json.loads(result["body"])["database"] == "ok"


def test_chat_personas_event(db):
    result = invoke("chat", event("chat_personas.json"))
    assert result["statusCode"] == 200
    assert "luna" in {p["id"] for p in json.loads(result["body"])["personas"]}


def test_chat_turn_event(db):
    seed_session_of_the_sample_events(db)
    result = invoke("chat", event("chat_turn.json"))
    assert result["statusCode"] == 200, result["body"]
    assert json.loads(result["body"])["reply"]
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 2


def test_chat_stream_turn_event_through_the_stream_functions_runtime_as_lambda_runs_it(db, env):
    """The function URL sample through the stream function's own runtime loop (eros.stream_runtime, against a fake
    Runtime API) and its real handler, the token checked in the function against a fake OIDC issuer: the sample's
    token (not the issuer's) is refused with the authorizer's 401; one of the issuer for the sample's user streams
    the turn (its events, the reply stored)."""
    from fake_runtime_api import FakeRuntimeApi
    from test_auth import AUDIENCE, FakeIssuer

    from eros import auth, streaming
    from eros.stream_runtime import RuntimeApi, invoke_once

    sample = seed_session_of_the_sample_events(db)
    issuer = FakeIssuer()
    env(JWT_ISSUER=issuer.url, JWT_AUDIENCE=AUDIENCE)
    auth.reset()
    as_sent = event("chat_stream_turn.json")
    signed = json.loads(json.dumps(as_sent))
    signed["headers"]["authorization"] = f"Bearer {issuer.token(sub=sample['user_id'])}"
    handler = load_function("chat", entry="stream").lambda_handler
    try:
        with FakeRuntimeApi([as_sent, signed]) as api:
            for request_id in api.request_ids:
                assert invoke_once(RuntimeApi(api.address), handler)
                api.wait(request_id)
            refused, answered = ([data for _, data in api.responses[rid]["chunks"]] for rid in api.request_ids)
    finally:
        issuer.close()
        auth.reset()
    assert json.loads(refused[0][:-8]) == {"statusCode": 401, "headers": {"Content-Type": "application/json"},
                                           "cookies": []}
    prelude = json.loads(answered[0][:-8])
    assert prelude["statusCode"] == 200 and prelude["headers"]["Content-Type"].startswith("text/event-stream")
    sent = list(streaming.events(b"".join(answered[1:])))
    assert sent[0] == ("turn", {"client_turn_id": "turn-0002", "user_message_id": sent[0][1]["user_message_id"]})
    assert sent[-1][0] == "done" and sent[-1][1]["reply"]
    assert "".join(data["delta"] for name, data in sent if name == "delta") == sent[-1][1]["reply"]
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 2


def test_chat_stream_turn_event_whose_stream_breaks_still_stores_the_reply(db):
    """The Runtime API connection reset after the prelude and the first event (a client gone mid-reply): the loop
    closes the turn's body, the turn finishes and stores its reply, so a retry can replay it."""
    from fake_runtime_api import FakeRuntimeApi

    from eros.stream_runtime import RuntimeApi, invoke_once

    sample = seed_session_of_the_sample_events(db)
    turn = event("chat_stream_turn.json")
    turn["requestContext"]["authorizer"] = {"jwt": {"claims": {"sub": sample["user_id"]}, "scopes": None}}
    with FakeRuntimeApi([turn]) as api:
        api.drop_after = 2
        assert invoke_once(RuntimeApi(api.address), load_function("chat", entry="stream").lambda_handler) is False
        assert len(api.responses[api.request_ids[0]]["chunks"]) == 2
    rows = db.execute("SELECT role, content FROM engine.chat_messages ORDER BY id").fetchall()
    assert [r["role"] for r in rows] == ["user", "assistant"] and rows[1]["content"]


def test_chat_turn_event_of_an_unknown_session_is_404(db):
    result = invoke("chat", event("chat_turn.json"))
    assert result["statusCode"] == 404


def test_extract_session_event_extracts_the_claimed_session(db):
    sample = seed_session_of_the_sample_events(db)
    db.execute("INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id)"
               " SELECT id, user_id, 'user', 'I moved to Lisbon and I love the tiles', 't1' FROM engine.chat_sessions"
               " WHERE id = %s", (sample["session_id"],))
    result = invoke("extract", event("extract_session.json"))
    assert result["outcome"] == "extracted" and result["memories"] >= 1
    again = invoke("extract", event("extract_session.json"))  # a duplicate delivery
    assert again["outcome"] == "not-claimed"


def test_extract_session_event_without_its_claim_does_nothing(db):
    assert invoke("extract", event("extract_session.json"))["outcome"] == "not-claimed"


def test_extract_deep_pass_event_runs_the_claimed_users_pass(db):
    from pgvector import Vector

    from eros.providers.offline import hash_embed

    sample = event("extract_deep_pass.json")
    assert invoke("extract", sample)["outcome"] == "not-claimed"  # no such claim: nothing to do
    for days in (3, 2, 1):  # the same fact noted in three sessions
        db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, created_at)"
                   " VALUES (%s, 'Lives in Lisbon', %s, 'fact', now() - make_interval(days => %s))",
                   (sample["user_id"], Vector(hash_embed("Lives in Lisbon")), days))
    db.execute("INSERT INTO engine.user_deep_pass (user_id, changed_at, claimed_at, attempts)"
               " VALUES (%s, now() - interval '2 hours', %s, 1)",
               (sample["user_id"], datetime.fromisoformat(sample["claim_token"])))
    result = invoke("extract", sample)
    assert (result["outcome"], result["merged"]) == ("consolidated", 2)
    assert invoke("extract", sample)["outcome"] == "not-claimed"  # a duplicate delivery


@pytest.mark.parametrize("bad", [{}, {"session_id": "x"}, {**event("extract_session.json"), "claim_token": "soon"},
                                 {**event("extract_session.json"), "claim_token": "2025-03-12T19:05:01"}])
def test_malformed_extract_events_raise_for_the_dead_letter_queue(db, bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        invoke("extract", bad)


def test_sweeper_schedule_event_sweeps_in_process(db, monkeypatch, env):
    env(EXTRACT_FUNCTION_NAME="eros-extract")
    sample = seed_session_of_the_sample_events(db)
    db.execute("UPDATE engine.chat_sessions SET extraction_claimed_at = NULL")
    sent = []
    sweeper = load_function("sweeper")
    monkeypatch.setattr(sweeper, "invoker", lambda: sent.append)
    result = invoke("sweeper", event("sweeper_schedule.json"))
    assert result["claimed"] == 1 and result["invoked"] == 1
    assert [p["session_id"] for p in sent] == [sample["session_id"]]


def test_migrate_create_event_reports_success_to_cloudformation(db):
    received = []

    class Receiver(BaseHTTPRequestHandler):
        def do_PUT(self):
            received.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.handle_request, daemon=True).start()
    payload = event("migrate_create.json") | {"ResponseURL": f"http://127.0.0.1:{server.server_address[1]}/cfn"}
    invoke("migrate", payload)
    server.server_close()
    assert received[0]["Status"] == "SUCCESS", received
    assert received[0]["RequestId"] == payload["RequestId"]
