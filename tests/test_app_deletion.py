"""Deleting an app whole (``eros apps delete``, eros.account.erase_app): every user of the app erased as one user is,
then the app's events, webhook, personas, keys and row; a catalog-driven scan of every table finds nothing of the app
afterwards; the other apps' users of the same subject keep every row; the app's tokens and keys are refused from
the moment its deletion begins."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from apiclient import Api
from helpers import go_idle

from eros import account, apps, webhooks
from eros.config import settings
from eros.store import account as account_store
from eros.store import apps as app_store
from eros.store import personas as persona_store
from eros_dev import cli
from eros_dev.dreaming import sweep_locally

SUBJECT = "alice"  # the same subject in every app: three different users
APPS = ("acme", "globex", apps.DEFAULT)
PROMPT = "You are {app}'s guide, zqx-{app}-prompt."  # unique text: a scan for it finds the persona's rows alone
EXTRACTED = json.dumps({"memories": [
    {"content": "Has a tortoise named Zebulon", "category": "relation", "importance": 0.8},
    {"content": "Lives in Porto", "category": "fact", "importance": 0.6},
], "episode": {"content": "The user told their companion about Zebulon", "occurred_at": None}})


@pytest.fixture
def online(providers, env):
    fake_llm, _ = providers
    fake_llm.responder = lambda body: EXTRACTED if body.get("response_format") else "fake reply"
    env(DREAMING_IDLE_SECS=1800, TURNS_PER_MINUTE=50, DAILY_TOKEN_BUDGET=1000000)
    return providers


def call(app: str, method: str, path: str, body=None, *, key: str | None = None) -> tuple[int, Any]:
    """A request to the chat function as ``app``'s alice: her token (the app claim naming the app, none for the
    first app's), or with ``key`` one of the app's API keys on the /server routes acting for her."""
    if key is None:
        return Api().call(method, path, body, user=SUBJECT, app=None if app == apps.DEFAULT else app)
    return Api().call(method, "/server" + path, body, user=None, headers={"x-api-key": key, "x-eros-user": SUBJECT})


def guide(app: str) -> str:
    return "luna" if app == apps.DEFAULT else f"{app}-guide"


def an_app(app: str) -> str:
    """The app (made as the migrating user, as `eros apps create` does), one persona of its own and an API key."""
    if app != apps.DEFAULT:
        assert app_store.create(app, app.title(), {"daily_token_budget": 900000})
        assert persona_store.keep_app(app, guide(app), "Guide", "", PROMPT.format(app=app)) == 1
    secret = apps.new_key()
    app_store.add_key(app, "backend", secret[:apps.KEY_SHOWN], apps.key_hash(secret))
    # A webhook nothing answers at: the sweeps leave its deliveries waiting (migration 0037).
    webhooks.set_webhook(app, "http://127.0.0.1:9/eros", False, settings().model_copy(update={
        "webhook_allow_http": True}))
    return secret


def chats(db, app: str) -> None:
    """alice of ``app``: a character of her own, two sessions of turns (one with it), a deep-pass row."""
    status, made = call(app, "POST", "/v1/personas", {"name": "Pip", "system_prompt": f"zqx-{app}-character"})
    assert status == 201, made
    for persona in (guide(app), made["id"]):
        status, session = call(app, "POST", "/v1/sessions", {"persona_id": persona})
        assert status == 201, session
        for text in ("I love my tortoise Zebulon", "He eats dandelions"):
            assert call(app, "POST", f"/v1/sessions/{session['id']}/turns", {"content": text})[0] == 200
    db.execute("INSERT INTO engine.user_deep_pass (user_id, changed_at) VALUES (%s, now()) ON CONFLICT DO NOTHING",
               (apps.user_key(app, SUBJECT),))


def dreamed_and_stated(apps_keys: dict[str, str]) -> None:
    """Every app's sessions dreamed (memories, an episode, relationship terms), then a memory each alice states
    through her app's key: its event is left in the outbox."""
    assert sweep_locally()["invoked"] == 2 * len(apps_keys)
    for app, key in apps_keys.items():
        status, body = call(app, "POST", "/v1/memories", {"content": "Plays the cello", "category": "fact"}, key=key)
        assert status == 201, body


def user_tables(db) -> list[str]:
    """Every table of the engine schema with a user key (read from information_schema: not the scan's reading)."""
    return [r["table_name"] for r in db.execute(
        "SELECT c.table_name FROM information_schema.columns c JOIN information_schema.tables t USING"
        " (table_schema, table_name) WHERE c.table_schema = 'engine' AND c.column_name = 'user_id'"
        " AND t.table_type = 'BASE TABLE' ORDER BY 1").fetchall()]


def rows_of(db, app: str) -> dict[str, int]:
    """The rows of ``app``'s alice in every table, and the app's personas (with versions) and keys, by equality."""
    user = apps.user_key(app, SUBJECT)
    found = {table: db.execute(f"SELECT count(*) AS n FROM engine.{table} WHERE user_id = %s",  # noqa: S608
                               (user,)).fetchone()["n"] for table in user_tables(db)}
    found["personas"] = db.execute("SELECT count(*) AS n FROM engine.personas WHERE app_id = %s OR owner_id = %s",
                                   (app, user)).fetchone()["n"]
    found["persona_versions"] = db.execute(
        "SELECT count(*) AS n FROM engine.persona_versions v JOIN engine.personas p ON p.id = v.persona_id"
        " WHERE p.app_id = %s OR p.owner_id = %s", (app, user)).fetchone()["n"]
    found["app_keys"] = db.execute("SELECT count(*) AS n FROM engine.app_keys WHERE app_id = %s",
                                   (app,)).fetchone()["n"]
    found["app_webhooks"] = db.execute("SELECT count(*) AS n FROM engine.app_webhooks WHERE app_id = %s",
                                       (app,)).fetchone()["n"]
    return found


def contents_of(db, app: str) -> dict[str, str | None]:
    """A digest of every row of ``app``'s alice in each table, and of the app's personas and keys: equal digests,
    equal rows."""
    user = apps.user_key(app, SUBJECT)
    digest = "SELECT md5(string_agg(r::text, '|' ORDER BY r::text)) AS d FROM engine.{} AS r WHERE "
    found = {table: db.execute(digest.format(table) + "user_id = %s", (user,)).fetchone()["d"]
             for table in user_tables(db)}
    found["personas"] = db.execute(digest.format("personas") + "app_id = %s OR owner_id = %s",
                                   (app, user)).fetchone()["d"]
    found["app_keys"] = db.execute(digest.format("app_keys") + "app_id = %s", (app,)).fetchone()["d"]
    return found


def mentioning(db, needle: str) -> dict[str, int]:
    """Rows of every table of the engine schema whose text (as Postgres prints the row) contains ``needle``."""
    tables = [r["table_name"] for r in db.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'engine'"
        " AND table_type = 'BASE TABLE'").fetchall()]
    found = {t: db.execute(f"SELECT count(*) AS n FROM engine.{t} AS r WHERE r::text LIKE %s",  # noqa: S608
                           (f"%{needle}%",)).fetchone()["n"] for t in tables}
    return {t: n for t, n in found.items() if n}


@pytest.fixture
def three_apps(online, db) -> dict[str, str]:
    keys = {app: an_app(app) for app in APPS}
    for app in APPS:
        chats(db, app)
    go_idle(db)
    dreamed_and_stated(keys)
    return keys


def test_deleting_an_app_leaves_nothing_of_it_and_keeps_the_other_apps_same_subject(three_apps, db):
    keys = three_apps
    acme = rows_of(db, "acme")
    for table in ("chat_sessions", "chat_messages", "companion_memories", "persona_instances", "user_deep_pass",
                  "user_usage", "user_model_usage", "relationship_terms", "memory_events", "user_event_sequence",
                  "personas", "persona_versions", "app_keys", "app_webhooks", "webhook_deliveries"):
        assert acme[table] > 0, (table, acme)  # every kind of row there is, for the deletion to delete
    others = {app: rows_of(db, app) for app in ("globex", apps.DEFAULT)}
    their_rows = {app: contents_of(db, app) for app in ("globex", apps.DEFAULT)}
    # The same history in each app (how many memories two concurrent extractions of one user keep may differ).
    assert {t for t, n in others["globex"].items() if n} == {t for t, n in acme.items() if n}
    scanned = account.app_stored("acme")
    assert scanned[0] == 1 and scanned[1]["apps"] == 1
    assert {t: n for t, n in scanned[1].items() if n} == {t: n for t, n in acme.items()
                                                         if n and t != "persona_versions"} | {"apps": 1}
    assert call("acme", "GET", "/v1/sessions")[0] == 200
    assert call("acme", "GET", "/v1/sessions", key=keys["acme"])[0] == 200

    done = account.erase_app("acme")

    assert done.users == 1
    assert done.erased["sessions"] == 2 and done.erased["messages"] == 8 and done.erased["personas"] == 1
    assert done.leftovers["personas"] == 1 and done.leftovers["persona_versions"] == 1  # the app's own guide
    assert done.leftovers["keys"] == 1 and done.leftovers["app"] == 1 and done.leftovers["events"] >= 1
    assert done.erased["webhook_deliveries"] >= 1 and done.leftovers["webhook"] == 1
    assert set(done.scan.values()) == {0} and "apps" in done.scan and "app_keys" in done.scan
    assert account_store.scan("acme") == done.scan
    assert set(rows_of(db, "acme").values()) == {0}
    # Nothing names the app's user, the app, its key or its prompts anywhere (read independently of the scan).
    for needle in (f"acme{apps.SEPARATOR}", "zqx-acme-", apps.key_hash(keys["acme"]).hex()):
        assert mentioning(db, needle) == {}, needle
    assert app_store.find("acme") is None and "acme" not in {a["id"] for a in app_store.every()}
    # The same subject in the other apps kept every row.
    assert {app: rows_of(db, app) for app in ("globex", apps.DEFAULT)} == others
    assert {app: contents_of(db, app) for app in ("globex", apps.DEFAULT)} == their_rows
    # The deleted app's token and key are refused; the others' are not.
    status, body = call("acme", "GET", "/v1/sessions")
    assert status == 401 and "'acme' is not served here" in body["message"]
    assert call("acme", "GET", "/v1/sessions", key=keys["acme"])[0] == 401
    for app in ("globex", apps.DEFAULT):
        assert call(app, "GET", "/v1/sessions")[0] == 200 and call(app, "GET", "/v1/sessions", key=keys[app])[0] == 200


def test_an_apps_tokens_and_keys_are_refused_once_its_deletion_begins_and_a_cut_deletion_is_finished(online, db):
    key = an_app("acme")
    chats(db, "acme")
    assert account_store.begin_app_deletion("acme")  # a deletion cut off right after its first step
    assert call("acme", "GET", "/v1/sessions")[0] == 401
    assert call("acme", "GET", "/v1/sessions", key=key)[0] == 401
    assert app_store.create("acme", "Acme again", {}) is None  # the id is not free until the deletion is done
    done = account.erase_app("acme")  # run again: finished
    assert done.users == 1 and done.erased["sessions"] == 2 and set(done.scan.values()) == {0}
    assert app_store.create("acme", "Acme again", {})  # and the id may be used again, with nothing of before
    assert call("acme", "GET", "/v1/sessions") == (200, {"sessions": []})


def test_the_first_app_an_unknown_app_and_a_deleted_app_are_refused_with_nothing_changed(online, db):
    an_app("acme")
    chats(db, "acme")
    done = account.erase_app("acme")
    before = {app: rows_of(db, app) for app in ("acme", apps.DEFAULT)}
    with pytest.raises(account.AppNotDeletable, match="the first app, default, cannot be deleted"):
        account.erase_app(apps.DEFAULT)
    for unknown in ("acme", "never-made"):  # deleting twice: the second finds no app, and changes nothing
        with pytest.raises(account.AppNotDeletable, match=f"there is no app '{unknown}'"):
            account.erase_app(unknown)
    assert {app: rows_of(db, app) for app in ("acme", apps.DEFAULT)} == before
    assert account_store.scan("acme") == done.scan and app_store.find(apps.DEFAULT)


def test_the_scan_reads_every_table_from_the_catalog(db):
    """A table a later migration adds, with a user key or an app column, is scanned without a line changed."""
    assert app_store.create("acme", "Acme", {})
    user = apps.user_key("acme", SUBJECT)
    try:
        db.execute("CREATE TABLE engine.zz_later (user_id text, note text)")
        db.execute("CREATE TABLE engine.zz_later_by_app (app_id text)")
        db.execute("INSERT INTO engine.zz_later VALUES (%s, 'x'), (%s, 'y'), ('alice', 'z')", (user, user))
        db.execute("INSERT INTO engine.zz_later_by_app VALUES ('acme'), ('default')")
        scanned = account_store.scan("acme")
        assert (scanned["zz_later"], scanned["zz_later_by_app"]) == (2, 1)
        assert account_store.app_users("acme") == [user]
        assert account_store.scan(apps.DEFAULT)["zz_later"] == 1
    finally:
        db.execute("DROP TABLE IF EXISTS engine.zz_later, engine.zz_later_by_app")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_eros_apps_delete_shows_what_it_deletes_asks_for_the_id_and_prints_the_scan(online, db, monkeypatch,
                                                                                  capsys):
    an_app("acme")
    an_app("globex")
    chats(db, "acme")
    stored = rows_of(db, "acme")
    capsys.readouterr()

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal, no --yes: refused
    assert cli.main(["apps", "delete", "acme"]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("stored for app acme (Acme): 1 users; rows: ") and "chat_messages 8" in out
    assert "--yes" in err and "at a terminal" in err
    monkeypatch.setattr("sys.stdin", Terminal("globex\n"))  # the wrong id
    assert cli.main(["apps", "delete", "acme"]) == 1
    out, err = capsys.readouterr()
    assert "Type the app id (acme) to confirm" in out and "nothing was deleted: the answer was not 'acme'" in err
    assert rows_of(db, "acme") == stored and app_store.find("acme")

    monkeypatch.setattr("sys.stdin", Terminal("acme\n"))
    assert cli.main(["apps", "delete", "acme"]) == 0
    out = capsys.readouterr().out
    assert "deleted app acme: 1 users erased (2 sessions, 8 messages" in out
    assert "1 keys, 1 app" in out and out.rstrip().endswith("scan of every table for the app's rows: none left")
    assert set(rows_of(db, "acme").values()) == {0} and app_store.find("globex")

    assert cli.main(["apps", "delete", "acme", "--yes"]) == 1  # again
    assert capsys.readouterr().err == "eros apps: there is no app 'acme' (`eros apps list` lists them)\n"
    assert cli.main(["apps", "delete", "default", "--yes"]) == 1
    assert "the first app, default, cannot be deleted" in capsys.readouterr().err


def test_an_apps_export_is_its_users_records_and_its_personas_and_nothing_of_another_app(three_apps, db):
    """Before an app goes, its operator takes its record: one line for the app (settings, personas with prompts),
    then each of its users' documents as GET /v1/export gives them; the same subject in another app is not in it."""
    out = io.BytesIO()
    done = account.export_app("acme", out)
    lines = [json.loads(line) for line in out.getvalue().decode().splitlines()]
    assert done.users == len(lines) - 1 == 1 and done.bytes == len(out.getvalue())
    header, [alice] = lines[0], lines[1:]
    assert header["app"] == "acme" and header["settings"] == {"daily_token_budget": 900000}
    assert {p["id"] for p in header["personas"]} == {"acme-guide"}
    assert (alice["app"], alice["user_id"]) == ("acme", SUBJECT)
    assert len(alice["sessions"]) == 2 and alice["memories"] and alice["personas"]
    text = out.getvalue().decode()
    assert "zqx-acme-prompt" in text and "zqx-acme-character" in text
    assert "zqx-globex" not in text and "zqx-default" not in text
    with pytest.raises(account.NoSuchApp):
        account.export_app("initech", io.BytesIO())
