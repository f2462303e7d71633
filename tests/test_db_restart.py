"""Postgres restarted mid-traffic (issue 8, Evidence): a clean 503 during the outage, then recovery.

This file starts its own embedded Postgres (a fresh data directory; the session-wide test database is
never touched), migrates it and points DATABASE_URL at it. Chat turns run from a few threads through the
local stack's Lambda containers (``eros_dev.lambda_runtime.Function``: one thread, one module copy and one database
connection per container), offline providers. Mid-traffic the server is stopped with
``pg_ctl stop -m immediate`` (a crash: no checkpoint, backends killed):

* every request answered during the outage is a 503 JSON ``database_unavailable`` with a message and
  ``retryable: true``; none is a 500, none takes longer than a few seconds (connect_timeout is 5 s);
* after the restart the same containers answer 200 again (their broken connections are reopened);
* every turn acknowledged with a 200, before, during or after the outage, has both of its messages in
  the database.

Dreaming leg: an extraction whose database stops under it (while its model call is in flight) fails
without stamping the session, and the next sweep after the claim goes stale extracts it.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

pytestmark = pytest.mark.e2e


CLIENTS = 4
SLOW = 8.0  # seconds: no request may take longer (connect_timeout is 5 s)


class OwnPostgres:
    """A private embedded Postgres that the test can stop and start again on the same data directory."""

    def __init__(self):
        import pgserver

        from eros.migrate import migrate

        self.server = pgserver.get_server(tempfile.mkdtemp(prefix="eros-restart-pg-"), cleanup_mode="delete")
        self.url = self.server.get_uri()
        migrate(self.url)

    def stop(self, mode: str = "immediate") -> None:
        from pgserver import pg_ctl  # type: ignore[attr-defined]  # pgserver defines its commands at import

        pg_ctl(["-w", "-m", mode, "stop"], pgdata=self.server.pgdata, user=self.server.system_user, timeout=30)

    def start(self) -> None:
        with self.server._lock:
            self.server.ensure_postgres_running()
        assert self.server.get_uri() == self.url  # same socket directory: clients need no new address

    def connect(self):
        from eros.db import connect

        return connect(self.url)


@pytest.fixture
def own_pg(env):
    pg = OwnPostgres()
    env(DATABASE_URL=pg.url, OPENROUTER_API_KEY=None, VOYAGE_API_KEY=None, LLM_BASE_URL=None, EMBED_BASE_URL=None)
    try:
        yield pg
    finally:
        try:
            pg.start()  # cleanup stops it cleanly before deleting the directory
        except Exception:
            pass
        pg.server.cleanup()


class Client:
    """One user with one session, sending turns through the chat function's containers."""

    def __init__(self, function, user: str):
        self.function, self.user = function, user
        self.acknowledged: list[dict] = []  # 200 bodies, with the content sent
        self.answers: list[tuple[float, float, int, dict | None]] = []  # (started, took, status, body)
        status, body = self.call("POST", "/v1/sessions", {"persona_id": "luna"})
        assert status == 201 and body is not None, body
        self.session = body["id"]
        self.sent = 0

    def call(self, method: str, path: str, body=None) -> tuple[int, dict | None]:
        from eros_dev.server import http_api_event

        event = http_api_event(method, path, {"content-type": "application/json"},
                               json.dumps(body).encode() if body is not None else b"",
                               {"sub": self.user, "iss": "test", "aud": "test"})
        result = self.function.submit(event).result(timeout=30)
        text = result.get("body") or ""
        return result["statusCode"], (json.loads(text) if text else None)

    def turn(self) -> int:
        self.sent += 1
        content = f"{self.user} says hello number {self.sent}"
        started = time.monotonic()
        status, body = self.call("POST", f"/v1/sessions/{self.session}/turns",
                                 {"content": content, "client_turn_id": f"{self.user}-{self.sent}"})
        self.answers.append((started, time.monotonic() - started, status, body))
        if status == 200 and body is not None:
            self.acknowledged.append({**body, "content": content})
        return status

    def turns_until(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.turn()
            time.sleep(0.01)


def test_postgres_restarted_mid_traffic_clean_503_then_recovery_nothing_acknowledged_lost(own_pg):
    from eros_dev.lambda_runtime import Function

    function = Function("chat", concurrency=CLIENTS, timeout_secs=30)
    try:
        clients = [Client(function, f"restart-user-{i}") for i in range(CLIENTS)]
        for c in clients:
            assert c.turn() == 200  # warm: every container holds an open connection

        stop = threading.Event()
        with ThreadPoolExecutor(CLIENTS) as pool:
            running = [pool.submit(c.turns_until, stop) for c in clients]
            time.sleep(0.8)  # traffic flowing
            stopping = time.monotonic()
            own_pg.stop("immediate")
            down = time.monotonic()  # from here on nothing can reach the database
            time.sleep(1.5)  # traffic against the dead database
            stop.set()
            for r in running:
                r.result(timeout=60)

        during = [a for c in clients for a in c.answers if a[0] >= down]
        assert during, "no request was sent during the outage"
        for _started, took, status, body in [a for c in clients for a in c.answers]:
            assert status in (200, 503), (status, body)
            assert took < SLOW, f"a request took {took:.1f}s"
            if status == 503:
                assert body["code"] == "database_unavailable" and body["retryable"] is True, body
                assert body["message"], body
        for _started, _took, status, body in during:
            assert status == 503, (status, body)
        assert all(a[2] == 200 for c in clients for a in c.answers if a[0] + a[1] < stopping)

        own_pg.start()
        for c in clients:  # the same process and containers: broken connections are reopened
            for _ in range(3):
                status = c.turn()
                assert status == 200, c.answers[-1]
        assert function.containers <= CLIENTS
        status, body = clients[0].call("GET", "/v1/health")
        assert status == 200 and body["database"] == "ok", body
    finally:
        function.close()

    with own_pg.connect() as conn:
        for c in clients:
            assert c.acknowledged
            for ack in c.acknowledged:
                rows = {r["id"]: r for r in conn.execute(
                    "SELECT id, role, content, client_turn_id FROM engine.chat_messages WHERE id = ANY(%s)",
                    ([ack["user_message_id"], ack["assistant_message_id"]],)).fetchall()}
                user, assistant = rows.get(ack["user_message_id"]), rows.get(ack["assistant_message_id"])
                assert user is not None and assistant is not None, f"acknowledged turn lost: {ack}"
                assert (user["role"], user["content"], user["client_turn_id"]) == (
                    "user", ack["content"], ack["client_turn_id"])
                assert (assistant["role"], assistant["content"]) == ("assistant", ack["reply"])


# --- dreaming ---------------------------------------------------------------------------------------------------

ANSWER = json.dumps({"memories": [
    {"content": "Has a cat named Miso", "category": "relation", "importance": 0.5},
    {"content": "Likes mocha", "category": "preference", "importance": 0.2},
]})


def test_an_extraction_whose_database_stops_fails_unstamped_and_the_next_sweep_extracts_it(
        own_pg, env, fake_llm, fake_voyage, monkeypatch):
    from eros import clock, dreaming
    from eros.config import settings
    from eros_dev.lambda_runtime import LambdaContext, load_function

    env(LLM_BASE_URL=fake_llm.url, OPENROUTER_API_KEY="key", EMBED_BASE_URL=fake_voyage.url, VOYAGE_API_KEY="key",
        PROVIDER_MAX_RETRIES=0, DREAMING_IDLE_SECS=60, DREAMING_CLAIM_STALE_SECS=60, DREAMING_MAX_ATTEMPTS=5,
        DEEP_PASS_TICK_CAP=0)
    now = [datetime.now(UTC) + timedelta(hours=1)]  # the session below is idle
    monkeypatch.setattr(clock, "now", lambda: now[0])

    with own_pg.connect() as conn:
        inst = conn.execute("INSERT INTO engine.persona_instances (user_id, persona_id) VALUES ('dreamer', 'luna')"
                            " RETURNING id").fetchone()["id"]
        sid = conn.execute("INSERT INTO engine.chat_sessions (user_id, instance_id, last_active_at)"
                           " VALUES ('dreamer', %s, now()) RETURNING id", (inst,)).fetchone()["id"]
        for i, said in enumerate(["My cat Miso waited for me.", "I had a mocha this morning."]):
            for role, content in (("user", said), ("assistant", "I hear you.")):
                conn.execute("INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id)"
                             " SELECT id, user_id, %s, %s, %s FROM engine.chat_sessions WHERE id = %s",
                             (role, content, f"t{i}", sid))

    def stop_then_answer(body: dict) -> str:  # the database dies while the model is thinking
        own_pg.stop("immediate")
        return ANSWER

    fake_llm.responder = stop_then_answer
    extract = load_function("extract")
    sent: list[dict] = []
    assert dreaming.sweep(settings(), sent.append, now=lambda: now[0]).claimed == 1
    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        extract.lambda_handler(dict(sent[0]), LambdaContext("extract", timeout_secs=120))
    assert time.monotonic() - started < SLOW + 10  # the stop itself runs inside the model call
    assert isinstance(failure.value, psycopg.OperationalError), repr(failure.value)

    own_pg.start()
    fake_llm.responder = lambda body: ANSWER
    with own_pg.connect() as conn:
        row = conn.execute("SELECT extracted_at, extraction_gave_up AS gave_up FROM engine.chat_sessions"
                           " WHERE id = %s", (sid,)).fetchone()
        assert row["extracted_at"] is None and not row["gave_up"], row
        assert conn.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == 0

    now[0] += timedelta(seconds=120)  # the dead delivery's claim goes stale
    sent.clear()
    assert dreaming.sweep(settings(), sent.append, now=lambda: now[0]).claimed == 1
    outcome = extract.lambda_handler(dict(sent[0]), LambdaContext("extract", timeout_secs=120))
    assert outcome["outcome"] == "extracted", outcome
    with own_pg.connect() as conn:
        row = conn.execute("SELECT extracted_at, extraction_gave_up AS gave_up FROM engine.chat_sessions"
                           " WHERE id = %s", (sid,)).fetchone()
        assert row["extracted_at"] is not None and not row["gave_up"], row
        contents = sorted(r["content"] for r in conn.execute(
            "SELECT content FROM engine.companion_memories WHERE session_id = %s", (sid,)).fetchall())
        assert contents == ["Has a cat named Miso", "Likes mocha"], contents
