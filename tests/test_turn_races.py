"""Concurrent turns that share a client_turn_id (issue 8, item 4), through the real chat handler.

Each sender is its own Lambda container: a forked process with its own copy of the handler and its own
database connection, as concurrent requests are in AWS. (Threads in one process would not do: the
Powertools resolver keeps the request it is handling in class-level state, so two loaded copies of
functions/chat/app.py in one process still share it; that is issue 8 item 1, for the local stack.) The
fake OpenRouter answers slowly enough that every sender of a round is inside its turn at once, and it
echoes the message it was asked about, so a reply says whose message it answers.

What must hold, every round: the turn id is claimed by exactly one message. Its senders get 200 with a
reply to that message (one model call, the others replay it); a sender of any other message gets 409,
before any model call, and is never told its message was taken. The stored turn is the winner's message
and reply, once.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import warnings
from collections import Counter

import pytest
from apiclient import Api
from fakes import FakeOpenRouter, Status

pytestmark = pytest.mark.e2e

SENDERS = 12
ROUNDS = 4

_inherited: list = []  # what a container must never close: its parent's connections


def _container(pipe, start) -> None:
    """A Lambda container: handles the turns its pipe sends, each after all containers are ready."""
    try:
        from eros import db, providers

        _inherited.append(db._local)  # closing the parent's connection from here would end its session
        db._local = threading.local()
        providers.reset()
        api = Api()
        while (job := pipe.recv()) is not None:
            try:
                start.wait(30)
                pipe.send(api.call("POST", *job))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                pipe.send((None, repr(exc)))
    finally:
        os._exit(0)


class Containers:
    def __init__(self, n: int):
        context = multiprocessing.get_context("fork")
        self.start = context.Barrier(n)
        self.pipes, self.processes = [], []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child uses none of them
            for _ in range(n):
                parent, child = context.Pipe()
                process = context.Process(target=_container, args=(child, self.start), daemon=True)
                process.start()
                self.pipes.append(parent)
                self.processes.append(process)

    def send_at_once(self, session: str, bodies: list[dict]) -> list[tuple[int, dict]]:
        """Send every body at once, one per container; the answers in the order of the bodies."""
        assert len(bodies) == len(self.pipes)
        for pipe, body in zip(self.pipes, bodies, strict=True):
            pipe.send((f"/v1/sessions/{session}/turns", body))
        results = []
        for pipe in self.pipes:
            assert pipe.poll(60), "a container did not answer"
            results.append(pipe.recv())
        assert all(status is not None for status, _ in results), results
        return results

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()


def echo_slowly(request: dict) -> str:
    time.sleep(0.1)
    return "reply to: " + request["messages"][-1]["content"]


@pytest.fixture
def llm():
    server = FakeOpenRouter(echo_slowly)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def setup(db, env, llm, fake_voyage):
    env(LLM_BASE_URL=llm.url, OPENROUTER_API_KEY="x", EMBED_BASE_URL=fake_voyage.url, VOYAGE_API_KEY="x",
        PROVIDER_MAX_RETRIES=0)
    api = Api()
    session = api.session()
    containers = Containers(SENDERS)
    try:
        yield db, llm, api, containers, session
    finally:
        containers.close()


def stored_turn(db, session: str, turn_id: str) -> dict[str, dict]:
    rows = db.execute("SELECT id, role, content FROM engine.chat_messages"
                      " WHERE session_id = %s AND client_turn_id = %s", (session, turn_id)).fetchall()
    assert len(rows) == len({r["role"] for r in rows}), rows
    return {r["role"]: r for r in rows}


def check_round(db, session: str, turn_id: str, bodies: list[dict], results: list[tuple[int, dict]]) -> str:
    """The invariants of one round; returns the winning content."""
    statuses = Counter(status for status, _ in results)
    assert set(statuses) <= {200, 409}, results
    winners = {bodies[i]["content"] for i, (status, _) in enumerate(results) if status == 200}
    assert len(winners) == 1, f"more than one message won turn {turn_id}: {winners}"
    (won,) = winners
    turn = stored_turn(db, session, turn_id)
    assert turn["user"]["content"] == won and turn["assistant"]["content"] == "reply to: " + won
    answers = set()
    for body, (status, answer) in zip(bodies, results, strict=True):
        if body["content"] == won:
            assert status == 200, answer
            assert answer["reply"] == "reply to: " + won
            answers.add((answer["user_message_id"], answer["assistant_message_id"]))
        else:
            assert status == 409, answer
            assert "client_turn_id" in answer["message"] and "reply" not in answer
    assert answers == {(turn["user"]["id"], turn["assistant"]["id"])}
    return won


def test_different_messages_racing_for_one_turn_id_one_wins_the_rest_409(setup):
    db, llm, api, containers, session = setup
    for round_ in range(ROUNDS):
        turn_id = f"turn-{round_}"
        bodies = [{"content": f"message {i} of round {round_}", "client_turn_id": turn_id} for i in range(SENDERS)]
        calls = llm.calls
        results = containers.send_at_once(session, bodies)
        check_round(db, session, turn_id, bodies, results)
        assert llm.calls - calls == 1, "a losing sender paid for a model call"
    # Each round left one turn and one relationship-layer utterance: nothing duplicated, nothing lost.
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 2 * ROUNDS
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == ROUNDS


def test_the_same_message_sent_at_once_is_one_turn_everyone_gets_its_reply(setup):
    db, llm, api, containers, session = setup
    for round_ in range(ROUNDS):
        turn_id = f"same-{round_}"
        bodies = [{"content": f"hello, round {round_}", "client_turn_id": turn_id}] * SENDERS
        results = containers.send_at_once(session, bodies)
        check_round(db, session, turn_id, bodies, results)
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 2 * ROUNDS
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == ROUNDS


def test_two_messages_each_sent_by_half_the_senders(setup):
    db, llm, api, containers, session = setup
    for round_ in range(ROUNDS):
        turn_id = f"mixed-{round_}"
        bodies = [{"content": f"{'left' if i % 2 else 'right'} {round_}", "client_turn_id": turn_id}
                  for i in range(SENDERS)]
        results = containers.send_at_once(session, bodies)
        check_round(db, session, turn_id, bodies, results)


def test_while_the_model_is_down_only_the_message_that_was_kept_is_told_so(setup):
    """A failed turn says "your message was kept": that may only be said to the sender whose message was."""
    db, llm, api, containers, session = setup
    llm.push(*[Status(503)] * SENDERS)
    turn_id = "down-1"
    bodies = [{"content": f"message {i} while down", "client_turn_id": turn_id} for i in range(SENDERS)]
    results = containers.send_at_once(session, bodies)
    kept = [bodies[i]["content"] for i, (status, _) in enumerate(results) if status == 503]
    assert Counter(status for status, _ in results) == {503: 1, 409: SENDERS - 1}, results
    turn = stored_turn(db, session, turn_id)
    assert set(turn) == {"user"} and turn["user"]["content"] == kept[0]
    # The kept message's retry gets its reply; the others' are still refused.
    llm.reset()
    status, answer = api.call("POST", f"/v1/sessions/{session}/turns", {"content": kept[0], "client_turn_id": turn_id})
    assert status == 200 and answer["reply"] == "reply to: " + kept[0]
    other = next(b for b in bodies if b["content"] != kept[0])
    assert api.call("POST", f"/v1/sessions/{session}/turns", other)[0] == 409
