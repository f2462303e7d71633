"""An app's API keys (migration 0036, eros.apps): its operator makes, lists, rotates and revokes them through
/v1/operator/keys (a JWT with the operator scope and the app's claim, or one of the app's keys), and the app's
servers use them on the /server routes, naming the user in X-Eros-User. Only a key's SHA-256 is kept; a revoked or
rotated-away key, or a key of a deleted app, is refused on the very next request; no app sees another's keys."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, date, datetime

import jwt
import pytest
from apiclient import Api

from eros import apps
from eros_client import AsyncClient, Client, Unauthorized

OPERATOR = "chat eros/operator"


@pytest.fixture
def api(db):
    return Api()


def make_app(db, app: str, name: str | None = None) -> None:
    """An app, as `eros apps` makes one: a row of engine.apps written with the migration credentials."""
    db.execute("INSERT INTO engine.apps (id, name) VALUES (%s, %s)", (app, name or app.title()))


def operator(api: Api, method: str, path: str, body=None, *, app: str = "acme", **kwargs):
    """A request with the app's operator's token (the operator scope, the app's claim)."""
    return api.call(method, path, body, user="ops", scope=OPERATOR, app=app, **kwargs)


def keyed(api: Api, key: str | None, method: str, path: str, body=None, *, user: str | None = None, **kwargs):
    """A request of an app's server: /server + path, its key in X-Api-Key, the user (if any) in X-Eros-User."""
    headers = {**({"x-api-key": key} if key is not None else {}), **({"x-eros-user": user} if user is not None else {})}
    return api.call(method, "/server" + path, body, user=None, headers=headers, **kwargs)


def new_key(api: Api, name: str = "web", *, app: str = "acme") -> dict:
    status, made = operator(api, "POST", "/v1/operator/keys", {"name": name}, app=app)
    assert status == 201, made
    return made


def listed(api: Api, *, app: str = "acme") -> list[dict]:
    status, answer = operator(api, "GET", "/v1/operator/keys", app=app)
    assert status == 200, answer
    return answer["keys"]


def refused(answer: tuple[int, dict | None]) -> None:
    status, body = answer
    assert status == 401 and body is not None and body["code"] == "unauthorized", answer


PERSONA = {"name": "Nova", "system_prompt": "You are Nova, a patient tutor."}


def give_persona(db, app: str, persona: str) -> None:
    """One persona of the app's own (an app starts with none: the shipped ones are the first app's)."""
    from eros.store import personas as persona_store

    persona_store.keep_app(app, persona, PERSONA["name"], "", PERSONA["system_prompt"])


@pytest.fixture
def acme(db):
    make_app(db, "acme")
    give_persona(db, "acme", "nova")
    return "acme"


def test_a_key_is_shown_once_kept_as_its_hash_and_works_on_the_server_routes(api, db, acme):
    made = new_key(api)
    secret = made["secret"]
    assert apps.KEY_PATTERN.fullmatch(secret) and made["prefix"] == secret[:apps.KEY_SHOWN]
    assert made["name"] == "web" and made["revoked_at"] is None and made["last_used_at"] is None
    assert set(made) == {"id", "name", "prefix", "created_at", "last_used_at", "revoked_at", "replaced_by", "secret"}

    # Only its SHA-256 is stored: no column of its row holds the key.
    row = db.execute("SELECT * FROM engine.app_keys WHERE id = %s", (made["id"],)).fetchone()
    assert bytes(row["secret_sha256"]) == hashlib.sha256(secret.encode()).digest()
    assert all(secret not in str(value) for value in row.values()), row
    assert db.execute("SELECT count(*) AS n FROM engine.app_keys WHERE secret_sha256 = %s OR prefix = %s"
                      " OR name = %s", (secret.encode(), secret, secret)).fetchone()["n"] == 0

    # The listing never shows a secret, nor its hash.
    keys = listed(api)
    assert [k["id"] for k in keys] == [made["id"]] and "secret" not in keys[0] and secret not in json.dumps(keys)
    assert keys[0]["last_used_at"] is None

    # The app's server, acting for one of the app's users: the user key is the app's.
    status, personas = keyed(api, secret, "GET", "/v1/personas", user="alice")
    assert status == 200 and [p["id"] for p in personas["personas"]] == ["nova"], personas
    status, session = keyed(api, secret, "POST", "/v1/sessions", {"persona_id": "nova"}, user="alice")
    assert status == 201, session
    owner = db.execute("SELECT user_id FROM engine.chat_sessions WHERE id = %s", (session["id"],)).fetchone()
    assert owner["user_id"] == apps.user_key("acme", "alice") == "acme\x1falice"
    # The default app's alice does not see it.
    assert api.call("GET", "/v1/sessions", user="alice")[1]["sessions"] == []
    assert [s["id"] for s in keyed(api, secret, "GET", "/v1/sessions", user="alice")[1]["sessions"]] == [session["id"]]
    # Its use is recorded.
    assert listed(api)[0]["last_used_at"] is not None

    # Without X-Eros-User the server is the app's operator.
    status, app = keyed(api, secret, "GET", "/v1/operator/app")
    assert status == 200 and app["id"] == "acme" and app["name"] == "Acme" and app["settings"]["chat_model"] is None
    assert [k["id"] for k in keyed(api, secret, "GET", "/v1/operator/keys")[1]["keys"]] == [made["id"]]
    # A route for one user, with no user named: a 401 that says so.
    status, answer = keyed(api, secret, "GET", "/v1/sessions")
    assert status == 401 and "X-Eros-User" in answer["message"], answer


def test_the_logs_name_a_key_by_its_id_never_its_secret(api, db, acme, monkeypatch):
    from eros.observability import logger

    logged: list[str] = []
    monkeypatch.setattr(logger, "info", lambda *args, **kwargs: logged.append(repr((args, kwargs))))
    made = new_key(api)
    status, rotated = operator(api, "POST", f"/v1/operator/keys/{made['id']}/rotate")
    assert status == 201
    assert operator(api, "DELETE", f"/v1/operator/keys/{rotated['id']}")[0] == 204
    text = "\n".join(logged)
    for key in (made, rotated):
        assert key["id"] in text and key["secret"] not in text and key["secret"][apps.KEY_SHOWN:] not in text


def test_a_rotated_key_is_refused_on_the_very_next_request_and_its_successor_works(api, db, acme):
    old = new_key(api, "backend")
    assert keyed(api, old["secret"], "GET", "/v1/personas", user="alice")[0] == 200
    # Rotated with the key itself (an app's server rotating its own key).
    status, new = keyed(api, old["secret"], "POST", f"/v1/operator/keys/{old['id']}/rotate")
    assert status == 201, new
    assert new["name"] == "backend" and new["secret"] != old["secret"] and new["id"] != old["id"]
    refused(keyed(api, old["secret"], "GET", "/v1/personas", user="alice"))
    assert keyed(api, new["secret"], "GET", "/v1/personas", user="alice")[0] == 200
    keys = {k["id"]: k for k in listed(api)}
    assert keys[old["id"]]["revoked_at"] is not None and keys[old["id"]]["replaced_by"] == new["id"]
    assert keys[new["id"]]["revoked_at"] is None and keys[new["id"]]["replaced_by"] is None
    assert list(keys) == [new["id"], old["id"]]  # newest first
    # The old key is not live: rotating or revoking it again is a 404.
    assert operator(api, "POST", f"/v1/operator/keys/{old['id']}/rotate")[0] == 404
    assert operator(api, "DELETE", f"/v1/operator/keys/{old['id']}")[0] == 404


def test_a_revoked_key_is_refused_at_once(api, db, acme):
    made, kept = new_key(api, "one"), new_key(api, "two")
    assert keyed(api, made["secret"], "GET", "/v1/personas", user="alice")[0] == 200
    status, answer = operator(api, "DELETE", f"/v1/operator/keys/{made['id']}")
    assert status == 204 and answer is None
    refused(keyed(api, made["secret"], "GET", "/v1/personas", user="alice"))
    refused(keyed(api, made["secret"], "GET", "/v1/operator/keys"))
    assert keyed(api, kept["secret"], "GET", "/v1/personas", user="alice")[0] == 200  # the other key is untouched
    assert {k["id"]: k["revoked_at"] is not None for k in listed(api)} == {made["id"]: True, kept["id"]: False}
    assert operator(api, "DELETE", f"/v1/operator/keys/{made['id']}")[0] == 404


@pytest.mark.parametrize("method,suffix", [("DELETE", ""), ("POST", "/rotate")])
def test_a_key_id_that_is_not_a_uuid_is_a_422_and_an_unknown_one_a_404(api, db, acme, method, suffix):
    status, answer = operator(api, method, f"/v1/operator/keys/not-a-uuid{suffix}")
    assert status == 422 and answer["code"] == "invalid_request" and answer["errors"][0]["field"] == "path.key_id"
    status, answer = operator(api, method, f"/v1/operator/keys/{uuid.uuid4()}{suffix}")
    assert status == 404 and answer["code"] == "not_found", answer


def test_no_app_sees_or_touches_another_apps_keys(api, db, acme):
    make_app(db, "globex")
    theirs, ours = new_key(api, "acme-web"), new_key(api, "globex-web", app="globex")
    give_persona(db, "globex", "gizmo")

    def by_token(method: str, path: str):
        return operator(api, method, path, app="globex")

    def by_key(method: str, path: str):
        return keyed(api, ours["secret"], method, path)

    for ask in (by_token, by_key):
        assert [k["id"] for k in ask("GET", "/v1/operator/keys")[1]["keys"]] == [ours["id"]]
        assert ask("GET", "/v1/operator/app")[1]["id"] == "globex"
        # Another app's key id answers as an unknown one.
        for method, suffix in (("POST", "/rotate"), ("DELETE", "")):
            status, answer = ask(method, f"/v1/operator/keys/{theirs['id']}{suffix}")
            assert status == 404 and answer["message"] == f"no live API key {theirs['id']} in this app", answer
    # The default app's operator (a token without the app's claim) sees neither.
    assert api.call("GET", "/v1/operator/keys", user="ops", scope=OPERATOR)[1]["keys"] == []
    assert api.call("DELETE", f"/v1/operator/keys/{theirs['id']}", user="ops", scope=OPERATOR)[0] == 404
    # Nothing of acme's changed.
    assert keyed(api, theirs["secret"], "GET", "/v1/personas", user="alice")[0] == 200
    assert [(k["id"], k["revoked_at"]) for k in listed(api)] == [(theirs["id"], None)]
    # A server of one app acts for that app's users alone: the same subject is another user in each.
    keyed(api, theirs["secret"], "POST", "/v1/sessions", {"persona_id": "nova"}, user="alice")
    assert keyed(api, ours["secret"], "GET", "/v1/sessions", user="alice")[1]["sessions"] == []


SOME_ID = "00000000-0000-4000-8000-000000000001"  # fixed: xdist's workers must collect the same test ids
OPERATOR_ROUTES = [("GET", "/v1/operator/app", None), ("GET", "/v1/operator/keys", None),
                   ("POST", "/v1/operator/keys", {"name": "x"}), ("GET", "/v1/operator/usage", None),
                   ("POST", f"/v1/operator/keys/{SOME_ID}/rotate", None),
                   ("DELETE", f"/v1/operator/keys/{SOME_ID}", None)]


@pytest.mark.parametrize("method,path,body", OPERATOR_ROUTES)
@pytest.mark.parametrize("scope", [None, "chat", "chat eros/operatorx"])
def test_a_users_token_without_the_operator_scope_gets_a_403(api, db, acme, method, path, body, scope):
    status, answer = api.call(method, path, body, user="alice", scope=scope, app="acme")
    assert status == 403 and answer["code"] == "forbidden" and "operator" in answer["message"], answer
    assert db.execute("SELECT count(*) AS n FROM engine.app_keys").fetchone()["n"] == 0


def test_a_token_of_an_app_not_served_here_is_a_401(api, db, acme):
    refused(api.call("GET", "/v1/operator/keys", user="ops", scope=OPERATOR, app="initech"))
    refused(api.call("GET", "/v1/operator/keys", user="ops", scope=OPERATOR, app="Not An App"))
    db.execute("UPDATE engine.apps SET deleted_at = now() WHERE id = 'acme'")
    refused(operator(api, "GET", "/v1/operator/keys"))


def test_what_is_not_a_live_key_of_a_live_app_is_a_401(api, db, acme):
    made = new_key(api)
    secret = made["secret"]
    assert keyed(api, secret, "GET", "/v1/personas", user="alice")[0] == 200
    for key in (None, "", "ek_short", secret[:-1] + ("A" if secret[-1] != "A" else "B"), secret + "x",
                "Bearer " + secret, apps.new_key()):
        refused(keyed(api, key, "GET", "/v1/personas", user="alice"))
    # A key of an app being deleted is refused at once, though the key itself is not revoked.
    db.execute("UPDATE engine.apps SET deleted_at = now() WHERE id = 'acme'")
    status, answer = keyed(api, secret, "GET", "/v1/personas", user="alice")
    assert status == 401 and answer["code"] == "unauthorized" and "not a live key" in answer["message"], answer
    refused(keyed(api, secret, "GET", "/v1/operator/keys"))


@pytest.mark.parametrize("user", ["a\x1fb", "", "x" * 300, "nul\x00"])
def test_an_x_eros_user_that_cannot_name_a_user_is_a_401(api, db, acme, user):
    made = new_key(api)
    status, answer = keyed(api, made["secret"], "GET", "/v1/personas", user=user)
    assert status == 401 and answer["code"] == "unauthorized" and "X-Eros-User" in answer["message"], answer


def test_a_255_character_x_eros_user_is_a_user(api, db, acme):
    made = new_key(api)
    assert keyed(api, made["secret"], "GET", "/v1/personas", user="x" * 255)[0] == 200


@pytest.mark.parametrize("body,raw,status,field", [
    ({}, None, 422, "body.name"),
    ({"name": "x" * 500}, None, 422, "body.name"),
    ({"name": "   "}, None, 422, "body.name"),
    ({"name": "a\x00b"}, None, 422, "body.name"),
    ({"name": 7}, None, 422, "body.name"),
    ({"name": "web", "secret": "ek_" + "a" * 43}, None, 422, "body.secret"),
    (None, b"{name: web}", 400, None),
    (None, b"", 422, "body"),
])
def test_a_bad_body_makes_no_key(api, db, acme, body, raw, status, field):
    answer = operator(api, "POST", "/v1/operator/keys", body, raw=raw)
    assert answer[0] == status and answer[1]["code"] == "invalid_request", answer
    if field:
        assert field in [e["field"] for e in answer[1]["errors"]], answer
    assert db.execute("SELECT count(*) AS n FROM engine.app_keys").fetchone()["n"] == 0


def test_a_name_is_trimmed_and_100_characters_at_most(api, db, acme):
    assert new_key(api, "  web  ")["name"] == "web"
    assert new_key(api, "é" * 100)["name"] == "é" * 100
    assert operator(api, "POST", "/v1/operator/keys", {"name": "é" * 101})[0] == 422


def test_the_apps_usage_names_its_users_by_subject_and_no_other_apps(api, db, acme):
    today = datetime.now(UTC).date()
    for user, tokens in (("acme\x1falice", 300), ("acme\x1fbob", 100), ("alice", 5000)):
        db.execute("INSERT INTO engine.user_usage (user_id, day, tokens) VALUES (%s, %s, %s)", (user, today, tokens))
        db.execute("INSERT INTO engine.user_model_usage (user_id, day, purpose, model, calls, input_tokens,"
                   " output_tokens) VALUES (%s, %s, 'chat', 'offline/chat', 2, %s, 0)", (user, today, tokens))
    status, report = operator(api, "GET", "/v1/operator/usage")
    assert status == 200, report
    assert report["app"] == "acme" and report["to"] == today.isoformat()
    assert [(u["user_id"], u["tokens"], u["calls"]) for u in report["users"]] == [("alice", 300, 2), ("bob", 100, 2)]
    assert report["totals"]["tokens"] == 400 and report["totals"]["calls"] == 4
    assert report["users"][0]["purposes"]["chat"] == 300
    # The same report with the app's key; the default app's operator sees its own alice alone.
    made = new_key(api)
    assert keyed(api, made["secret"], "GET", "/v1/operator/usage")[1]["users"] == report["users"]
    default = api.call("GET", "/v1/operator/usage", user="ops", scope=OPERATOR)[1]
    assert [(u["user_id"], u["tokens"]) for u in default["users"]] == [("alice", 5000)]
    # A range GET /v1/usage refuses is refused the same way.
    status, answer = operator(api, "GET", f"/v1/operator/usage?from={today}&to={date(2020, 1, 1)}")
    assert status == 422 and answer["errors"][0]["field"] == "query.from", answer
    assert operator(api, "GET", "/v1/operator/usage?from=yesterday")[0] == 422
    assert operator(api, "GET", "/v1/operator/usage?from=2020-01-01&to=2024-01-01")[0] == 422


# --- local tokens of an app (`eros token USER --app APP --operator`) ----------------------------------------------

def test_eros_token_names_the_app_and_grants_the_operator_scope(db, capsys):
    from eros.config import settings
    from eros_dev import cli
    from eros_dev.tokens import local_jwt_key

    assert cli.main(["token", "bob", "--app", "acme", "--operator"]) == 0
    claims = jwt.decode(capsys.readouterr().out.strip(), local_jwt_key(), algorithms=["HS256"],
                        audience=settings().jwt_audience)
    assert claims["sub"] == "bob" and claims["eros_app"] == "acme" and "eros/operator" in claims["scope"].split()
    assert cli.main(["token", "bob"]) == 0
    claims = jwt.decode(capsys.readouterr().out.strip(), local_jwt_key(), algorithms=["HS256"],
                        audience=settings().jwt_audience)
    assert "eros_app" not in claims and claims["scope"] == "chat"
    assert cli.main(["token", "bob", "--app", "Not An App"]) == 2
    assert "not an app id" in capsys.readouterr().err


# --- the Python client with an API key, against the local stack -------------------------------------------------

def local_token(user: str, app: str | None = None, *, operator: bool = False) -> str:
    from eros.config import settings
    from eros_dev.tokens import issue_token, local_jwt_key

    return issue_token(user, settings(), local_jwt_key(), operator=operator, app=app)


def test_an_apps_server_uses_the_client_with_an_api_key(db, acme, local_server):
    with Client(local_server.url, local_token("ops", "acme", operator=True)) as ops:
        made = ops.create_key("backend")
        assert ops.get_app().id == "acme" and [k.id for k in ops.list_keys().keys] == [made.id]
    secret = made.secret
    with Client(local_server.url, api_key=secret, user="alice") as alice:
        session = alice.create_session("nova").id
        assert [s.id for s in alice.list_sessions().sessions] == [session]
    with Client(local_server.url, local_token("alice")) as default_alice:  # the default app's alice: another user
        assert default_alice.list_sessions().sessions == []
    with Client(local_server.url, api_key=secret) as server:
        assert server.get_app().id == "acme"
        assert server.get_app_usage().app == "acme"
        listed_keys = server.list_keys().keys
        assert [k.prefix for k in listed_keys] == [secret[:apps.KEY_SHOWN]]
        assert "secret" not in type(listed_keys[0]).model_fields
        rotated = server.rotate_key(made.id)
        with pytest.raises(Unauthorized) as refused_old:
            server.list_keys()  # this client still sends the old key
        assert refused_old.value.status == 401 and refused_old.value.code == "unauthorized"
    with Client(local_server.url, api_key=rotated.secret) as server:
        spare = server.create_key("spare")
        server.revoke_key(spare.id)
        assert {k.id: k.revoked_at is not None for k in server.list_keys().keys} == {
            made.id: True, rotated.id: False, spare.id: True}
    with Client(local_server.url, api_key=spare.secret, user="alice") as revoked, pytest.raises(Unauthorized):
        revoked.list_personas()


def test_the_async_client_takes_an_api_key_too(db, acme, local_server):
    import asyncio

    with Client(local_server.url, local_token("ops", "acme", operator=True)) as ops:
        made = ops.create_key("async")

    async def run():
        async with AsyncClient(local_server.url, api_key=made.secret, user="bob") as bob:
            session = (await bob.create_session("nova")).id
            assert [s.id for s in (await bob.list_sessions()).sessions] == [session]
        async with AsyncClient(local_server.url, api_key=made.secret) as server:
            assert [k.id for k in (await server.list_keys()).keys] == [made.id]
            await server.revoke_key(made.id)
            with pytest.raises(Unauthorized):
                await server.get_app()

    asyncio.run(run())


def test_a_client_takes_a_token_or_an_api_key_and_a_user_only_with_a_key():
    import httpx

    with pytest.raises(ValueError, match="not both"):
        Client("http://127.0.0.1:1", "a-token", api_key="ek_x")
    with pytest.raises(ValueError, match="api_key"):
        Client("http://127.0.0.1:1", "a-token", user="alice")
    with pytest.raises(ValueError, match="not both"):
        AsyncClient("http://127.0.0.1:1", "a-token", api_key="ek_x")
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"personas": []})

    def http() -> httpx.Client:
        return httpx.Client(base_url="http://api.test/stage", transport=httpx.MockTransport(answer))

    with Client("http://api.test/stage", api_key="ek_x", user="alice", http=http()) as server:
        server.list_personas()
    with Client("http://api.test/stage", "a-token", http=http()) as user:  # the token path is as it was
        user.list_personas()
    assert [str(r.url) for r in sent] == ["http://api.test/stage/server/v1/personas", "http://api.test/stage/v1/personas"]
    assert (sent[0].headers["x-api-key"], sent[0].headers["x-eros-user"]) == ("ek_x", "alice")
    assert "authorization" not in sent[0].headers
    assert sent[1].headers["authorization"] == "Bearer a-token" and "x-api-key" not in sent[1].headers


def test_the_readmes_api_key_example_runs(db, local_server, monkeypatch):
    """clients/python/README.md's server-side example as written, with a key of the first app."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "clients" / "python" / "README.md").read_text(encoding="utf-8")
    example = re.search(r"## Server-side, with an app's API key.*?```python\n(.*?)```", readme, re.S)
    assert example is not None
    with Client(local_server.url, local_token("ops", operator=True)) as ops:
        made = ops.create_key("backend")
    monkeypatch.setenv("EROS_URL", local_server.url)
    monkeypatch.setenv("EROS_API_KEY", made.secret)
    namespace: dict = {}
    exec(compile(example[1], "README api key example", "exec"), namespace)  # noqa: S102 (our own README)
    assert [k.id for k in namespace["keys"]] == [made.id] and namespace["report"].app == "default"
    owner = db.execute("SELECT user_id FROM engine.chat_sessions").fetchone()["user_id"]
    assert owner == "alice"  # the first app's users are their bare subjects
    assert {k["name"]: k["revoked_at"] is not None for k in
            db.execute("SELECT name, revoked_at FROM engine.app_keys").fetchall()} == {"backend": False, "spare": True}


def test_a_streamed_turn_with_an_api_key_goes_to_the_server_stream_route(providers, db, acme, local_server):
    fake_llm, _ = providers
    fake_llm.responder = lambda body: "fake reply"
    with Client(local_server.url, local_token("ops", "acme", operator=True)) as ops:
        made = ops.create_key("stream")
    with Client(local_server.url, api_key=made.secret, user="alice") as alice:
        session = alice.create_session("nova").id
        turn = alice.stream_turn(session, "Hello there")
        assert "".join(turn) == "fake reply" and turn.result.reply == "fake reply"
        assert turn.user_message_id is not None  # from the stream's `turn` event: streamed, not the JSON fallback
    owner = db.execute("SELECT DISTINCT user_id FROM engine.chat_messages").fetchall()
    assert [r["user_id"] for r in owner] == ["acme\x1falice"]
    wrong_key = made.secret[:-1] + ("A" if made.secret[-1] != "A" else "B")
    with Client(local_server.url, api_key=wrong_key, user="alice") as wrong, pytest.raises(Unauthorized):
        wrong.stream_turn(session, "Hello again")
