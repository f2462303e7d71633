"""The local loop as a newcomer meets it: one port setting, a busy port in one line, every CLI error in one
line, `eros sweep` saying what it did, `eros invoke` on the sample events, `eros doctor` and
/v1/health/deep, `eros stop` and Ctrl-C stopping what `make run` started, and an OpenAPI document that
says how to authenticate and what each route answers."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from apiclient import Api
from fakes import BreakStream, Status
from helpers import EVENTS, ROOT

from eros.migrate import migration_files
from eros_dev import cli

pytestmark = pytest.mark.e2e

EXTRACTED = json.dumps({"memories": [{"content": "Grows tomatoes on the balcony", "category": "preference",
                                      "importance": 0.6}]})


@pytest.fixture
def online(providers, env):
    providers[0].responder = lambda body: EXTRACTED if body.get("response_format") else "lovely"
    env(DREAMING_IDLE_SECS=1800)
    return providers


def err_lines(capsys) -> list[str]:
    """What the command said on stderr (not the local server's access log, which shares it in-process)."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("eros ")]


# --- ports ------------------------------------------------------------------------------------------------------

def test_a_busy_port_is_one_line_that_names_the_fix(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve", "--port", str(port), "--no-sweep"]) == 1
    [line] = err_lines(capsys)
    assert f"port {port} is in use" in line and "make stop" in line and f"PORT={port + 1} make run" in line


def test_eros_chat_finds_the_stack_on_port_and_names_an_unknown_persona(db, local_server, env, monkeypatch, capsys):
    env(PORT=local_server.server.server_address[1])
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))
    assert cli.main(["chat", "dora"]) == 0  # no --url: the PORT everything else uses
    assert "> " in capsys.readouterr().out
    assert cli.main(["chat", "dora", "--persona", "nobody"]) == 1
    [line] = err_lines(capsys)
    assert line == "eros chat: no persona 'nobody': choose one of kai, luna, mei"
    env(PORT=9)
    assert cli.main(["chat", "dora"]) == 1
    [line] = err_lines(capsys)
    assert "http://127.0.0.1:9" in line and "make run" in line


def test_eros_chat_says_a_url_needs_its_scheme_and_names_one_it_cannot_reach(capsys):
    """Issue 29: `eros chat --url 127.0.0.1:3401` blamed the stack ("cannot reach ... start it with make run")."""
    assert cli.main(["chat", "dora", "--url", "127.0.0.1:3401"]) == 2
    assert err_lines(capsys) == ["eros chat: --url '127.0.0.1:3401' needs its scheme: http:// or https:// "
                                 "(e.g. --url http://127.0.0.1:3401)"]
    assert cli.main(["chat", "dora", "--url", "http://127.0.0.1:9"]) == 1
    [line] = err_lines(capsys)
    assert line.startswith("eros chat: cannot reach the local stack at http://127.0.0.1:9 ") and "`make run`" in line
    assert cli.main(["chat", "dora", "--url", "http://127.0.0.1:9", "--stream-url", "abc.lambda-url.on.aws"]) == 2
    assert err_lines(capsys) == ["eros chat: --stream-url 'abc.lambda-url.on.aws' needs its scheme: http:// or "
                                 "https:// (e.g. --stream-url http://abc.lambda-url.on.aws)"]


def test_eros_chat_names_a_server_that_is_not_the_api(local_server, capsys):
    assert cli.main(["chat", "dora", "--url", f"{local_server.url}/console"]) == 1  # answers, but not the API
    [line] = err_lines(capsys)
    assert line == (f"eros chat: {local_server.url}/console answered GET /v1/personas with 404 and no list of "
                    "personas: is it the eros API? (--url, or the PORT it runs on)")


def acme(db) -> None:
    """A second app, with a persona of its own (as `eros apps create` and `eros personas set --app` make them)."""
    from eros.store import apps as app_store
    from eros.store import personas as persona_store

    app_store.create("acme", "Acme", {}, db)
    persona_store.keep_app("acme", "nova", "Nova", "", "You are Nova, a patient tutor.")


def test_eros_chat_as_a_user_of_another_app(db, local_server, monkeypatch, capsys):
    acme(db)
    url = local_server.url
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))
    assert cli.main(["chat", "dora", "--app", "acme", "--url", url, "--no-stream"]) == 0
    assert " with nova " in capsys.readouterr().out  # acme's persona: its only one
    assert [r["user_id"] for r in db.execute("SELECT user_id FROM engine.chat_sessions").fetchall()] == \
        ["acme\x1fdora"]
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages WHERE user_id = 'acme\x1fdora'"
                      ).fetchone()["n"] == 2
    assert cli.main(["chat", "dora", "--app", "acme", "--url", url, "--persona", "luna"]) == 1
    assert err_lines(capsys) == ["eros chat: no persona 'luna': choose one of nova"]
    assert cli.main(["chat", "dora", "--app", "globex", "--url", url]) == 1
    assert err_lines(capsys) == [f"eros chat: {url} refused the token: the token's app 'globex' is not served here"]
    assert cli.main(["chat", "dora", "--app", "Acme", "--url", url]) == 2
    [line] = err_lines(capsys)
    assert line.startswith("eros chat: --app 'Acme' is not an app id")
    assert cli.main(["chat", "--token", "abc", "--app", "acme", "--url", url]) == 2
    assert err_lines(capsys) == ["eros chat: --app names the app of the local token made for USER: a --token names "
                                 "its own app"]


def test_every_command_that_names_a_user_takes_their_app_and_refuses_one_not_served(db, tmp_path, capsys):
    """forget, usage, personas, keys, invoke --as: --app must be an app id and an app this database serves."""
    acme(db)
    sid = Api().session(user="dora", persona="nova", app="acme")
    turn = json.loads((EVENTS / "chat_stream_turn.json").read_text())
    turn["rawPath"] = turn["requestContext"]["http"]["path"] = f"/v1/sessions/{sid}/turns/stream"
    (tmp_path / "turn.json").write_text(json.dumps(turn))
    capsys.readouterr()
    for command in (["forget", "dora", "--yes"], ["usage", "--user", "dora"], ["personas", "list"],
                    ["keys", "list"], ["invoke", "chat-stream", str(tmp_path / "turn.json"), "--as", "dora"]):
        assert cli.main([*command, "--app", "globex"]) == 1, command
        assert err_lines(capsys) == [f"eros {command[0]}: there is no app 'globex' (`eros apps list` lists them)"]
        assert cli.main([*command, "--app", "Not An App"]) == 2, command
        [line] = err_lines(capsys)
        assert line == f"eros {command[0]}: --app 'Not An App' is not an app id: 2 to 40 of a-z 0-9 -, starting" \
                       " with a letter", command
    # acme's dora: her streamed turn, then her erasure (the first app's dora is someone else, with nothing stored)
    assert cli.main(["invoke", "chat-stream", str(tmp_path / "turn.json"), "--as", "dora", "--app", "acme"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["statusCode"] == 200
    assert cli.main(["forget", "dora", "--yes"]) == 0 and capsys.readouterr().out == "nothing was stored about dora\n"
    assert cli.main(["forget", "dora", "--app", "acme", "--yes"]) == 0
    assert "erased dora of app acme: 1 session, 2 messages" in capsys.readouterr().out
    assert cli.main(["forget", "x\x1fdora", "--yes"]) == 2
    assert "U+001F" in err_lines(capsys)[0]
    assert cli.main(["invoke", "chat", str(EVENTS / "chat_health.json"), "--app", "acme"]) == 2
    assert err_lines(capsys) == ["eros invoke: --as USER and --app are for chat-stream (a turn sent as a user)"]


class Timed(io.StringIO):
    """stdout that keeps what the command wrote (not the in-process local server's threads: their metrics lines)
    and when each piece was written (print(..., flush=True))."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[float, str]] = []
        self._command = threading.get_ident()

    def write(self, text: str) -> int:
        if threading.get_ident() != self._command:
            return len(text)
        self.writes.append((time.monotonic(), text))
        return super().write(text)


SAID = "Tomatoes love the sun, so a south-facing balcony is perfect for them."


def chat(monkeypatch, url: str, said: str, *flags: str) -> Timed:
    out = Timed()
    monkeypatch.setattr("sys.stdin", io.StringIO(said))
    monkeypatch.setattr("sys.stdout", out)
    assert cli.main(["chat", "dora", "--url", url, "--persona", "luna", *flags]) == 0
    return out


def test_eros_chat_prints_the_reply_as_it_arrives(online, db, local_server, monkeypatch):
    """The streamed reply's words are printed (and flushed) as the model writes them, then what was recalled: the
    same lines as --no-stream prints once the whole reply is in."""
    fake_llm = online[0]
    fake_llm.responder = lambda body: EXTRACTED if body.get("response_format") else SAID
    fake_llm.first_token_delay, fake_llm.token_interval = 0.0, 0.05
    out = chat(monkeypatch, local_server.url, "I grow tomatoes\n")
    lines = out.getvalue().splitlines()
    assert lines[1:] == [f"luna> {SAID}", "   (recalled: nothing)"]
    pieces = [(at, text) for at, text in out.writes
              if text not in ("", "\n") and not text.startswith(("session ", "   (recalled"))]
    assert "".join(text for _, text in pieces) == f"luna> {SAID}" and len(pieces) > 5, pieces
    assert pieces[-1][0] - pieces[0][0] > 0.2, pieces  # written over the reply's time, not at once at the end
    assert [r["json"].get("stream") for r in fake_llm.requests] == [True]

    out = chat(monkeypatch, local_server.url, "I grow tomatoes\n", "--no-stream")
    assert out.getvalue().splitlines()[1:] == [f"luna> {SAID}", "   (recalled: nothing)"]
    assert not fake_llm.requests[-1]["json"].get("stream")


def test_eros_chat_against_a_deployed_api_takes_its_token_and_stream_url(online, db, local_server, monkeypatch):
    """--token: the issuer's token, whose subject chats (not USER); --stream-url: where the streamed turns go (a
    deployed stack's StreamUrl), not --url: one that answers nothing is said as such, in one line."""
    from eros.config import settings
    from eros_dev.tokens import issue_token, local_jwt_key

    token = issue_token("erin", settings(), local_jwt_key())
    out = chat(monkeypatch, local_server.url, "hello\n", "--token", token)
    assert out.getvalue().splitlines()[1:] == ["luna> lovely", "   (recalled: nothing)"]
    users = db.execute("SELECT DISTINCT user_id FROM engine.chat_messages").fetchall()
    assert [u["user_id"] for u in users] == ["erin"]
    out = chat(monkeypatch, local_server.url, "hello\n", "--stream-url", "http://127.0.0.1:9")
    [_, line] = out.getvalue().splitlines()
    assert line == "[no answer] the connection broke (ConnectError): the message may have been stored"
    out = chat(monkeypatch, local_server.url, "hello\n", "--stream-url", local_server.url + "/")
    assert out.getvalue().splitlines()[1:] == ["luna> lovely", "   (recalled: nothing)"]


def test_eros_chat_says_a_failed_turn_in_one_line(online, db, local_server, monkeypatch):
    """The model fails after the stream began: an `error` event, printed as one line with its status and code; the
    next message is taken as usual."""
    fake_llm = online[0]
    fake_llm.push(*[Status(503)] * 2)  # the turn, and the one retry the client makes of a retryable error
    out = chat(monkeypatch, local_server.url, "first\nsecond\n")
    [_, failed, reply, recalled] = out.getvalue().splitlines()
    assert failed.startswith("[503 model_unavailable] ") and "your message was kept" in failed, failed
    assert (reply, recalled) == ("luna> lovely", "   (recalled: nothing)")
    # After some words: they stay on their line, and the error has a line of its own.
    fake_llm.responder = lambda body: "one two three four five six"
    fake_llm.push(BreakStream(3, error={"message": "upstream provider failed", "code": 502}))
    out = chat(monkeypatch, local_server.url, "third\n")
    [_, partial, failed] = out.getvalue().splitlines()
    assert partial == "luna> one two three " and failed.startswith("[503 model_unavailable] "), (partial, failed)


# --- one-line errors ---------------------------------------------------------------------------------------------

def test_every_cli_failure_is_one_line_unless_debugging(db, env, tmp_path, capsys, monkeypatch):
    assert cli.main(["invoke", "chat", str(tmp_path / "missing.json")]) == 2  # what was given cannot be used
    assert err_lines(capsys) == [f"eros invoke: cannot read {tmp_path / 'missing.json'}: No such file or directory"]
    (tmp_path / "bad.json").write_text("{not json")
    assert cli.main(["invoke", "extract", str(tmp_path / "bad.json")]) == 2
    [line] = err_lines(capsys)
    assert line.startswith(f"eros invoke: {tmp_path / 'bad.json'} is not JSON")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    assert cli.main(["invoke", "sweeper", str(tmp_path / "binary.json")]) == 2
    [line] = err_lines(capsys)
    assert line.startswith(f"eros invoke: {tmp_path / 'binary.json'} is not JSON")

    def broken(*args, **kwargs):
        raise RuntimeError("the disk is full\nand a second line")

    monkeypatch.setattr("eros.account.stored", broken)
    assert cli.main(["forget", "dora"]) == 1
    assert err_lines(capsys) == ["eros forget: RuntimeError: the disk is full (EROS_DEBUG=1 shows where)"]
    env(EROS_DEBUG="1")
    with pytest.raises(RuntimeError):
        cli.main(["forget", "dora"])


# --- eros sweep ---------------------------------------------------------------------------------------------------

def test_eros_sweep_says_what_it_did_and_how_not_to_wait(online, db, capsys):
    api = Api()
    sid = api.session()
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I grow tomatoes on my balcony"})[0] == 200
    capsys.readouterr()  # the turn's own output

    assert cli.main(["sweep"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("claimed 0 session(s)") and "1800 s after its last message" in out and "--now" in out

    assert cli.main(["sweep", "--now"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("claimed 1 session(s)")
    assert out[1] == f"  session {sid} of alice: extracted (1 memories)"


def test_eros_sweep_json_is_the_sweeps_answer_with_its_jobs(online, db, capsys):
    api = Api()
    sid = api.session()
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I grow tomatoes on my balcony"})[0] == 200
    capsys.readouterr()
    assert cli.main(["sweep", "--now", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["claimed"] == 1 and answer["invoked"] == 1
    [job] = answer["jobs"]
    assert (job["session_id"], job["outcome"], job["memories"]) == (sid, "extracted", 1)


# --- eros invoke ----------------------------------------------------------------------------------------------------

def test_eros_invoke_runs_each_functions_handler_on_its_sample_event(online, db, tmp_path, capsys):
    assert cli.main(["invoke", "chat", str(EVENTS / "chat_health.json")]) == 0
    assert json.loads(capsys.readouterr().out)["statusCode"] == 200
    assert cli.main(["invoke", "chat", str(EVENTS / "chat_turn.json")]) == 0  # its session is not in this database
    assert json.loads(capsys.readouterr().out)["statusCode"] == 404

    api = Api()
    sid = api.session()
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I grow tomatoes on my balcony"})[0] == 200
    db.execute("UPDATE engine.chat_sessions SET last_active_at = now() - interval '2 hours'")
    capsys.readouterr()
    assert cli.main(["invoke", "sweeper", str(EVENTS / "sweeper_schedule.json")]) == 0
    swept = json.loads(capsys.readouterr().out)
    assert swept["claimed"] == 1 and swept["jobs"][0]["outcome"] == "extracted"

    # A dead-lettered extract event (the Lambda destination record, its requestPayload the event) replays:
    # this claim no longer holds the session, so nothing is written twice.
    record = {"version": "1.0", "requestContext": {"condition": "RetriesExhausted"},
              "requestPayload": json.loads((EVENTS / "extract_session.json").read_text())
              | {"session_id": sid, "user_id": "alice"}}
    (tmp_path / "dead.json").write_text(json.dumps(record))
    assert cli.main(["invoke", "extract", str(tmp_path / "dead.json")]) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "not-claimed"


def test_eros_invoke_runs_the_stream_function_and_prints_its_chunks(online, db, tmp_path, capsys):
    """The stream function's handler on the function URL sample: its status line, then the turn's events as the
    handler yields them; the sample's own token (not this stack's) is refused as the function URL would."""
    from eros import streaming

    sid = Api().session()
    sample = json.loads((EVENTS / "chat_stream_turn.json").read_text())
    sample["rawPath"] = sample["requestContext"]["http"]["path"] = f"/v1/sessions/{sid}/turns/stream"
    (tmp_path / "turn.json").write_text(json.dumps(sample))
    capsys.readouterr()
    assert cli.main(["invoke", "chat-stream", str(tmp_path / "turn.json"), "--as", "alice"]) == 0
    head, _, body = capsys.readouterr().out.partition("\n")
    assert json.loads(head)["statusCode"] == 200
    sent = list(streaming.events(body.encode()))
    assert [name for name, _ in sent][0] == "turn" and sent[-1][0] == "done"
    assert "".join(data["delta"] for name, data in sent if name == "delta") == sent[-1][1]["reply"] == "lovely"

    assert cli.main(["invoke", "chat-stream", str(EVENTS / "chat_stream_turn.json")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[0])["statusCode"] == 401 and "--as USER" in captured.err
    assert cli.main(["invoke", "chat-stream", str(EVENTS / "sweeper_schedule.json")]) == 2  # a wrong event: as chat
    assert "not a Lambda function URL event" in err_lines(capsys)[0]


def test_a_wrong_shaped_event_is_one_line_naming_what_is_wrong(db, tmp_path, capsys):
    """Issue 29: `eros invoke chat` on a sweeper's event printed Python internals (KeyError: 'requestContext')."""
    def invoke(function: str, event: object) -> str:
        (tmp_path / "event.json").write_text(json.dumps(event))
        assert cli.main(["invoke", function, str(tmp_path / "event.json")]) == 2
        [line] = err_lines(capsys)
        assert "Error" not in line and "Traceback" not in capsys.readouterr().err
        return line.removeprefix(f"eros invoke: {tmp_path / 'event.json'} ")

    schedule, job = (json.loads((EVENTS / name).read_text())
                     for name in ("sweeper_schedule.json", "extract_session.json"))
    health = json.loads((EVENTS / "chat_health.json").read_text())
    chat = "an API Gateway HTTP API event (payload format 2.0)"
    assert invoke("chat", schedule) == (f"is an EventBridge event (the sweeper's), not {chat}: it has no rawPath,"
                                        " requestContext.http.method, requestContext.stage"
                                        " (events/chat_health.json is one)")
    assert invoke("chat", {}).startswith(f"is an empty object, not {chat}: it has no rawPath")
    assert invoke("chat", [health]) == f"is not {chat}: it is an array, not an object (events/chat_health.json is one)"
    no_stage = health | {"requestContext": {k: v for k, v in health["requestContext"].items() if k != "stage"}}
    assert invoke("chat", no_stage) == f"is not {chat}: it has no requestContext.stage (events/chat_health.json is one)"
    assert invoke("chat", health | {"headers": ["accept"]}).endswith(": headers must be an object"
                                                                      " (events/chat_health.json is one)")
    assert invoke("chat", {"version": "1.0", "httpMethod": "GET", "path": "/v1/health"}).startswith(
        "is a REST API event (payload format 1.0), not ")

    extract = "an extract job (a session's or a deep pass's)"
    assert invoke("extract", schedule) == (f"is an EventBridge event (the sweeper's), not {extract}: session_id:"
                                           " missing; user_id: missing; claim_token: missing"
                                           " (events/extract_session.json is one)")
    assert invoke("extract", job | {"session_id": "s-1"}).startswith(f"is not {extract}: session_id: Input should be"
                                                                     " a valid UUID")
    assert invoke("extract", {"kind": "deep_pass", "user_id": "alice"}) == (
        f"is not {extract}: claim_token: missing (events/extract_session.json is one)")

    assert invoke("sweeper", job) == ("is an extract job, not a scheduled event (EventBridge): it has no detail-type"
                                      " (events/sweeper_schedule.json is one)")
    assert invoke("sweeper", schedule | {"detail-type": "Object Created"}).startswith(
        "is not a scheduled event (EventBridge): its detail-type is 'Object Created', not 'Scheduled Event'")


# --- doctor and the deep health check ------------------------------------------------------------------------------

def test_doctor_checks_the_database_the_schema_and_each_provider(online, db, capsys):
    fake_llm, fake_voyage = online
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out] == [["ok", "database"], ["ok", "schema"], ["ok", "chat"],
                                                   ["ok", "extraction"], ["ok", "embedder"],
                                                   ["WARN", "calibration"]]  # issue 30: no calibration, no failure
    assert "'voyage-3.5-lite' has NO calibration" in out[5] and "eros calibrate" in out[5]
    assert "pgvector" in out[0] and migration_files()[-1][0] in out[1]  # the newest migration
    chat, extraction = fake_llm.requests[-2:]  # one model, called as a turn and as an extraction (JSON) call it
    assert chat["json"]["max_tokens"] == 1 and extraction["json"]["response_format"] == {"type": "json_object"}
    assert fake_voyage.requests[-1]["json"]["input"] == ["ok"]

    fake_llm.push(Status(401))
    assert cli.main(["doctor", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "failed" and report["checks"]["chat"]["status"] == "failed"
    assert "401" in report["checks"]["chat"]["detail"] and report["checks"]["embedder"]["status"] == "ok"
    assert report["checks"]["extraction"]["status"] == "failed"  # the same model: not called twice


def test_doctor_checks_every_configured_model_by_its_setting(online, db, env, capsys):
    """Issue 29: with only the chat model checked, `eros doctor` said ok while every extraction failed."""
    fake_llm, fake_voyage = online
    fake_llm.served, fake_voyage.served = {"llama3.1"}, {"voyage-3.5-lite"}
    env(CHAT_MODEL="llama3.1")  # the README's recipe for an OpenAI-compatible server: extraction follows
    assert cli.main(["doctor"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out[2:]] == [["ok", "chat"], ["ok", "extraction"], ["ok", "embedder"],
                                                      ["WARN", "calibration"]]
    assert "EXTRACT_MODEL = CHAT_MODEL 'llama3.1'" in out[3]

    env(EXTRACT_MODEL="anthropic/claude-haiku-4.5", EMBED_MODEL="voyage-9")
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out[2:]] == [["ok", "chat"], ["BAD", "extraction"], ["BAD", "embedder"],
                                                      ["WARN", "calibration"]]
    assert "set EXTRACT_MODEL to a model it serves" in out[3] and "set EMBED_MODEL to a model it serves" in out[4]


def test_the_deep_health_check_needs_a_token_and_names_a_schema_behind(online, db):
    api = Api()
    assert api.call("GET", "/v1/health/deep", user=None)[0] == 401
    status, report = api.call("GET", "/v1/health/deep")
    assert status == 200 and report["status"] == "ok" and set(report["checks"]) == {"database", "schema", "chat",
                                                                                    "extraction", "embedder",
                                                                                    "calibration"}
    assert report["checks"]["calibration"]["status"] == "warning" and report["calibration"]["source"] == "default"
    db.execute("DELETE FROM engine.schema_migrations WHERE name = '0009_usage_by_model'")
    try:
        status, report = api.call("GET", "/v1/health/deep")
        assert status == 503 and "not applied: 0009_usage_by_model" in report["checks"]["schema"]["detail"]
    finally:
        db.execute("INSERT INTO engine.schema_migrations (name) VALUES ('0009_usage_by_model')")


def test_a_token_holder_cannot_make_the_deep_health_check_pay_the_providers_at_will(online, db, monkeypatch, capsys):
    """Issue 25, item 4: each GET /v1/health/deep paid one completion and one embedding, counted nowhere. Now a
    container calls the providers at most once per DEEP_HEALTH_CACHE_SECS; the database and schema checks still
    run on every request, and `eros doctor` (an operator's) always calls."""
    from eros import health

    fake_llm, fake_voyage = online
    clock = [1000.0]
    monkeypatch.setattr(health, "monotonic", lambda: clock[0], raising=False)
    api = Api()
    for _ in range(5):
        status, report = api.call("GET", "/v1/health/deep", user="mallory")
        assert status == 200 and report["checks"]["chat"]["status"] == "ok"
        clock[0] += 10
    assert (fake_llm.calls, fake_voyage.calls) == (2, 1)  # the chat model, and the same as extraction asks for JSON
    assert report["checks"]["chat"]["age_s"] == report["checks"]["embedder"]["age_s"] == 40.0
    assert report["checks"]["schema"]["age_s"] == 0.0  # the free checks are not kept
    assert db.execute("SELECT count(*) AS n FROM engine.user_usage").fetchone()["n"] == 0  # nobody's usage

    assert cli.main(["doctor", "--json"]) == 0  # the operator's check calls, whatever a container kept
    assert json.loads(capsys.readouterr().out)["checks"]["chat"]["age_s"] == 0.0
    assert (fake_llm.calls, fake_voyage.calls) == (4, 2)

    clock[0] += 300  # DEEP_HEALTH_CACHE_SECS after the last calls: the next request calls again
    fake_llm.push(Status(401))
    status, report = api.call("GET", "/v1/health/deep")
    assert status == 503 and "401" in report["checks"]["chat"]["detail"] and report["checks"]["chat"]["age_s"] == 0.0
    assert (fake_llm.calls, fake_voyage.calls) == (5, 3)  # the extraction's check is the failed chat model's
    assert api.call("GET", "/v1/health/deep")[0] == 503  # a failure is kept as long: asking again costs nothing
    assert (fake_llm.calls, fake_voyage.calls) == (5, 3)


# --- stop and Ctrl-C -------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# How long `make run` may take to answer in a fresh folder (initdb, Postgres, the migrations): ~5 s idle, over 60 s
# at a load average of 20 here. A deadline, not a wait: the test goes on at the first answer.
STARTS_WITHIN = 240


def start_stack(data: str, port: int, *, in_background: bool = False) -> subprocess.Popen:
    """`make run` in a fresh data folder: in a terminal's foreground, SIGINT at its default whatever this run
    inherited (a test run started in the background, `cmd &` from a script, has it ignored); ``in_background``:
    as `make run &` starts it, with SIGINT ignored."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "LLM_", "EMBED_", "OPENROUTER",
                                                                      "VOYAGE", "LOG_FORMAT", "POWERTOOLS_LOG"))}
    env |= {"EROS_DATA_DIR": data, "PORT": str(port), "DREAMING_TICK_SECS": "3600"}
    disposition = signal.SIG_IGN if in_background else signal.SIG_DFL
    process = subprocess.Popen([sys.executable, "-m", "eros_dev.cli", "serve"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))  # noqa: PLW1509
    deadline = time.monotonic() + STARTS_WITHIN
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the stack did not start: {process.communicate()[0][-2000:]}")


@pytest.fixture
def stack_folder() -> Iterator[Path]:
    """A folder for a Postgres of the test's own, outside pytest's temporary root. Under root, pgserver runs
    Postgres as the user pgserver and opens the folder's parents to it (o+rx), but every pytest session that
    starts meanwhile (another run, an xdist worker) takes those permissions off /tmp/pytest-of-root again: initdb,
    the server or pg_ctl then got "Permission denied" (the run's own database is in /tmp for the same reason)."""
    from eros_dev.stack import stop_embedded_postgres

    folder = Path(tempfile.mkdtemp(prefix="eros-stack-test-"))
    yield folder
    for pid_file in folder.rglob("postmaster.pid"):  # a test that failed midway
        stop_embedded_postgres(pid_file.parent)
    shutil.rmtree(folder, ignore_errors=True)


# How long a stopping stack may take to exit: it stops its Postgres (a shutdown checkpoint), more than 15 s at a
# load average of 15 here. A deadline, not a wait: the test goes on as soon as the process has exited.
STOPS_WITHIN = 120


def test_ctrl_c_and_eros_stop_stop_what_make_run_started(stack_folder, env, capsys):
    data, port = str(stack_folder / "data"), free_port()
    pg = stack_folder / "data" / "pg" / "postmaster.pid"

    stack = start_stack(data, port)
    assert pg.exists() and (stack_folder / "data" / "serve.pid").read_text() == str(stack.pid)
    stack.send_signal(signal.SIGINT)  # Ctrl-C
    out, _ = stack.communicate(timeout=STOPS_WITHIN)
    assert stack.returncode == 0 and "stopped the embedded Postgres" in out and "Traceback" not in out
    assert not pg.exists() and not (stack_folder / "data" / "serve.pid").exists()
    # Issue 29: a fresh folder's start is a short banner, not a JSON log line per migration and function file.
    schema = f"  schema   : {migration_files()[-1][0]} (applied now: {len(migration_files())} migration(s) and "
    assert schema in out and "migration applied" not in out and '{"level"' not in out, out

    stack = start_stack(data, port, in_background=True)  # `make stop` from another terminal
    env(EROS_DATA_DIR=data)
    assert cli.main(["stop"]) == 0
    assert capsys.readouterr().out.strip() == f"stopped eros serve (pid {stack.pid})"
    out, _ = stack.communicate(timeout=STOPS_WITHIN)
    assert stack.returncode == 0 and "stopped the embedded Postgres" in out  # it stopped itself, cleanly
    assert not pg.exists()
    assert cli.main(["stop"]) == 0 and capsys.readouterr().out.strip() == "nothing was running"


def test_a_postgres_stopped_by_someone_else_meanwhile_counts_as_stopped(stack_folder, monkeypatch):
    """`eros stop` and the `eros serve` that started the embedded Postgres may both stop it: whoever saw it
    running and then finds it gone (pg_ctl: no server) has what it asked for, not an error."""
    from eros_dev import stack

    folder = stack_folder / "pg"
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from eros_dev import stack;"
                    " stack.embedded_postgres(Path(sys.argv[1]))", str(folder)], cwd=ROOT, check=True,
                   timeout=STOPS_WITHIN)  # in a process of its own, as `make run` starts it
    assert stack.stop_embedded_postgres(folder) and not stack.postgres_running(folder)  # the other stopper
    seen = iter([True])  # this one looked before the other had finished
    running = stack.postgres_running
    monkeypatch.setattr(stack, "postgres_running", lambda f=None: next(seen, None) or running(f))
    assert stack.stop_embedded_postgres(folder)
    assert stack.stop_embedded_postgres(folder) is False  # and now it sees that nothing runs


# --- the OpenAPI document --------------------------------------------------------------------------------------------

def test_the_openapi_document_declares_the_bearer_scheme_real_statuses_and_answers(db):
    status, spec = Api().call("GET", "/v1/openapi.json")
    assert status == 200
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "bearerFormat": "JWT",
        "description": "a token of the configured issuer; its `sub` is the user"}
    assert spec["security"] == [{"bearer": []}]
    operations = {f"{m.upper()} {p}": op for p, ops in spec["paths"].items() for m, op in ops.items()}
    assert operations["GET /v1/health"]["security"] == [{}] and operations["GET /v1/openapi.json"]["security"] == [{}]
    for name, op in operations.items():
        ok = [code for code in op["responses"] if code.startswith("2")]
        assert len(ok) == 1, name
        if name not in ("GET /v1/health", "GET /v1/openapi.json"):
            assert "401" in op["responses"], name
        if ok[0] != "204" and name != "GET /v1/openapi.json":
            assert "schema" in op["responses"][ok[0]]["content"]["application/json"], name
    assert set(operations["POST /v1/sessions"]["responses"]) >= {"201", "404"}
    assert "204" in operations["DELETE /v1/memories/{memory_id}"]["responses"]


def test_the_docs_page_is_compressed_for_a_browser(local_server):
    plain = httpx.get(f"{local_server.url}/v1/docs", headers={"Accept-Encoding": "identity"})
    packed = httpx.get(f"{local_server.url}/v1/docs", headers={"Accept-Encoding": "gzip"})
    assert plain.status_code == packed.status_code == 200 and packed.headers["content-encoding"] == "gzip"
    assert int(packed.headers["content-length"]) < len(plain.content) / 3  # the bytes on the wire
    assert packed.text == plain.text  # httpx decoded them: the same page
