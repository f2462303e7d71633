"""The local stack under concurrent clients is as isolated as Lambda (one request per container at a time):
every response belongs to its caller, per-invocation log keys and metrics stay with their invocation."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

USERS = 16
ROUNDS = 50  # x 3 requests per round per user: 2,400 requests


@pytest.fixture
def busy_threads():
    """Switch threads far more often than the default 5 ms, so that a race on shared state shows in
    thousands of requests instead of once in ~7,400 (what the review hit)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(before)


def test_every_response_belongs_to_its_caller(db, local_server, busy_threads):
    start = threading.Barrier(USERS)

    def user(n: int) -> list[str]:
        name = f"user-{n:02d}"
        problems: list[str] = []
        with local_server.client(name) as client:
            created = client.post("/v1/sessions", json={"persona_id": "luna"})
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            start.wait()
            for i in range(ROUNDS):
                text = f"{name} says {i}"
                turn = client.post(f"/v1/sessions/{sid}/turns", json={"content": text})
                if turn.status_code != 200 or text not in turn.json().get("reply", ""):
                    problems.append(f"{name} turn {i}: {turn.status_code} {turn.text[:200]}")
                listing = client.get("/v1/memories", params={"layer": "relationship", "limit": 500})
                if listing.status_code != 200:
                    problems.append(f"{name} memories: {listing.status_code} {listing.text[:200]}")
                else:
                    contents = [m["content"] for m in listing.json().get("memories", [{"content": listing.text[:300]}])]
                    if len(contents) != i + 1 or not all(c.startswith(f"{name} says ") for c in contents):
                        problems.append(f"{name} memories after {i + 1} turns: {contents[:3]}")
                sessions = client.get("/v1/sessions")
                if sessions.status_code != 200 or [s["id"] for s in sessions.json().get("sessions", ())] != [sid]:
                    problems.append(f"{name} sessions: {sessions.status_code} {sessions.text[:200]}")
        return problems

    with ThreadPoolExecutor(USERS) as pool:
        problems = [p for found in pool.map(user, range(USERS)) for p in found]
    assert problems == [], f"{len(problems)} of {USERS * ROUNDS * 3} responses were not their caller's: {problems[:5]}"
    rows = db.execute("SELECT s.user_id, m.content FROM engine.chat_messages m"
                      " JOIN engine.chat_sessions s ON s.id = m.session_id WHERE m.role = 'user'").fetchall()
    assert len(rows) == USERS * ROUNDS
    assert all(r["content"].startswith(f"{r['user_id']} says ") for r in rows)
