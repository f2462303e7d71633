"""Usage and cost: every provider call is counted by purpose and model with the tokens the provider
reported (migration 0009), in the statement that counts it for the budget; ``GET /v1/usage`` reports the
caller's days with a cost estimated from the price table; ``eros usage`` is the operators' report."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from types import SimpleNamespace

import pytest
from apiclient import Api
from fakes import _tokens
from helpers import go_idle
from test_deep_pass import claim_one, copies

from eros import usage as usage_report
from eros.config import DEFAULT_PRICES, ModelPrice, Settings, SettingsError, settings
from eros.dreaming import deep_pass
from eros.providers import offline
from eros.store import usage as usage_store
from eros_dev import cli
from eros_dev.dreaming import sweep_locally

EXTRACTED = json.dumps({"memories": [{"content": "Bakes sourdough on Sundays", "category": "preference",
                                      "importance": 0.6}]})
MODELS = {"CHAT_MODEL": "test/chat-m", "EXTRACT_MODEL": "test/extract-m", "EMBED_MODEL": "embed-m"}


def answer(body: dict) -> str:
    """The fake model's reply, by what was asked: extraction, the deep pass, or a chat turn."""
    if not body.get("response_format"):
        return "a fake reply of some length"
    return json.dumps({"actions": []}) if '"actions"' in body["messages"][0]["content"] else EXTRACTED


@pytest.fixture
def online(providers, env):
    fake_llm, _ = providers
    fake_llm.responder = answer
    env(**MODELS)
    return providers


def itemised(db, user: str = "alice") -> Counter:
    """The user's usage rows as {(purpose, model, "calls" | "input" | "output"): n}, summed over days."""
    counts: Counter = Counter()
    for r in db.execute("SELECT * FROM engine.user_model_usage WHERE user_id = %s", (user,)).fetchall():
        for what in ("calls", "input_tokens", "output_tokens"):
            counts[(r["purpose"], r["model"], what)] += r[what]
    return counts


def reported(requests: list[dict], purpose: str) -> Counter:
    """What the fake providers reported for ``requests`` (the fakes count about four characters a token)."""
    counts: Counter = Counter()
    for request in requests:
        body = request["json"]
        if "messages" in body:
            usage = (sum(_tokens(str(m.get("content") or "")) for m in body["messages"]), _tokens(answer(body)))
        else:
            usage = (sum(_tokens(t) for t in body["input"]), 0)
        for what, n in zip(("calls", "input_tokens", "output_tokens"), (1, *usage), strict=True):
            counts[(purpose, body["model"], what)] += n
    return counts


def phase(db, providers, purpose: str, act) -> None:
    """``act`` makes provider calls of one ``purpose``: the usage rows grow by exactly what was reported."""
    fake_llm, fake_voyage = providers
    before, calls = itemised(db), (len(fake_llm.requests), len(fake_voyage.requests))
    act()
    made = fake_llm.requests[calls[0]:] + fake_voyage.requests[calls[1]:]
    assert made, f"{purpose}: no provider call was made"
    assert itemised(db) - before == reported(made, purpose)


def consistent(db, user: str = "alice") -> None:
    """The budget's day rows and the itemised rows count the same tokens."""
    items = db.execute("SELECT purpose, sum(input_tokens + output_tokens) AS n FROM engine.user_model_usage"
                       " WHERE user_id = %s GROUP BY purpose", (user,)).fetchall()
    by_purpose = {r["purpose"]: r["n"] for r in items}
    days = db.execute("SELECT sum(tokens) AS tokens, sum(chat_tokens) AS chat, sum(dream_tokens) AS dream"
                      " FROM engine.user_usage WHERE user_id = %s", (user,)).fetchone()
    assert days["tokens"] == sum(by_purpose.values())
    assert days["chat"] == by_purpose.get("chat", 0) + by_purpose.get("curation", 0)
    assert days["dream"] == by_purpose.get("extraction", 0) + by_purpose.get("deep_pass", 0)


# --- recording ------------------------------------------------------------------------------------------------

def test_every_provider_call_is_counted_by_purpose_and_model_with_the_tokens_reported(online, db):
    api = Api()
    sid = api.session()
    phase(db, online, "chat",
          lambda: api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I bake bread every Sunday"}))
    phase(db, online, "curation", lambda: (
        api.call("POST", "/v1/memories", {"content": "My oven is a wood-fired one", "category": "fact"}),
        api.call("POST", "/v1/memories/search", {"query": "what do I bake?"})))
    go_idle(db)
    phase(db, online, "extraction", lambda: sweep_locally())
    copies(db, "alice", "Lives in Shanghai", 3)
    db.execute("UPDATE engine.user_deep_pass SET changed_at = now() - interval '2 hours'")  # quiet long enough
    phase(db, online, "deep_pass",
          lambda: deep_pass.run(settings(), "alice", claim_one(db, "alice")))
    consistent(db)
    assert {key[:2] for key in itemised(db)} == {
        ("chat", "test/chat-m"), ("chat", "embed-m"), ("curation", "embed-m"),
        ("extraction", "test/extract-m"), ("extraction", "embed-m"), ("deep_pass", "test/extract-m")}


def test_a_call_that_reports_no_tokens_is_still_a_call(db, env, monkeypatch):
    """A provider that reports 0 tokens (here the offline stand-ins made to): the calls are counted, the budget's
    row is not touched."""
    monkeypatch.setattr(offline, "tokens", lambda text: 0)
    api = Api()
    sid = api.session()
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "hello"})[0] == 200
    assert itemised(db) == Counter({("chat", "offline/echo", "calls"): 1,
                                    ("chat", "offline/lexical-hash-512", "calls"): 1})
    assert db.execute("SELECT count(*) AS n FROM engine.user_usage").fetchone()["n"] == 0


def test_the_offline_stand_ins_report_tokens_as_a_provider_would_and_cost_nothing(db, env):
    """With no keys, usage can still be shown: the stand-ins count about a token per four characters (one per
    Chinese character), the turn is itemised with them, and the cost report prices them at 0."""
    assert [offline.tokens(text) for text in ("", "abcd", "abcde", "我住在上海")] == [0, 1, 2, 5]
    api = Api()
    sid = api.session()
    message = "I bake sourdough bread every Sunday morning"
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": message})[0] == 200
    counted = itemised(db)
    assert counted[("chat", "offline/lexical-hash-512", "input_tokens")] == offline.tokens(message)
    assert counted[("chat", "offline/echo", "input_tokens")] > offline.tokens(message)  # the prompt holds more
    assert counted[("chat", "offline/echo", "output_tokens")] > 0
    used = db.execute("SELECT * FROM engine.user_usage WHERE user_id = 'alice'").fetchone()
    assert used is not None
    assert usage_report.cost(settings().prices, "offline/echo", 10**6, 10**6) == 0.0


def test_dreaming_work_for_a_session_that_is_gone_counts_nothing(db):
    """A call made for a session erased meanwhile (store.usage's held_by): no row in either table."""
    now = datetime.now(UTC)
    call = usage_store.Call("extraction", "test/extract-m", 120, 30)
    usage_store.record("alice", call, now, held_by=("session", "00000000-0000-0000-0000-000000000000"))
    usage_store.record("alice", call, now, held_by=("deep_pass", "alice"))  # no deep-pass row either
    assert itemised(db) == Counter()
    assert db.execute("SELECT count(*) AS n FROM engine.user_usage").fetchone()["n"] == 0
    usage_store.record("alice", call, now)
    assert itemised(db)[("extraction", "test/extract-m", "input_tokens")] == 120
    consistent(db)


@pytest.mark.parametrize(("usage", "expected"), [
    ({"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}, (10, 4)),
    ({"total_tokens": 9}, (9, 0)),  # an embedding
    ({"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 20}, (16, 4)),  # e.g. reasoning tokens
    ({"prompt_tokens": -3, "completion_tokens": "4", "total_tokens": True}, (0, 0)),  # nonsense counts nothing
    ({}, (0, 0)), (None, (0, 0)),
])
def test_a_call_reads_the_usage_the_provider_reported(usage, expected):
    answer = SimpleNamespace(model="m", usage=usage)
    call = usage_store.Call.of("chat", answer)
    assert (call.input_tokens, call.output_tokens) == expected and call.model == "m"


# --- GET /v1/usage ----------------------------------------------------------------------------------------------

def spent(db, user: str, day: date, purpose: usage_store.Purpose, model: str, calls: int, input_tokens: int,
          output_tokens: int):
    usage_store.record(user, usage_store.Call(purpose, model, input_tokens, output_tokens),
                       datetime(day.year, day.month, day.day, 12, tzinfo=UTC))
    if calls > 1:
        db.execute("UPDATE engine.user_model_usage SET calls = %s WHERE user_id = %s AND day = %s AND purpose = %s"
                   " AND model = %s", (calls, user, day, purpose, model))


PRICES = json.dumps({"test/chat-m": {"input": 2.0, "output": 8.0}, "embed-m": {"input": 0.1}})


def test_the_report_prices_each_model_per_day_and_purpose_and_names_the_unpriced(db, env):
    env(MODEL_PRICES=PRICES, DAILY_TOKEN_BUDGET=5000000)
    today = datetime.now(UTC).date()
    yesterday = today - timedelta(days=1)
    spent(db, "alice", yesterday, "chat", "test/chat-m", 3, 1_000_000, 250_000)  # 2.00 + 2.00
    spent(db, "alice", yesterday, "chat", "embed-m", 3, 500_000, 0)  # 0.05
    spent(db, "alice", today, "extraction", "test/extract-m", 1, 4_000, 1_000)  # no price
    spent(db, "alice", today, "curation", "embed-m", 2, 10_000, 0)  # 0.001
    spent(db, "alice", today - timedelta(days=40), "chat", "test/chat-m", 1, 7, 7)  # outside the default range
    spent(db, "bob", today, "chat", "test/chat-m", 1, 999_999, 999_999)

    status, report = Api().call("GET", "/v1/usage")
    assert status == 200, report
    assert (report["from"], report["to"]) == (str(today - timedelta(days=29)), str(today))
    assert report["currency"] == "USD" and report["daily_token_budget"] == 5000000
    assert [d["day"] for d in report["days"]] == [str(yesterday), str(today)]
    first, second = report["days"]
    assert first["tokens"] == 1_750_000 and first["estimated_cost"] == pytest.approx(4.05)
    assert [(c["purpose"], c["model"], c["calls"], c["estimated_cost"]) for c in first["calls"]] == [
        ("chat", "embed-m", 3, pytest.approx(0.05)), ("chat", "test/chat-m", 3, pytest.approx(4.0))]
    assert [(c["purpose"], c["estimated_cost"]) for c in second["calls"]] == [
        ("curation", pytest.approx(0.001)), ("extraction", None)]
    assert second["estimated_cost"] == pytest.approx(0.001)  # the unpriced model counts nothing ...
    assert report["unpriced_models"] == ["test/extract-m"]  # ... and is named
    assert [(p["purpose"], p["calls"], p["input_tokens"]) for p in report["purposes"]] == [
        ("chat", 6, 1_500_000), ("extraction", 1, 4_000), ("curation", 2, 10_000)]
    assert report["totals"] == {"tokens": 1_765_000, "calls": 9, "input_tokens": 1_514_000,
                                "output_tokens": 251_000, "estimated_cost": pytest.approx(4.051)}

    status, old = Api().call("GET", f"/v1/usage?from={today - timedelta(days=45)}&to={today - timedelta(days=35)}")
    assert status == 200 and [d["tokens"] for d in old["days"]] == [14] and old["unpriced_models"] == []
    status, theirs = Api().call("GET", "/v1/usage", user="carol")  # nobody else's usage, ever
    assert status == 200 and theirs["days"] == [] and theirs["totals"]["tokens"] == 0


def test_the_default_prices_cover_the_default_models():
    cfg = Settings()
    assert {cfg.chat_model, cfg.extract_model, cfg.embed_model} <= set(cfg.prices)
    assert usage_report.cost(cfg.prices, "offline/echo", 10**9, 10**9) == 0.0
    assert usage_report.cost(cfg.prices, "somebody/else", 1, 1) is None


def test_model_prices_add_to_and_override_the_defaults():
    cfg = Settings.from_env({"MODEL_PRICES": json.dumps({"voyage-3.5-lite": {"input": 0.5}, "x/y": {"input": 1}})})
    assert cfg.prices["voyage-3.5-lite"] == ModelPrice(input=0.5) and cfg.prices["x/y"].output == 0
    assert cfg.prices["anthropic/claude-haiku-4.5"] == DEFAULT_PRICES["anthropic/claude-haiku-4.5"]


@pytest.mark.parametrize("value", ["{bad", "[1, 2]", '{"m": {"input": -1}}', '{"m": {"input": 1, "cached": 2}}',
                                   '{"m": {"output": 1}}', '{"m": "cheap"}'])
def test_a_bad_price_table_is_refused_at_start_naming_model_prices(value):
    with pytest.raises(SettingsError, match="^MODEL_PRICES"):
        Settings.from_env({"MODEL_PRICES": value})


@pytest.mark.parametrize(("query", "field"), [
    ("from=2026-13-01", "query.from"), ("to=2026-02-30", "query.to"), ("from=yesterday", "query.from"),
    ("from=", "query.from"), ("from=2026-12-05&to=2026-12-01", "query.from"),
    ("from=2020-01-01&to=2026-12-01", "query.from"), ("to=1", "query.to"),
    ("from=2026-12-01%27%20OR%201%3D1", "query.from"),
])
def test_a_bad_range_is_a_422_naming_the_parameter(db, query, field):
    status, body = Api().call("GET", f"/v1/usage?{query}")
    assert status == 422 and body["code"] == "invalid_request", body
    assert [e["field"] for e in body["errors"]] == [field] and field.split(".")[1] in body["message"]


@pytest.mark.parametrize(("query", "first", "last"), [
    ("to=0001-01-01", "0001-01-01", "0001-01-01"),  # the default 30 days would start before year 1
    ("to=0001-01-29", "0001-01-01", "0001-01-29"), ("to=0001-01-30", "0001-01-01", "0001-01-30"),
    ("to=0001-01-31", "0001-01-02", "0001-01-31"),
    ("from=0001-01-01&to=0001-01-01", "0001-01-01", "0001-01-01"),
    ("to=9999-12-31", "9999-12-02", "9999-12-31"), ("from=9999-12-31&to=9999-12-31", "9999-12-31", "9999-12-31"),
    ("from=9999-01-01&to=9999-12-31", "9999-01-01", "9999-12-31"),
])
def test_a_range_at_the_ends_of_the_calendar_is_reported_not_a_500(db, query, first, last):
    status, body = Api().call("GET", f"/v1/usage?{query}")
    assert status == 200, body
    assert (body["from"], body["to"], body["days"]) == (first, last, [])


@pytest.mark.parametrize(("query", "field"), [
    ("from=9999-12-31", "query.from"),  # after today
    ("from=0001-01-01", "query.from"),  # to today: more than a report covers
    ("from=0001-01-01&to=9999-12-31", "query.from"), ("from=0000-01-01", "query.from"),
    ("to=10000-01-01", "query.to"), ("to=-0001-01-01", "query.to"), ("to=9999-12-32", "query.to"),
])
def test_a_range_beyond_the_calendar_is_a_422_naming_the_parameter(db, query, field):
    status, body = Api().call("GET", f"/v1/usage?{query}")
    assert status == 422 and [e["field"] for e in body["errors"]] == [field], body


def test_usage_needs_a_token(db):
    status, body = Api().call("GET", "/v1/usage", user=None)
    assert status == 401, body


def test_the_openapi_document_describes_the_report(db):
    status, spec = Api().call("GET", "/v1/openapi.json")
    assert status == 200
    route = spec["paths"]["/v1/usage"]["get"]
    assert {p["name"] for p in route["parameters"]} == {"from", "to"}
    assert {"200", "422"} <= set(route["responses"])


# --- eros usage -----------------------------------------------------------------------------------------------

def test_the_operators_report_lists_users_costliest_first(db, env, capsys):
    env(MODEL_PRICES=PRICES)
    today = datetime.now(UTC).date()
    spent(db, "alice", today, "chat", "test/chat-m", 2, 100_000, 10_000)  # 0.28
    spent(db, "bob", today, "chat", "test/chat-m", 5, 1_000_000, 0)  # 2.00
    spent(db, "bob", today, "extraction", "mystery-model", 1, 50, 5)
    spent(db, "carol", today, "curation", "embed-m", 1, 100, 0)

    assert cli.main(["usage"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out[2:5]]
    assert [r[0] for r in rows] == ["bob", "alice", "carol"]
    assert rows[0][-1] == "2.0000" and rows[1][-1] == "0.2800" and rows[0][1] == "6"
    assert "3 users" in out[5] and "mystery-model" in out[-1]

    assert cli.main(["usage", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    bob = report["users"][0]
    assert bob["user_id"] == "bob" and bob["purposes"]["extraction"] == 55 and bob["tokens"] == 1_000_055

    assert cli.main(["usage", "--user", "alice"]) == 0
    out = capsys.readouterr().out
    assert "test/chat-m" in out and "0.2800" in out and "bob" not in out

    assert cli.main(["usage", "--limit", "1"]) == 0
    assert "and 2 more users" in capsys.readouterr().out


def test_the_operators_report_refuses_a_bad_range(db, capsys):
    assert cli.main(["usage", "--from", "2026-12-05", "--to", "2026-12-01"]) == 1
    assert "--from: 2026-12-05 is after to" in capsys.readouterr().err
    assert cli.main(["usage", "--to", "0001-01-01"]) == 0  # the default range stops at the calendar's first day
    assert "0001-01-01" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli.main(["usage", "--from", "soon"])
    assert exited.value.code == 2 and "not a date" in capsys.readouterr().err
