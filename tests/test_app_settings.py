"""An app's own settings (eros.apps.AppSettings, engine.apps.settings): limits, budgets, models, retention and the
events' text, each over the deployment's for that app's users alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from apiclient import Api
from pydantic import ValidationError

from eros import apps, dreaming, events
from eros.config import settings
from eros.store import apps as app_store

pytestmark = pytest.mark.integration


def an_app(db, app: str, **overrides) -> None:
    """The app, with these settings and a persona of its own (``<app>-guide``: a new app has none)."""
    from eros.store import personas

    app_store.create(app, app.title(), apps.AppSettings(**overrides).overrides(), db)
    personas.keep_app(app, f"{app}-guide", "Guide", "", "You are a guide.", db)


def session(api: Api, app: str | None) -> str:
    return api.session(app=app, persona=f"{app}-guide" if app else "luna")


def test_an_apps_turn_limit_and_budget_hold_its_users_and_no_one_else(db):
    an_app(db, "acme", turns_per_minute=1)
    api = Api()
    mine, theirs = session(api, "acme"), session(api, None)
    assert api.call("POST", f"/v1/sessions/{mine}/turns", {"content": "hello"}, app="acme")[0] == 200
    status, body = api.call("POST", f"/v1/sessions/{mine}/turns", {"content": "again"}, app="acme")
    assert status == 429 and body["code"] == "rate_limited" and body["limit"] == 1
    for n in range(3):  # the deployment sets no limit: the first app's alice is not held by acme's
        assert api.call("POST", f"/v1/sessions/{theirs}/turns", {"content": f"hello {n}"})[0] == 200
    an_app(db, "globex", daily_token_budget=1)
    spent = session(api, "globex")
    assert api.call("POST", f"/v1/sessions/{spent}/turns", {"content": "hello"}, app="globex")[0] == 200
    status, body = api.call("POST", f"/v1/sessions/{spent}/turns", {"content": "again"}, app="globex")
    assert status == 429 and body["code"] == "budget_exhausted"
    assert api.call("GET", "/v1/usage", app="globex")[1]["daily_token_budget"] == 1
    assert api.call("GET", "/v1/usage")[1]["daily_token_budget"] is None


def test_an_apps_models_answer_and_dream_for_its_users(db, providers):
    fake_llm, _ = providers
    an_app(db, "acme", chat_model="acme/chat-model", extract_model="acme/extract-model")
    api = Api()
    for app in ("acme", None):
        sid = session(api, app)
        assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I moved to Porto"}, app=app)[0] == 200
    chat_models = [r["json"]["model"] for r in fake_llm.requests]
    assert chat_models == ["acme/chat-model", settings().chat_model]
    from eros_dev.dreaming import sweep_locally

    fake_llm.reset()
    sweep_locally(idle_now=True)
    extract_models = {r["json"]["model"] for r in fake_llm.requests}
    assert extract_models == {"acme/extract-model", settings().extract_model}


def old_transcripts(db) -> None:
    """A session of acme's, globex's and the first app's alice, each with a message 40 days old, extracted."""
    api = Api()
    old = datetime.now(UTC) - timedelta(days=40)
    for app in ("acme", "globex", None):
        sid = session(api, app)
        db.execute("INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, sent_at)"
                   " SELECT id, user_id, 'user', 'long ago', 't1', %s FROM engine.chat_sessions WHERE id = %s",
                   (old, sid))
    db.execute("UPDATE engine.chat_sessions SET extraction_watermark = (SELECT max(id) FROM engine.chat_messages"
               " m WHERE m.session_id = chat_sessions.id), extracted_at = now()")


def test_each_app_keeps_its_transcripts_as_long_as_it_says(db):
    an_app(db, "acme", transcript_retention_days=30)
    an_app(db, "globex", transcript_retention_days=0)  # for ever, whatever the deployment says
    old_transcripts(db)

    def left() -> set[str]:
        return {apps.app_of(r["user_id"]) for r in db.execute("SELECT user_id FROM engine.chat_messages")}

    assert dreaming.sweep(settings(), lambda job: None).messages_expired == 1
    assert left() == {"globex", "default"}  # the deployment keeps transcripts (TRANSCRIPT_RETENTION_DAYS unset)
    db.execute("UPDATE engine.apps SET settings = '{}' WHERE id = 'acme'")  # back to the deployment's
    apps.forget()


def test_the_deployments_retention_applies_to_an_app_that_sets_none(db, env):
    env(TRANSCRIPT_RETENTION_DAYS=30)
    an_app(db, "acme")
    an_app(db, "globex", transcript_retention_days=0)
    old_transcripts(db)
    assert dreaming.sweep(settings(), lambda job: None).messages_expired == 2
    assert {apps.app_of(r["user_id"]) for r in db.execute("SELECT user_id FROM engine.chat_messages")} == {"globex"}


def test_an_app_that_opts_in_gets_its_memories_text_in_its_events_and_no_other_app_does(db):
    an_app(db, "acme", events_include_text=True)
    api = Api()
    for app in ("acme", None):
        assert api.call("POST", "/v1/memories", {"content": "Grows tomatoes", "category": "fact"}, app=app)[0] == 201
    sent: list[dict] = []

    class Recorder:
        def publish(self, batch):
            sent.extend(batch)
            return len(batch)

    assert events.publish_pending(settings(), Recorder()) == 2
    by_app = {e["app"]: e for e in sent}
    assert by_app["acme"]["content"] == "Grows tomatoes" and by_app["acme"]["user_id"] == "alice"
    assert "content" not in by_app["default"] and by_app["default"]["user_id"] == "alice"


def test_a_change_of_an_apps_settings_holds_once_the_cached_ones_are_older_than_the_cache(db, monkeypatch):
    an_app(db, "acme")
    assert apps.settings_for(apps.user_key("acme", "alice")).turns_per_minute == 0
    app_store.set_settings("acme", {"turns_per_minute": 5}, db)
    assert apps.settings_for(apps.user_key("acme", "alice")).turns_per_minute == 0  # cached a while
    monkeypatch.setattr(apps, "SETTINGS_CACHE_SECS", 0.0)
    assert apps.settings_for(apps.user_key("acme", "alice")).turns_per_minute == 5
    assert apps.settings_for("alice").turns_per_minute == 0


@pytest.mark.parametrize("bad", [{"turns_per_minute": -1}, {"daily_token_budget": "lots"}, {"colour": "blue"},
                                 {"chat_model": ""}, {"chat_model": "a model"}, {"chat_max_tokens": 3},
                                 {"history_messages": 1000}, {"transcript_retention_days": 1.5}])
def test_a_setting_an_app_cannot_have_is_refused_by_name(bad):
    with pytest.raises(ValidationError, match=next(iter(bad))):
        apps.AppSettings(**bad)


def test_an_app_id_is_lowercase_letters_digits_and_dashes(db):
    for good in ("acme", "a1", "acme-2"):
        assert apps.APP_ID.fullmatch(good)
    for bad in ("A", "acme_2", "-acme", "1acme", "a", "x" * 41, "acme\x1f"):
        assert not apps.APP_ID.fullmatch(bad)
    import psycopg

    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("INSERT INTO engine.apps (id, name) VALUES ('Bad_App', 'x')")
