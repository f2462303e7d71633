"""GET /v1/export: the caller's whole record as one JSON document, written where they can fetch it (S3 in
AWS, moto here; a folder the local stack serves), in bounded memory, and gone with DELETE /v1/me."""

from __future__ import annotations

import json
import tracemalloc

import httpx
import pytest
from apiclient import Api
from pgvector import Vector

from eros import account
from eros.providers.offline import hash_embed

BUCKET = "eros-exports-test"


@pytest.fixture
def folder(env, tmp_path):
    env(EXPORT_DIR=str(tmp_path), EXPORT_BASE_URL="http://127.0.0.1:9/local")
    return tmp_path


def a_record(db, api: Api, user: str) -> dict:
    sid = api.session(user=user)
    for text in ("I moved to Porto", "My cat is called Miso"):
        assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": text}, user=user)[0] == 200
    new = db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, source)"
                     " VALUES (%s, 'Lives in Porto', %s, 'fact', 'dreaming') RETURNING id",
                     (user, Vector(hash_embed("Lives in Porto")))).fetchone()["id"]
    db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, source, superseded_at,"
               " superseded_by, superseded_reason) VALUES (%s, 'Lives in Lisbon', %s, 'fact', 'dreaming', now(), %s,"
               " 'changed')", (user, Vector(hash_embed("Lives in Lisbon")), new))
    db.execute("INSERT INTO engine.user_usage (user_id, day, tokens, chat_tokens) VALUES (%s, current_date, 42, 42)"
               " ON CONFLICT (user_id, day) DO NOTHING", (user,))
    return {"session": sid, "memory": str(new)}


def local_file(folder, url: str):
    return folder / url.split("/local/", 1)[1]


def test_an_export_to_the_local_folder_is_the_whole_record_and_nobody_elses(db, folder):
    api = Api()
    mine = a_record(db, api, "alice")
    a_record(db, api, "bob")
    status, link = api.call("GET", "/v1/export")
    assert status == 200 and link["url"].startswith("http://127.0.0.1:9/local/exports/") and link["bytes"] > 0
    document = json.loads(local_file(folder, link["url"]).read_text())
    assert document["user_id"] == "alice" and document["exported_at"]
    [session] = document["sessions"]
    assert session["id"] == mine["session"] and session["persona_id"] == "luna"
    assert [m["content"] for m in session["messages"]][::2] == ["I moved to Porto", "My cat is called Miso"]
    assert [m["role"] for m in session["messages"]] == ["user", "assistant", "user", "assistant"]
    contents = {m["content"] for m in document["memories"]}
    assert {"Lives in Porto", "Lives in Lisbon", "I moved to Porto", "My cat is called Miso"} <= contents
    lisbon = next(m for m in document["memories"] if m["content"] == "Lives in Lisbon")
    assert (lisbon["superseded_by"], lisbon["superseded_reason"]) == (mine["memory"], "changed")
    assert all("embedding" not in m for m in document["memories"])
    assert document["usage"][0]["tokens"] >= 42
    # Each of the two turns: one reply and one query embedding, by purpose and model (the offline stand-ins).
    assert {(u["purpose"], u["model"], u["calls"]) for u in document["usage_by_model"]} == {
        ("chat", "offline/echo", 2), ("chat", "offline/lexical-hash-512", 2)}
    assert "bob" not in json.dumps(document)
    assert local_file(folder, link["url"]).stat().st_size == link["bytes"]


def test_an_export_without_a_place_to_write_it_is_a_clear_503_and_without_a_token_a_401(db, env):
    api = Api()
    env(EXPORT_BUCKET="", EXPORT_DIR="")
    status, body = api.call("GET", "/v1/export")
    assert status == 503 and body["code"] == "exports_unavailable" and "EXPORT_BUCKET" in body["message"]
    assert api.call("GET", "/v1/export", user=None)[0] == 401


def test_a_large_export_is_written_in_bounded_memory(db, folder, monkeypatch):
    """The document is never held whole: what the export allocates at most is a page of rows and a chunk,
    whatever the size. 25,000 messages (~7.7 MB) here, under tracemalloc (which slows Python a lot); at
    100,000 messages (30.7 MB) the peak measured 1.40 MB."""
    api = Api()
    sid = api.session()
    db.execute("INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id)"
               " SELECT s.id, s.user_id, CASE WHEN g %% 2 = 0 THEN 'user' ELSE 'assistant' END,"
               "        'message ' || g || ' ' || repeat('of some length ', 12), 't' || (g / 2)"
               " FROM engine.chat_sessions s, generate_series(1, 25000) AS g WHERE s.id = %s", (sid,))
    tracemalloc.start()
    try:
        link = account.export("alice")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = local_file(folder, link.url).stat().st_size
    assert size > 7_000_000
    assert peak < 3_000_000, f"peak {peak / 1e6:.1f} MB of Python allocations for a {size / 1e6:.1f} MB export"
    document = json.loads(local_file(folder, link.url).read_text())
    assert len(document["sessions"][0]["messages"]) == 25000


def test_the_local_stack_serves_the_export_and_nothing_else_under_its_path(db, env, tmp_path, local_server):
    env(EXPORT_DIR=str(tmp_path), EXPORT_BASE_URL=f"{local_server.url}/local")
    alice = local_server.client("alice")
    link = alice.get("/v1/export").json()
    fetched = httpx.get(link["url"])  # no token: the random name is the capability, as a presigned URL is
    assert fetched.status_code == 200 and fetched.json()["user_id"] == "alice"
    assert fetched.headers["content-disposition"].startswith("attachment")
    for probe in ("/local/exports/x.json", link["url"].replace(".json", ".txt"), "/local/jwt-secret",
                  "/local/exports/%2e%2e/%2e%2e/jwt-secret"):
        assert httpx.get(local_server.url + probe if probe.startswith("/") else probe).status_code == 404, probe
    assert httpx.get(local_server.url + "/local/exports/../../etc/passwd").status_code != 200


@pytest.fixture
def s3(env, monkeypatch):
    from moto import mock_aws

    with mock_aws():
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        env(EXPORT_BUCKET=BUCKET, EXPORT_DIR="")
        yield boto3.client("s3")


def test_an_export_to_s3_is_presigned_encrypted_named_for_no_one_and_multipart_when_large(db, s3, monkeypatch):
    api = Api()
    a_record(db, api, "alice")
    status, link = api.call("GET", "/v1/export")
    assert status == 200 and "X-Amz-Signature=" in link["url"] and "X-Amz-Expires=900" in link["url"]
    [item] = s3.list_objects_v2(Bucket=BUCKET)["Contents"]
    assert item["Key"].startswith(f"exports/{account.owner('alice')}/") and "alice" not in item["Key"]
    body = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
    assert json.loads(body)["user_id"] == "alice" and len(body) == link["bytes"]

    # Large: in parts as it is produced (S3's parts are at least 5 MB but the last).
    monkeypatch.setattr(account, "PART_BYTES", 5 * 1024 * 1024)
    sid = api.session()
    db.execute("INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id)"
               " SELECT s.id, s.user_id, 'user', repeat('x', 600), 'bulk' || g"
               " FROM engine.chat_sessions s, generate_series(1, 20000) AS g WHERE s.id = %s", (sid,))
    parts = []
    real = account._part
    monkeypatch.setattr(account, "_part", lambda *a: parts.append(a[4]) or real(*a))
    link = api.call("GET", "/v1/export")[1]
    assert len(parts) >= 2
    newest = max(s3.list_objects_v2(Bucket=BUCKET)["Contents"], key=lambda o: o["LastModified"])
    assert json.loads(s3.get_object(Bucket=BUCKET, Key=newest["Key"])["Body"].read())["user_id"] == "alice"

    # Erasure takes the exports with the rows.
    status, erased = api.call("DELETE", "/v1/me")
    assert status == 200 and erased["erased"]["exports"] == 2
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET)


def test_erasure_deletes_the_local_exports_too(db, folder):
    api = Api()
    a_record(db, api, "alice")
    link = api.call("GET", "/v1/export")[1]
    assert api.call("DELETE", "/v1/me")[1]["erased"]["exports"] == 1
    assert not local_file(folder, link["url"]).exists()
