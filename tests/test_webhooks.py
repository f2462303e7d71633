"""Signed webhooks (issue 32, migration 0037, eros.webhooks): an app's memory events posted to its own endpoint,
signed the Standard Webhooks way, at least once, retried with backoff, dead after the last attempt and redriven by
the operator; another app's endpoint never gets them; erasure and the app's deletion take the deliveries with them.
The endpoints are small HTTP servers on loopback, here."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from apiclient import Api

from eros import clock, events, webhooks
from eros.config import settings
from eros.store import webhooks as webhook_store

pytestmark = pytest.mark.integration

OPERATOR = "chat eros/operator"


class Receiver:
    """An app's endpoint: records each request (headers, raw body) and answers the next status of ``script`` (its
    last one from then on); a status of None sleeps past the client's timeout instead."""

    def __init__(self, *script: int | None):
        self.script: list[int | None] = list(script or (200,))
        self.received: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.received.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                status = receiver.script.pop(0) if len(receiver.script) > 1 else receiver.script[0]
                if status is None:
                    time.sleep(1.0)
                    status = 200
                answer = b"internal stack trace: do not keep me"
                self.send_response(status)
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/eros"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def events(self) -> list[dict]:
        return [json.loads(r["body"]) for r in self.received]


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(*script):
        made.append(Receiver(*script))
        return made[-1]

    yield make
    for r in made:
        r.close()


class Clock:
    def __init__(self):
        self.at = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at

    def move(self, secs: float) -> None:
        self.at += timedelta(seconds=secs)


@pytest.fixture
def hooks(db, env, monkeypatch):
    """Two apps, acme and globex; webhooks allowed over http on loopback; the application's clock held still."""
    env(WEBHOOK_ALLOW_HTTP="true", WEBHOOK_RETRY_BASE_SECS="10", WEBHOOK_RETRY_MAX_DELAY_SECS="60",
        WEBHOOK_MAX_ATTEMPTS="3", WEBHOOK_TIMEOUT_SECS="0.3", WEBHOOK_LEASE_SECS="120", EVENTS_LOG=None,
        EVENT_BUS_NAME=None, EVENTS_INCLUDE_TEXT=None)
    for app in ("acme", "globex"):
        db.execute("INSERT INTO engine.apps (id, name) VALUES (%s, %s)", (app, app.title()))
    now = Clock()
    monkeypatch.setattr(clock, "now", now)
    return Api(), now


def operator(api: Api, method: str, path: str, body=None, *, app: str = "acme"):
    return api.call(method, path, body, user="ops", scope=OPERATOR, app=app)


def set_hook(api: Api, url: str, app: str = "acme") -> str:
    status, made = operator(api, "PUT", "/v1/operator/webhook", {"url": url}, app=app)
    assert status == 200, made
    assert made["secret"].startswith("whsec_") and len(base64.b64decode(made["secret"][6:])) == 32
    return made["secret"]


def remember(api: Api, text: str = "Keeps bees on the roof", app: str = "acme", user: str = "alice") -> None:
    status, body = api.call("POST", "/v1/memories", {"content": text, "category": "fact"}, user=user, app=app)
    assert status == 201, body


def sweep() -> int:
    """A sweep's events part: publish (which writes the deliveries), then deliver."""
    events.publish_pending(settings())
    return webhooks.deliver(settings())


def verified(secret: str, request: dict) -> bool:
    """The receiver's check, written from the Standard Webhooks convention, not with eros.webhooks."""
    h = request["headers"]
    signed = f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + request["body"]
    expected = base64.b64encode(hmac.new(base64.b64decode(secret.removeprefix("whsec_")), signed,
                                         hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, s.removeprefix("v1,")) for s in h["webhook-signature"].split())


def deliveries(db, app: str = "acme") -> list[dict]:
    return db.execute("SELECT * FROM engine.webhook_deliveries WHERE app_id = %s ORDER BY id", (app,)).fetchall()


def test_an_apps_event_reaches_its_endpoint_alone_signed_and_a_tampered_body_fails_the_check(hooks, receivers, db):
    api, now = hooks
    acme, globex = receivers(200), receivers(200)
    secret = set_hook(api, acme.url)
    set_hook(api, globex.url, app="globex")
    remember(api)
    from eros.dreaming import tick

    assert tick.sweep(settings(), lambda payload: None).webhooks_delivered == 1
    assert globex.received == []
    (got,) = acme.received
    event = json.loads(got["body"])
    assert (event["app"], event["user_id"], event["type"], event["seq"]) == ("acme", "alice", "memory.created", 1)
    assert "content" not in event  # no text unless the app opts in
    assert got["headers"]["webhook-id"] == event["id"]
    assert abs(int(got["headers"]["webhook-timestamp"]) - now().timestamp()) < 1
    assert got["headers"]["webhook-signature"].startswith("v1,")
    assert verified(secret, got)
    assert not verified(secret, got | {"body": got["body"].replace(b"alice", b"mallory")})
    assert not verified(webhooks.new_secret(), got)  # another secret
    assert sweep() == 0  # delivered once
    status, shown = operator(api, "GET", "/v1/operator/webhook")
    assert status == 200 and shown["url"] == acme.url and (shown["pending"], shown["dead"]) == (0, 0)
    assert "secret" not in shown
    assert operator(api, "GET", "/v1/operator/webhook", app="globex")[1]["url"] == globex.url


def test_setting_the_url_again_keeps_the_secret_and_a_rotation_shows_a_new_one(hooks, receivers, db):
    api, _ = hooks
    first = set_hook(api, "https://hooks.acme.example/eros")
    status, again = operator(api, "PUT", "/v1/operator/webhook", {"url": "https://hooks.acme.example/v2"})
    assert status == 200 and again.get("secret") is None and again["url"] == "https://hooks.acme.example/v2"
    status, rotated = operator(api, "PUT", "/v1/operator/webhook", {"url": "https://hooks.acme.example/v2",
                                                                     "rotate_secret": True})
    assert status == 200 and rotated["secret"] not in (None, first) and rotated["secret_rotated_at"]
    kept = db.execute("SELECT secret FROM engine.app_webhooks WHERE app_id = 'acme'").fetchone()["secret"]
    assert kept == rotated["secret"]


def test_a_failing_endpoint_is_retried_after_the_backoff_and_delivered_on_the_third_attempt(hooks, receivers, db):
    api, now = hooks
    endpoint = receivers(500, 500, 200)
    set_hook(api, endpoint.url)
    remember(api)
    assert sweep() == 0
    assert sweep() == 0 and len(endpoint.received) == 1  # not due again before its backoff
    (row,) = deliveries(db)
    assert (row["attempts"], row["last_status"], row["last_error"]) == (1, 500, "answered 500")
    assert timedelta(seconds=5) <= row["next_attempt_at"] - now() <= timedelta(seconds=10)  # base 10, jittered
    now.move(10)
    assert webhooks.deliver(settings()) == 0
    (row,) = deliveries(db)
    assert row["attempts"] == 2 and timedelta(seconds=10) <= row["next_attempt_at"] - now() <= timedelta(seconds=20)
    now.move(20)
    assert webhooks.deliver(settings()) == 1
    (row,) = deliveries(db)
    assert row["attempts"] == 3 and row["delivered_at"] == now() and row["dead_at"] is None
    assert len({r["headers"]["webhook-id"] for r in endpoint.received}) == 1 and len(endpoint.received) == 3
    assert "stack trace" not in json.dumps(row, default=str)  # the response's body is never kept


def test_past_the_last_attempt_a_delivery_is_dead_listed_and_redriven(hooks, receivers, db):
    api, now = hooks
    endpoint = receivers(500)
    set_hook(api, endpoint.url)
    remember(api)
    for _ in range(3):  # WEBHOOK_MAX_ATTEMPTS
        sweep()
        now.move(60)
    assert sweep() == 0 and len(endpoint.received) == 3
    (row,) = deliveries(db)
    assert row["dead_at"] is not None and row["attempts"] == 3
    status, shown = operator(api, "GET", "/v1/operator/webhook")
    assert (shown["pending"], shown["dead"]) == (0, 1)
    endpoint.script = [200]
    assert operator(api, "POST", "/v1/operator/webhook/redrive") == (200, {"redriven": 1})
    assert operator(api, "POST", "/v1/operator/webhook/redrive", app="globex")[0] == 404  # globex has no webhook
    assert webhooks.deliver(settings()) == 1
    (row,) = deliveries(db)
    assert row["delivered_at"] is not None and row["dead_at"] is None
    assert operator(api, "GET", "/v1/operator/webhook")[1]["dead"] == 0


def test_a_timeout_is_a_failed_attempt(hooks, receivers, db):
    api, _ = hooks
    endpoint = receivers(None)
    set_hook(api, endpoint.url)
    remember(api)
    assert sweep() == 0
    (row,) = deliveries(db)
    assert (row["attempts"], row["last_status"], row["last_error"], row["delivered_at"]) == (1, None, "timed out",
                                                                                              None)


def test_a_sweep_stopped_between_the_post_and_its_record_posts_it_again_with_the_same_id(hooks, receivers, db,
                                                                                          monkeypatch):
    api, now = hooks
    endpoint = receivers(200)
    set_hook(api, endpoint.url)
    remember(api)

    def killed(*args, **kwargs):
        raise SystemExit("the sweep's container was stopped")

    with monkeypatch.context() as m:
        m.setattr(webhook_store, "outcome", killed)
        with pytest.raises(SystemExit):
            sweep()
    assert len(endpoint.received) == 1
    assert webhooks.deliver(settings()) == 0  # held by the stopped sweep's lease
    now.move(121)  # WEBHOOK_LEASE_SECS
    assert webhooks.deliver(settings()) == 1
    first, second = endpoint.received
    assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"]
    assert first["body"] == second["body"]


def test_concurrent_passes_never_send_a_delivery_twice_while_its_lease_holds(hooks, receivers, db):
    api, _ = hooks
    endpoint = receivers(200)
    set_hook(api, endpoint.url)
    for n in range(8):
        remember(api, f"Fact number {n}")
    events.publish_pending(settings())
    assert len(deliveries(db)) == 8
    done: list[int] = []
    passes = [threading.Thread(target=lambda: done.append(webhooks.deliver(settings()))) for _ in range(4)]
    for p in passes:
        p.start()
    for p in passes:
        p.join()
    ids = [r["headers"]["webhook-id"] for r in endpoint.received]
    assert sorted(done, reverse=True)[0] >= 1 and sum(done) == 8
    assert len(ids) == len(set(ids)) == 8
    # And the claim itself: what one pass took, another does not see until the lease is over.
    remember(api, "One more fact")
    events.publish_pending(settings())
    lease = clock.now() + timedelta(seconds=120)
    assert len(webhook_store.claim(clock.now(), lease, 10)) == 1
    assert webhook_store.claim(clock.now(), lease, 10) == []
    assert len(webhook_store.claim(lease, lease + timedelta(seconds=120), 10)) == 1


def test_each_users_events_come_in_seq_order(hooks, receivers, db):
    api, _ = hooks
    endpoint = receivers(200)
    set_hook(api, endpoint.url)
    for n in range(5):
        remember(api, f"Fact number {n}", user="alice")
        remember(api, f"Fact number {n}", user="bob")
    sweep()
    for user in ("alice", "bob"):
        assert [e["seq"] for e in endpoint.events() if e["user_id"] == user] == [1, 2, 3, 4, 5]


def test_text_only_for_the_app_that_opts_in(hooks, receivers, db):
    api, _ = hooks
    db.execute("""UPDATE engine.apps SET settings = '{"events_include_text": true}' WHERE id = 'acme'""")
    acme, globex = receivers(200), receivers(200)
    set_hook(api, acme.url)
    set_hook(api, globex.url, app="globex")
    remember(api, "Keeps bees on the roof")
    remember(api, "Grows tomatoes", app="globex")
    assert sweep() == 2
    assert acme.events()[0]["content"] == "Keeps bees on the roof"
    assert "content" not in globex.events()[0] and b"tomatoes" not in globex.received[0]["body"]


def test_an_erasure_drops_the_users_deliveries(hooks, receivers, db):
    api, _ = hooks
    endpoint = receivers(500)
    set_hook(api, endpoint.url)
    remember(api, user="alice")
    remember(api, user="bob")
    sweep()
    assert len(deliveries(db)) == 2
    status, erased = api.call("DELETE", "/v1/me", user="alice", app="acme")
    assert status == 200 and erased["erased"]["webhook_deliveries"] == 1
    assert [r["payload"]["user_id"] for r in deliveries(db)] == ["bob"]
    events.publish_pending(settings())  # the user.erased event alone is delivered after it: it carries no text
    assert [r["payload"]["type"] for r in deliveries(db) if r["payload"]["user_id"] == "alice"] == ["user.erased"]


def test_deleting_the_webhook_drops_its_pending_deliveries(hooks, receivers, db):
    api, _ = hooks
    endpoint = receivers(500)
    set_hook(api, endpoint.url)
    remember(api)
    sweep()
    assert operator(api, "DELETE", "/v1/operator/webhook")[0] == 204
    assert deliveries(db) == []
    for method, path in (("GET", "/v1/operator/webhook"), ("DELETE", "/v1/operator/webhook"),
                         ("POST", "/v1/operator/webhook/redrive")):
        assert operator(api, method, path)[0] == 404
    remember(api, "Another fact")
    events.publish_pending(settings())
    assert deliveries(db) == []  # no webhook: no delivery


def test_an_apps_deletion_leaves_no_webhook_nor_delivery(hooks, receivers, db):
    from eros.account import erase_app

    api, _ = hooks
    endpoint = receivers(500)
    set_hook(api, endpoint.url)
    remember(api)
    sweep()
    done = erase_app("acme")
    assert done.leftovers["webhook"] == 1
    assert not any(done.scan.values()), done.scan


@pytest.mark.parametrize("body, allow_http", [
    ({"url": "http://hooks.acme.example/eros"}, False),
    ({"url": "ftp://hooks.acme.example/eros"}, True),
    ({"url": "https://user:pw@hooks.acme.example/eros"}, False),
    ({"url": "https://hooks.acme.example/eros#part"}, False),
    ({"url": "https://169.254.169.254/latest/meta-data"}, False),
    ({"url": "https://10.1.2.3/eros"}, False),
    ({"url": "https://127.0.0.1:8443/eros"}, False),
    ({"url": "https://[::1]/eros"}, False),
    ({"url": "https://[::ffff:169.254.169.254]/eros"}, False),
    ({"url": "https://2130706433/eros"}, False),  # 127.0.0.1, as a resolver reads it
    ({"url": "https://0x7f.1/eros"}, False),
    ({"url": "https://localhost:8443/eros"}, False),
    ({"url": "https://hooks.acme.example:99999/eros"}, False),
    ({"url": "https://hooks.acme.example/" + "a" * 2000}, False),
    ({"url": "not a url"}, False),
    ({"url": ""}, False),
    ({}, False),
    ({"url": "https://hooks.acme.example/eros", "rotate_secret": "yes"}, False),
    ({"url": "https://hooks.acme.example/eros", "secret": "mine"}, False),
])
def test_a_bad_webhook_is_refused_naming_the_field(hooks, env, db, body, allow_http):
    api, _ = hooks
    env(WEBHOOK_ALLOW_HTTP=str(allow_http).lower())
    status, answer = operator(api, "PUT", "/v1/operator/webhook", body)
    assert status == 422, answer
    named = {e["field"].split(".")[-1] for e in answer["errors"]}
    assert named & {"url", "rotate_secret", "secret"}, answer
    assert db.execute("SELECT count(*) AS n FROM engine.app_webhooks").fetchone()["n"] == 0


@pytest.mark.parametrize("url", ["https://hooks.acme.example/eros?tenant=7", "https://8.8.8.8/eros",
                                 "https://[2001:4860:4860::8888]:8443/eros"])
def test_a_public_https_endpoint_is_taken(hooks, env, url):
    api, _ = hooks
    env(WEBHOOK_ALLOW_HTTP="false")
    status, answer = operator(api, "PUT", "/v1/operator/webhook", {"url": url})
    assert status == 200 and answer["url"] == url, answer


def test_an_endpoint_that_does_not_answer_holds_up_no_other_apps_deliveries(hooks, receivers, db):
    api, now = hooks
    slow, globex = receivers(None), receivers(200)
    set_hook(api, slow.url)
    set_hook(api, globex.url, app="globex")
    for n in range(3):
        remember(api, f"Fact number {n}")
    remember(api, "Grows tomatoes", app="globex")
    started = time.monotonic()
    assert sweep() == 1 and len(globex.received) == 1
    assert time.monotonic() - started < 2  # one timeout (0.3 s), not three
    assert [r["attempts"] for r in deliveries(db)] == [1, 0, 0]  # the others wait, no attempt spent
    slow.script = [200]
    now.move(121)  # past the lease and the first one's backoff
    assert webhooks.deliver(settings()) == 3


@pytest.mark.parametrize("method, path, body", [("PUT", "/v1/operator/webhook", {"url": "https://a.example/h"}),
                                                ("GET", "/v1/operator/webhook", None),
                                                ("DELETE", "/v1/operator/webhook", None),
                                                ("POST", "/v1/operator/webhook/redrive", None)])
def test_a_users_token_without_the_operator_scope_is_refused(hooks, db, method, path, body):
    api, _ = hooks
    status, answer = api.call(method, path, body, user="alice", scope="chat", app="acme")
    assert status == 403, answer
    assert db.execute("SELECT count(*) AS n FROM engine.app_webhooks").fetchone()["n"] == 0


def test_eros_webhooks_set_show_redrive_delete(hooks, receivers, db, env, capsys):
    from eros_dev import cli

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    api, now = hooks
    endpoint = receivers(500)
    code, out, err = run("webhooks", "set", "--app", "acme", endpoint.url)
    assert code == 0, err
    secret = out.split("signing secret:\n")[1].split("\n")[0]
    assert secret == db.execute("SELECT secret FROM engine.app_webhooks").fetchone()["secret"]
    code, out, _ = run("webhooks", "set", endpoint.url, "--app", "acme")
    assert code == 0 and "whsec_" not in out  # the url again: the secret kept, not shown
    code, out, _ = run("webhooks", "set", endpoint.url, "--app", "acme", "--rotate-secret")
    assert code == 0 and "whsec_" in out and secret not in out
    remember(api)
    for _ in range(3):
        sweep()
        now.move(60)
    code, out, _ = run("webhooks", "show", "--app", "acme")
    assert code == 0 and endpoint.url in out and "waiting: 0, dead: 1" in out
    assert run("webhooks", "redrive", "--app", "acme")[1].startswith("1 dead deliveries of app acme due again")
    assert run("webhooks", "delete", "--app", "acme")[0] == 0
    code, _, err = run("webhooks", "show", "--app", "acme")
    assert code == 1 and "has no webhook" in err
    env(WEBHOOK_ALLOW_HTTP="false")
    code, _, err = run("webhooks", "set", "--app", "acme", endpoint.url)
    assert code != 0 and "https" in err
    assert db.execute("SELECT count(*) AS n FROM engine.app_webhooks").fetchone()["n"] == 0
