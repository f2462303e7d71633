"""A streamed turn (issue 31): the turn of POST .../turns, its reply sent as the model writes it (Server-Sent Events,
eros.streaming), through the local stack's server as a function URL streams it in AWS; and the same guarantees:
the message stored before the model call, the reply stored once and whole, a model failure mid-stream storing no
part of it, a client that goes away still getting its reply stored, and a retry paying no second model call."""
from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import httpx
import pytest
from apiclient import Api
from fakes import BreakStream, Status

from eros.streaming import events
from eros_dev.lambda_runtime import LambdaContext, load_function
from eros_dev.server import http_api_event

pytestmark = pytest.mark.integration


def stream(client: httpx.Client, sid: str, content: str, turn_id: str | None = None) -> tuple[int, list, list]:
    """A streamed turn: its status, its (event, data) pairs, and when each arrived (seconds after the request)."""
    body = {"content": content} | ({"client_turn_id": turn_id} if turn_id else {})
    start, got, at = time.monotonic(), [], []
    with client.stream("POST", f"/v1/sessions/{sid}/turns/stream", json=body) as response:
        if not response.headers["content-type"].startswith("text/event-stream"):
            response.read()
            return response.status_code, [("json", response.json())], []
        buffer = b""
        for chunk in response.iter_raw():
            buffer += chunk
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                got += list(events(block + b"\n\n"))
                at.append(time.monotonic() - start)
        return response.status_code, got, at


@pytest.fixture
def streaming(providers, local_server):
    """The local stack with a fake model that streams a reply word by word."""
    fake_llm, _ = providers
    fake_llm.responder = lambda request: "Good morning, Alice! The sea in Lisbon is calm today."
    client = local_server.client("alice")
    sid = client.post("/v1/sessions", json={"persona_id": "luna"}).json()["id"]
    yield fake_llm, client, sid
    client.close()


def chat_calls(fake_llm) -> int:
    return sum(1 for r in fake_llm.requests if not (r["json"] or {}).get("response_format"))


def stored_messages(db, sid: str) -> list[tuple[str, str]]:
    return [(r["role"], r["content"]) for r in db.execute(
        "SELECT role, content FROM engine.chat_messages WHERE session_id = %s ORDER BY id", (sid,))]


def test_a_streamed_turn_sends_the_reply_as_it_is_written_and_stores_it_once_whole(streaming, db):
    fake_llm, client, sid = streaming
    fake_llm.first_token_delay, fake_llm.token_interval = 0.05, 0.1
    status, got, at = stream(client, sid, "Good morning!", "t-1")
    assert status == 200
    names = [name for name, _ in got]
    assert names[0] == "turn" and names[-1] == "done" and set(names[1:-1]) == {"delta"}, names
    deltas = [data["delta"] for name, data in got if name == "delta"]
    assert len(deltas) == 10 and "".join(deltas) == "Good morning, Alice! The sea in Lisbon is calm today."
    # The first words arrived while the model was still writing (10 pieces, 0.1 s apart), not with the last.
    assert at[names.index("delta")] < at[-1] - 0.5
    turn, done = got[0][1], got[-1][1]
    assert turn == {"client_turn_id": "t-1", "user_message_id": done["user_message_id"]}
    assert done["reply"] == "".join(deltas) and done["replayed"] is False and done["client_turn_id"] == "t-1"
    assert done["usage"]["completion_tokens"] > 0 and done["model"]
    assert stored_messages(db, sid) == [("user", "Good morning!"), ("assistant", done["reply"])]
    # The stream asked the model to stream, with the usage in its last chunk.
    request = [r["json"] for r in fake_llm.requests][-1]
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}


def test_the_streamed_reply_is_the_json_routes_reply_byte_for_byte(streaming):
    fake_llm, client, sid = streaming
    fake_llm.responder = lambda request: "  Olá!\n\nLine two — 你好，世界 🌊  ends with spaces  "
    status, got, _ = stream(client, sid, "hello", "s-1")
    assert status == 200
    other = client.post("/v1/sessions", json={"persona_id": "luna"}).json()["id"]
    whole = client.post(f"/v1/sessions/{other}/turns", json={"content": "hello", "client_turn_id": "j-1"}).json()
    done = got[-1][1]
    assert "".join(d["delta"] for n, d in got if n == "delta").encode() == whole["reply"].encode()
    assert done.keys() == whole.keys()
    assert done["reply"] == whole["reply"] and done["recalled"] == whole["recalled"]


def test_a_retry_of_a_streamed_turn_replays_it_without_calling_the_model(streaming, db):
    fake_llm, client, sid = streaming
    _, first, _ = stream(client, sid, "Good morning!", "t-1")
    calls = chat_calls(fake_llm)
    status, again, _ = stream(client, sid, "Good morning!", "t-1")
    assert status == 200 and chat_calls(fake_llm) == calls
    assert [n for n, _ in again] == ["turn", "delta", "done"]
    assert again[1][1]["delta"] == first[-1][1]["reply"] and again[-1][1]["replayed"] is True
    # And the JSON route replays the same turn.
    replay = client.post(f"/v1/sessions/{sid}/turns", json={"content": "Good morning!", "client_turn_id": "t-1"})
    assert replay.json()["reply"] == first[-1][1]["reply"] and replay.json()["replayed"] is True
    assert len(stored_messages(db, sid)) == 2


@pytest.mark.parametrize("failure", [BreakStream(after=3), BreakStream(after=3, error={"code": 502,
                                                                                        "message": "upstream died"})],
                         ids=["connection dropped", "error chunk"])
def test_a_model_that_fails_mid_stream_keeps_the_message_stores_no_partial_reply_and_says_so(streaming, db, failure):
    fake_llm, client, sid = streaming
    fake_llm.push(failure)
    status, got, _ = stream(client, sid, "Good morning!", "t-1")
    assert status == 200
    names = [n for n, _ in got]
    assert names == ["turn", "delta", "delta", "delta", "error"], names
    error = got[-1][1]
    assert (error["statusCode"], error["code"], error["retryable"]) == (503, "model_unavailable", True), error
    assert error["client_turn_id"] == "t-1" and "upstream died" not in json.dumps(error)
    assert stored_messages(db, sid) == [("user", "Good morning!")]  # the message kept, no part of the reply
    # What was streamed was paid for: counted (the three pieces and the prompt, estimated without a usage chunk).
    spent = db.execute("SELECT chat_tokens FROM engine.user_usage WHERE user_id = 'alice'").fetchone()
    assert spent and spent["chat_tokens"] > 0
    # A retry with the turn's id answers it at once (the failed request took its mark away).
    status, got, _ = stream(client, sid, "Good morning!", "t-1")
    assert status == 200 and got[-1][0] == "done" and got[-1][1]["replayed"] is False
    assert stored_messages(db, sid)[-1] == ("assistant", got[-1][1]["reply"])


def test_a_model_that_fails_before_the_first_word_is_an_error_event_with_its_code(streaming, db):
    fake_llm, client, sid = streaming
    fake_llm.push(Status(401))
    status, got, _ = stream(client, sid, "Good morning!", "t-1")
    assert status == 200 and [n for n, _ in got] == ["turn", "error"]
    assert (got[-1][1]["code"], got[-1][1]["retryable"]) == ("provider_misconfigured", False)
    assert stored_messages(db, sid) == [("user", "Good morning!")]


def test_a_client_that_goes_away_mid_stream_still_gets_its_reply_stored_and_replayed(streaming, local_server, db):
    fake_llm, client, sid = streaming
    fake_llm.first_token_delay, fake_llm.token_interval = 0.02, 0.1
    token = client.headers["authorization"]
    body = json.dumps({"content": "Good morning!", "client_turn_id": "t-1"}).encode()
    host, port = local_server.server.server_address[:2]
    with socket.create_connection((host, port)) as raw:
        raw.sendall(b"POST /v1/sessions/" + sid.encode() + b"/turns/stream HTTP/1.1\r\nHost: x\r\n"
                    b"Authorization: " + token.encode() + b"\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        seen = b""
        while b"event: delta" not in seen:
            seen += raw.recv(4096)
        raw.shutdown(socket.SHUT_RDWR)  # gone after the first words
    deadline = time.monotonic() + 15
    while len(stored_messages(db, sid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stored_messages(db, sid) == [("user", "Good morning!"),
                                        ("assistant", "Good morning, Alice! The sea in Lisbon is calm today.")]
    calls = chat_calls(fake_llm)
    status, got, _ = stream(client, sid, "Good morning!", "t-1")
    assert got[-1][1]["replayed"] is True and got[-1][1]["reply"].endswith("calm today.")
    assert chat_calls(fake_llm) == calls == 1


def test_a_duplicate_sent_while_the_turn_streams_waits_for_its_reply_and_pays_no_second_model_call(streaming, db):
    fake_llm, client, sid = streaming
    fake_llm.first_token_delay, fake_llm.token_interval = 0.3, 0.1
    results: dict = {}

    def first():
        results["first"] = stream(client, sid, "Good morning!", "t-1")

    thread = threading.Thread(target=first)
    thread.start()
    deadline = time.monotonic() + 10
    while not stored_messages(db, sid) and time.monotonic() < deadline:  # the first has stored the message
        time.sleep(0.02)
    duplicate = client.post(f"/v1/sessions/{sid}/turns", json={"content": "Good morning!", "client_turn_id": "t-1"})
    streamed = stream(client, sid, "Good morning!", "t-1")
    thread.join(timeout=20)
    first_done = results["first"][1][-1][1]
    assert duplicate.status_code == 200 and duplicate.json()["replayed"] is True
    assert duplicate.json()["reply"] == first_done["reply"] == streamed[1][-1][1]["reply"]
    assert streamed[1][-1][1]["replayed"] is True
    assert chat_calls(fake_llm) == 1
    assert len(stored_messages(db, sid)) == 2


def test_what_the_json_route_refuses_before_storing_the_message_is_refused_the_same_way(streaming, local_server, env):
    fake_llm, client, sid = streaming
    stream(client, sid, "hello", "t-1")
    calls = chat_calls(fake_llm)
    for path_sid, body, status, code in (
            (str(uuid.uuid4()), {"content": "hi"}, 404, "not_found"),
            ("not-a-uuid", {"content": "hi"}, 422, "invalid_request"),
            (sid, {"content": "something else", "client_turn_id": "t-1"}, 409, "turn_conflict"),
            (sid, {"content": ""}, 422, "invalid_request"),
            (sid, {"content": "hi", "user_id": "bob"}, 422, "invalid_request"),
            (sid, {"text": "hi"}, 422, "invalid_request")):
        answer = client.post(f"/v1/sessions/{path_sid}/turns/stream", json=body)
        assert (answer.status_code, answer.json()["code"]) == (status, code), (body, answer.text)
        assert answer.headers["content-type"].startswith("application/json")
    malformed = client.post(f"/v1/sessions/{sid}/turns/stream", content=b'{"content": ',
                            headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["code"] == "invalid_request"
    anonymous = local_server.client(None).post(f"/v1/sessions/{sid}/turns/stream", json={"content": "hi"})
    assert anonymous.status_code == 401
    bob = local_server.client("bob").post(f"/v1/sessions/{sid}/turns/stream", json={"content": "hi"})
    assert bob.status_code == 404  # another user's session is not found, as ever
    env(TURNS_PER_MINUTE=1)
    limited = client.post(f"/v1/sessions/{sid}/turns/stream", json={"content": "one more"})
    limited = client.post(f"/v1/sessions/{sid}/turns/stream", json={"content": "and another"})
    assert limited.status_code == 429 and limited.json()["code"] == "rate_limited" and limited.headers["retry-after"]
    assert chat_calls(fake_llm) == calls + 1  # only the one admitted turn called the model


def test_the_offline_model_streams_its_answer_in_pieces(db, env, local_server):
    env(LLM_BASE_URL=None, OPENROUTER_API_KEY=None)
    client = local_server.client("alice")
    sid = client.post("/v1/sessions", json={"persona_id": "luna"}).json()["id"]
    status, got, _ = stream(client, sid, "I live in Lisbon and I'm a nurse.")
    deltas = [d["delta"] for n, d in got if n == "delta"]
    assert status == 200 and len(deltas) > 5 and got[-1][1]["model"] == "offline/echo"
    assert "".join(deltas) == got[-1][1]["reply"] and got[-1][1]["usage"]["total_tokens"] > 0


def test_behind_the_http_api_the_stream_route_answers_the_same_events_in_one_piece(providers, db):
    """The HTTP API cannot stream; a client that calls the stream route there still gets a valid event stream."""
    api = Api()
    sid = api.session()
    event = http_api_event("POST", f"/v1/sessions/{sid}/turns/stream", {"content-type": "application/json"},
                           json.dumps({"content": "hello", "client_turn_id": "h-1"}).encode(),
                           {"sub": "alice", "iss": "test", "aud": "test"})
    result = api.function.lambda_handler(event, LambdaContext("chat"))
    assert result["statusCode"] == 200 and result["headers"]["Content-Type"].startswith("text/event-stream")
    got = list(events(result["body"].encode()))
    assert [n for n, _ in got] == ["turn", "delta", "delta", "done"]
    assert "".join(d["delta"] for n, d in got if n == "delta") == got[-1][1]["reply"] == "fake reply"


def test_the_stream_function_serves_its_route_only_and_only_to_a_verified_user(db):
    module = load_function("chat", copy="stream-test", entry="stream")
    other = http_api_event("GET", "/v1/sessions", {}, b"", {"sub": "alice"})
    answer = module.lambda_handler(other, LambdaContext("chat-stream"))
    assert answer.status_code == 404 and b"streams chat turns only" in b"".join(answer.body)
    anonymous = http_api_event("POST", f"/v1/sessions/{uuid.uuid4()}/turns/stream", {}, b'{"content":"hi"}', None)
    answer = module.lambda_handler(anonymous, LambdaContext("chat-stream"))
    assert answer.status_code == 401


def test_a_turn_whose_answerer_died_is_answered_once_its_mark_expires_and_waited_for_until_then(providers, db, env,
                                                                                                monkeypatch):
    """The request answering a turn was killed (its Lambda timed out): its mark holds the turn for a minute, during
    which a retry waits and then says to retry (409 turn_in_progress, retryable); after, a retry answers it."""
    from datetime import timedelta

    from eros import chat, clock
    from eros.store import chat as chat_store

    fake_llm, _ = providers
    sid = chat_store.create_session("alice", "luna")["id"]
    now = clock.now()
    db.execute("INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, metadata)"
               " VALUES (%s, 'alice', 'user', 'hello?', 't-1', %s)",
               (sid, json.dumps({"answering_until": (now + timedelta(seconds=30)).isoformat()})))
    env(TURN_BUDGET_SECS=1)
    monkeypatch.setattr(chat, "ANSWER_WAIT_MARGIN_SECS", 0.0)
    with pytest.raises(chat.TurnInProgress) as waited:
        chat.take_turn("alice", sid, "hello?", "t-1")
    assert (waited.value.status, waited.value.code, waited.value.extra["retryable"]) == (409, "turn_in_progress", True)
    assert chat_calls(fake_llm) == 0
    db.execute("UPDATE engine.chat_messages SET metadata = %s WHERE session_id = %s",
               (json.dumps({"answering_until": (now - timedelta(seconds=1)).isoformat()}), sid))
    result = chat.take_turn("alice", sid, "hello?", "t-1")
    assert result.reply == "fake reply" and not result.replayed and chat_calls(fake_llm) == 1
    assert stored_messages(db, sid) == [("user", "hello?"), ("assistant", "fake reply")]
