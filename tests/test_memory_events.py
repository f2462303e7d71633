"""Memory events (issue 32, migration 0035, sql/functions/events.sql, eros.events): every change of a user's memory
is an event, written by the change's own transaction (an outbox) and published by the sweep in order; ids and
metadata only unless the deployment opts into text; at least once to a subscriber, nothing missing after a kill -9
of the publisher."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import boto3
import psycopg
import pytest
from apiclient import Api
from moto import mock_aws
from test_consolidation import dream

from eros import events
from eros.config import settings


def outbox(db, user: str = "alice") -> list[dict]:
    return db.execute("SELECT id, seq, type, memory_id, session_id, detail FROM engine.memory_events"
                      " WHERE user_id = %s ORDER BY id", (user,)).fetchall()


def a_scripted_day(db) -> dict:
    """What happens to a user's memory in a day, through the engine's own paths (the offline stand-in dreams)."""
    api = Api()
    dream(db, "I live in Shanghai and I'm a nurse.")
    dream(db, "I moved to Tokyo.")
    rows = {r["content"]: r["id"] for r in db.execute(
        "SELECT id, content FROM engine.companion_memories WHERE user_id = 'alice' AND instance_id IS NULL"
        " AND category IS NOT NULL").fetchall()}
    nurse, shanghai = rows["Works as a nurse"], rows["Lives in Shanghai"]
    status, edited = api.call("PATCH", f"/v1/memories/{nurse}", {"content": "Works as a night-shift nurse"})
    assert status == 200, edited
    status, added = api.call("POST", "/v1/memories", {"content": "Has a cat named Miso", "category": "relation"})
    assert status in (200, 201), added
    assert api.call("DELETE", f"/v1/memories/{added['id']}")[0] in (200, 204)
    status, restored = api.call("POST", f"/v1/memories/{shanghai}/restore")
    assert status == 200, restored
    return {"nurse": nurse, "shanghai": shanghai, "edited": edited["id"], "added": added["id"]}


@pytest.mark.integration
def test_every_change_of_a_day_is_one_event_in_the_users_order_with_no_text(db):
    day = a_scripted_day(db)
    got = outbox(db)
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))  # 1, 2, 3...: no gap, in id order
    types = [e["type"] for e in got]
    assert types.count("session.extracted") == 2
    by_memory = [(e["type"], str(e["memory_id"])) for e in got if e["memory_id"]]
    day = {k: str(v) for k, v in day.items()}
    assert ("memory.edited", day["nurse"]) in by_memory and ("memory.created", day["edited"]) in by_memory
    assert ("memory.created", day["added"]) in by_memory and ("memory.deleted", day["added"]) in by_memory
    assert ("memory.superseded", day["shanghai"]) in by_memory and ("memory.restored", day["shanghai"]) in by_memory
    assert by_memory.index(("memory.superseded", day["shanghai"])) < by_memory.index(("memory.restored",
                                                                                      day["shanghai"]))
    edited = next(e for e in got if e["type"] == "memory.edited")
    assert edited["detail"]["superseded_by"] == str(day["edited"]) and edited["detail"]["reason"] == "edited"
    text = json.dumps([dict(e, id=None, memory_id=None, session_id=None) for e in got], default=str)
    for said in ("Shanghai", "nurse", "Tokyo", "Miso"):
        assert said not in text  # ids and metadata only
    # Each change once: a created event per profile row and episode, nothing for the relationship layer's utterances.
    profile_rows = db.execute("SELECT count(*) AS n FROM engine.companion_memories WHERE user_id = 'alice'"
                              " AND (instance_id IS NULL OR source = 'episode')").fetchone()["n"]
    assert types.count("memory.created") == profile_rows + 1  # the deleted one too


@pytest.mark.integration
def test_chat_turns_alone_write_no_event(db):
    api = Api()
    sid = api.session()
    for text in ("hello", "I live in Lisbon", "bye"):
        assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": text})[0] == 200
    assert outbox(db) == []


@pytest.mark.integration
def test_published_events_are_the_documented_envelope_and_leave_the_outbox(db, tmp_path, env):
    a_scripted_day(db)
    pending = outbox(db)
    log = tmp_path / "events.jsonl"
    env(EVENTS_LOG=str(log))
    assert events.publish_pending(settings()) == len(pending)
    assert outbox(db) == []
    published = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["id"] for e in published] == [str(e["id"]) for e in pending]
    first = published[0]
    assert first["schema"] == "eros.memory-event/1" and first["user_id"] == "alice" and first["seq"] == 1
    assert set(first) == {"schema", "id", "type", "app", "user_id", "seq", "occurred_at", "memory_id", "session_id",
                          "detail"}
    assert events.publish_pending(settings()) == 0  # nothing twice


@pytest.mark.integration
def test_text_only_when_the_deployment_opts_in(db, tmp_path, env):
    a_scripted_day(db)
    log = tmp_path / "events.jsonl"
    env(EVENTS_LOG=str(log), EVENTS_INCLUDE_TEXT="true")
    events.publish_pending(settings())
    published = [json.loads(line) for line in log.read_text().splitlines()]
    texts = {e.get("content") for e in published if e["type"] == "memory.created"}
    assert "Works as a night-shift nurse" in texts and "Moved to Tokyo" in texts
    deleted = [e for e in published if e["type"] == "memory.deleted"]
    assert deleted and "content" not in deleted[0]  # gone before it was published: no text to give


@pytest.mark.integration
def test_an_erasure_drops_the_users_pending_events_and_says_so_once(db, tmp_path, env):
    a_scripted_day(db)
    api = Api()
    status, body = api.call("DELETE", "/v1/me")
    assert status == 200 and body["erased"]["events"] > 0
    assert [e["type"] for e in outbox(db)] == ["user.erased"]
    assert api.call("DELETE", "/v1/me")[1]["erased"]["events"] == 0  # its one event is not erased again


@pytest.mark.integration
@mock_aws
def test_published_to_an_eventbridge_bus_a_rule_delivers_them(db, env):
    env(AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    bus = boto3.client("events").create_event_bus(Name="eros-memory")["EventBusArn"]
    sqs = boto3.client("sqs")
    queue = sqs.create_queue(QueueName="subscriber")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    client = boto3.client("events")
    client.put_rule(Name="all-memory", EventBusName="eros-memory", EventPattern=json.dumps({"source": ["eros.memory"]}))
    client.put_targets(Rule="all-memory", EventBusName="eros-memory", Targets=[{"Id": "q", "Arn": arn}])
    a_scripted_day(db)
    pending = outbox(db)
    env(EVENT_BUS_NAME="eros-memory")
    assert bus and events.publish_pending(settings()) == len(pending)
    got = []
    while batch := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages"):
        got += [json.loads(m["Body"]) for m in batch]
        sqs.delete_message_batch(QueueUrl=queue, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                                          for i, m in enumerate(batch)])
    assert sorted(int(m["detail"]["id"]) for m in got) == [e["id"] for e in pending]
    assert {m["source"] for m in got} == {"eros.memory"} and {m["detail-type"] for m in got} == {
        e["type"] for e in pending}


@pytest.mark.integration
def test_a_users_events_are_numbered_in_the_order_their_changes_commit(db, database_url):
    """A second change of the user that began while the first held the user's counter numbers after all of the
    first's events, and its id does too (the drainer reads by id)."""
    first = psycopg.connect(database_url)
    first.execute("SELECT engine.record_event('alice', 'memory.created', NULL, NULL, '{}')")

    def second():
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("SELECT engine.record_event('alice', 'memory.deleted', NULL, NULL, '{}')")

    waiting = threading.Thread(target=second)
    waiting.start()
    time.sleep(0.3)  # the second waits for the counter the first holds
    first.execute("SELECT engine.record_event('alice', 'memory.edited', NULL, NULL, '{}')")
    first.commit()
    first.close()
    waiting.join(10)
    got = outbox(db)
    assert [(e["seq"], e["type"]) for e in got] == [(1, "memory.created"), (2, "memory.edited"),
                                                    (3, "memory.deleted")]


KILLED_PUBLISHER = """
import sys, time
from eros import events
from eros.config import settings

class SlowToCommit(events.LogPublisher):
    def publish(self, batch):
        accepted = super().publish(batch)
        print("published", flush=True)
        time.sleep(60)  # killed here: published, not yet removed from the outbox
        return accepted

events.publish_pending(settings(), SlowToCommit(sys.argv[1]))
"""


@pytest.mark.e2e
def test_a_publisher_killed_between_publishing_and_its_commit_loses_nothing(db, database_url, tmp_path, env):
    a_scripted_day(db)
    pending = [e["id"] for e in outbox(db)]
    log = tmp_path / "events.jsonl"
    script = tmp_path / "publish.py"
    script.write_text(KILLED_PUBLISHER)
    child = subprocess.Popen([sys.executable, str(script), str(log)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "DATABASE_URL": database_url, "EVENTS_PER_TICK": "5"})
    assert child.stdout.readline().strip() == "published"
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    assert [e["id"] for e in outbox(db)] == pending  # its transaction died with it: nothing removed
    env(EVENTS_LOG=str(log))
    while events.publish_pending(settings()):
        pass
    ids = [int(json.loads(line)["id"]) for line in log.read_text().splitlines()]
    assert sorted(set(ids)) == pending  # nothing missing
    assert len(ids) == len(pending) + 5  # the killed batch twice: at least once; a subscriber dedupes by id
    assert outbox(db) == []


@pytest.mark.integration
def test_the_local_stacks_sweep_publishes_them_and_eros_events_shows_each_once(db, tmp_path, env, capsys):
    from eros_dev import cli
    from eros_dev.dreaming import sweep_locally

    log = tmp_path / "events.jsonl"
    env(EVENTS_LOG=str(log))
    api = Api()
    sid = api.session()
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I live in Lisbon and I'm a nurse."})[0] == 200
    assert sweep_locally(idle_now=True)["events_published"] == 4  # its two memories, its episode, the session
    assert outbox(db) == []
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines + lines[:1]) + "\n")  # a batch published twice (a killed sweep)
    capsys.readouterr()
    assert cli.main(["events"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 4 and [line.split()[3] for line in shown] == ["memory.created"] * 3 + ["session.extracted"]
    assert all(" alice #" in line for line in shown)
    assert cli.main(["events", "--user", "bob"]) == 0 and capsys.readouterr().out == ""
    assert cli.main(["events", "--json"]) == 0
    assert [json.loads(line)["seq"] for line in capsys.readouterr().out.splitlines()] == [1, 2, 3, 4]


def test_eros_events_filters_by_app_and_names_a_user_of_another_app(tmp_path, env, capsys):
    """Events name the app and the user as their app knows them: `--app` is one app's, `--user` a user of `--app`
    (of the first app without it), and a line names the app of a user who is not the first app's."""
    from eros_dev import cli

    def logged(seq: int, app: str | None, user: str) -> dict:
        event = {"schema": "eros.memory.v1", "id": str(seq), "type": "memory.created", "user_id": user, "seq": seq,
                 "occurred_at": "2026-12-04T10:00:00+00:00", "memory_id": f"m{seq}", "session_id": None,
                 "detail": {"category": "fact"}}
        return event | ({"app": app} if app else {})  # a line logged before apps has no app: the first app's

    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in (
        logged(1, "default", "alice"), logged(2, "acme", "alice"), logged(3, "acme", "bob"), logged(4, None, "alice"))))
    env(EVENTS_LOG=str(log))

    def shown(*flags: str) -> list[str]:
        capsys.readouterr()
        assert cli.main(["events", *flags]) == 0
        return capsys.readouterr().out.splitlines()

    everyone = shown()
    assert [line.split()[1:3] for line in everyone] == [["alice", "#1"], ["alice@acme", "#2"], ["bob@acme", "#3"],
                                                        ["alice", "#4"]]
    assert [line.split()[2] for line in shown("--app", "acme")] == ["#2", "#3"]
    assert [line.split()[2] for line in shown("--user", "alice")] == ["#1", "#4"]  # the first app's alice
    assert [line.split()[2] for line in shown("--user", "alice", "--app", "acme")] == ["#2"]
    assert [line.split()[2] for line in shown("--user", "alice", "--app", "default")] == ["#1", "#4"]
    assert [json.loads(line)["seq"] for line in shown("--app", "acme", "--user", "bob", "--json")] == [3]
    assert shown("--app", "globex") == []
    assert cli.main(["events", "--app", "Not An App"]) == 2
    assert capsys.readouterr().err.startswith("eros events: --app 'Not An App' is not an app id")


@pytest.mark.integration
def test_the_local_events_route_shows_the_signed_in_user_their_own_events_only(db, local_server, env, tmp_path):
    env(EVENTS_LOG=str(tmp_path / "events.jsonl"))  # this test's alone (the run's file has other tests' alice)
    alice, bob = local_server.client("alice"), local_server.client("bob")
    sid = alice.post("/v1/sessions", json={"persona_id": "luna"}).json()["id"]
    assert alice.post(f"/v1/sessions/{sid}/turns", json={"content": "I live in Lisbon."}).status_code == 200
    assert alice.post("/local/sweep", json={"idle_now": True}).status_code == 200
    mine = alice.get("/local/events").json()["events"]
    assert mine and {e["user_id"] for e in mine} == {"alice"}
    assert [e["seq"] for e in mine] == sorted(e["seq"] for e in mine)
    assert bob.get("/local/events").json() == {"events": []}
    assert local_server.client(None).get("/local/events").status_code == 401
    alice.close()
    bob.close()


@pytest.mark.integration
def test_a_bulk_load_that_turns_events_off_writes_none_and_the_engine_never_does(db, database_url):
    with psycopg.connect(database_url, autocommit=True) as loader:
        loader.execute("SET eros.events = 'off'")
        loader.execute("INSERT INTO engine.companion_memories (user_id, content, category, embedding, source)"
                       " SELECT 'u' || i, 'seeded', 'fact', array_fill(0.1, ARRAY[512])::vector, 'dreaming'"
                       " FROM generate_series(1, 50) i")
    assert db.execute("SELECT count(*) AS n FROM engine.memory_events").fetchone()["n"] == 0
    dream(db, "I live in Lisbon.")  # the engine's own connection: events as ever
    assert [e["type"] for e in outbox(db)][-1] == "session.extracted"
