"""`eros apps` and `eros keys`: an operator makes apps, sets their settings and keeps their API keys at the command
line (with the migration credentials); bad input is refused with a line that says what is wrong, and changes
nothing. (`eros apps delete` is in tests/test_app_deletion.py.)"""

from __future__ import annotations

import json
import re

import pytest

from eros import apps
from eros.errors import Unauthorized
from eros.store import apps as app_store
from eros_dev import cli


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def settings_of(app: str) -> dict:
    row = app_store.find(app)
    assert row is not None
    return row["settings"]


def test_eros_apps_create_set_and_list(db, capsys):
    code, out, err = run(capsys, "apps", "create", "acme", "--name", "Acme Corp", "--set", "daily_token_budget=5000",
                         "--set", "events_include_text=yes", "--set", "chat_model=acme/model-1")
    assert code == 0, err
    assert out.startswith("app acme (Acme Corp) created: settings chat_model=acme/model-1, daily_token_budget=5000,"
                          " events_include_text=True;") and "eros_app claim" in out
    assert settings_of("acme") == {"daily_token_budget": 5000, "events_include_text": True,
                                   "chat_model": "acme/model-1"}
    apps.forget()
    effective = apps.settings_for(apps.user_key("acme", "alice"))
    assert (effective.daily_token_budget, effective.events_include_text, effective.chat_model) == (
        5000, True, "acme/model-1")

    code, out, err = run(capsys, "apps", "set", "acme", "daily_token_budget=none", "history_messages=12",
                         "events_include_text=off")
    assert code == 0, err
    assert settings_of("acme") == {"history_messages": 12, "events_include_text": False, "chat_model": "acme/model-1"}
    assert out.startswith("acme: settings chat_model=acme/model-1, events_include_text=False, history_messages=12")

    app_store.add_key("acme", "one", "ek_xxxxxxx", b"\x01" * 32)
    app_store.add_key("acme", "two", "ek_yyyyyyy", b"\x02" * 32)
    app_store.revoke("acme", app_store.keys("acme")[0]["id"])
    db.execute("INSERT INTO engine.persona_instances (user_id, persona_id) VALUES (%s, 'luna'), (%s, 'luna'),"
               " (%s, 'kai'), ('bob', 'luna')",  # users with a session: what the listing counts
               (apps.user_key("acme", "alice"), apps.user_key("acme", "carol"), apps.user_key("acme", "carol")))
    code, out, err = run(capsys, "apps")  # list, the default action
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["id", "name", "created", "users", "live", "keys", "settings"]
    [acme] = [line for line in lines if line.startswith("acme ")]
    [default] = [line for line in lines if line.startswith("default ")]
    assert re.fullmatch(r"acme +Acme Corp +\d{4}-\d\d-\d\d +2 +1  chat_model=acme/model-1, events_include_text=False,"
                        r" history_messages=12", acme), acme
    assert re.fullmatch(r"default +default +\d{4}-\d\d-\d\d +1 +0  \(the deployment's\)", default), default


@pytest.mark.parametrize("argv, problem", [
    (["create", "Acme!", "--name", "x"], "the app id 'Acme!' must be 2 to 40 of a-z 0-9 -, starting with a letter"),
    (["create", "a", "--name", "x"], "the app id 'a' must be"),
    (["create", "acme"], "create needs --name, 1 to 200 characters"),
    (["create", "acme", "--name", "x", "--set", "bogus=1"],
     "unknown setting 'bogus': an app may set turns_per_minute,"),
    (["create", "acme", "--name", "x", "--set", "daily_token_budget=-5"],
     "daily_token_budget: Input should be greater than or equal to 0"),
    (["create", "acme", "--name", "x", "--set", "daily_token_budget=lots"], "daily_token_budget is a whole number, not"
                                                                             " 'lots'"),
    (["create", "acme", "--name", "x", "--set", "events_include_text=maybe"], "events_include_text is true or false"),
    (["create", "acme", "--name", "x", "--set", "history_messages=500"], "history_messages: Input should be less"),
    (["create", "acme", "--name", "x", "--set", "chat_model=two words"], "chat_model: String should match pattern"),
    (["create", "acme", "--name", "x", "--set", "budget"], "'budget' is not KEY=VALUE"),
])
def test_bad_input_to_eros_apps_is_refused_with_what_is_wrong_and_changes_nothing(db, capsys, argv, problem):
    code, out, err = run(capsys, "apps", *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"eros apps: {problem}") and err.count("\n") == 1, err
    assert [a["id"] for a in app_store.every()] == ["default"]
    assert settings_of("default") == {}


def test_eros_apps_refuses_a_taken_id_and_an_unknown_app(db, capsys):
    assert run(capsys, "apps", "create", "acme", "--name", "Acme")[0] == 0
    assert run(capsys, "apps", "create", "acme", "--name", "Other") == (
        1, "", "eros apps: the app id 'acme' is taken (by an app, or one being deleted)\n")
    assert run(capsys, "apps", "set", "globex", "turns_per_minute=3") == (
        1, "", "eros apps: there is no app 'globex' (`eros apps list` lists them)\n")
    assert run(capsys, "apps", "set", "acme", "turns_per_minute=-1")[0] == 2
    assert app_store.find("acme")["name"] == "Acme" and settings_of("acme") == {}


def test_eros_keys_create_list_rotate_revoke(db, capsys):
    assert run(capsys, "apps", "create", "acme", "--name", "Acme")[0] == 0
    code, out, err = run(capsys, "keys", "create", "--app", "acme", "--name", "backend")
    assert code == 0, err
    header, secret, notice = out.splitlines()
    key_id = re.fullmatch(r"key ([0-9a-f-]{36}) \(backend\) of app acme:", header)[1]
    assert apps.KEY_PATTERN.fullmatch(secret) and "not again" in notice
    assert apps.from_key(secret, "alice")[0] == apps.Caller("acme", apps.user_key("acme", "alice"), True)

    code, out, _ = run(capsys, "keys", "list", "--app", "acme")
    assert code == 0 and secret not in out and secret[:apps.KEY_SHOWN] + "..." in out
    assert re.fullmatch(rf"{key_id}  ek_\S+\.\.\.  backend +created \d{{4}}-\d\d-\d\d  used \S+ \S+ +live\n", out), out

    code, out, err = run(capsys, "keys", "rotate", key_id, "--app", "acme")
    assert code == 0, err
    said, header, rotated, notice = out.splitlines()
    assert said == f"key {key_id} of app acme: revoked, replaced by the key below" and "not again" in notice
    new_id = re.fullmatch(r"key ([0-9a-f-]{36}) \(backend\) of app acme:", header)[1]
    with pytest.raises(Unauthorized):
        apps.from_key(secret, "alice")  # the old key, refused at once
    assert apps.from_key(rotated, None)[0] == apps.Caller("acme", None, True)
    out = run(capsys, "keys", "list", "--app", "acme")[1]
    assert f"replaced by {new_id}" in out and out.count("live") == 1

    assert run(capsys, "keys", "revoke", new_id, "--app", "acme") == (
        0, f"key {new_id} of app acme: revoked (refused from now on)\n", "")
    with pytest.raises(Unauthorized):
        apps.from_key(rotated, "alice")
    assert run(capsys, "keys", "revoke", new_id, "--app", "acme") == (
        1, "", f"eros keys: {new_id} is not a live key of the app 'acme'\n")
    assert run(capsys, "keys", "rotate", key_id, "--app", "acme")[0] == 1  # a revoked key is not rotated


@pytest.mark.parametrize("argv, code, problem", [
    (["create", "--app", "nope"], 1, "there is no app 'nope' (`eros apps list` lists them)"),
    (["revoke", "not-a-uuid", "--app", "acme"], 2, "'not-a-uuid' is not a key id (`eros keys list --app acme`)"),
    (["create", "--app", "acme", "--name", " "], 2, "--name must be 1 to 100 characters"),
    (["revoke", "00000000-0000-0000-0000-000000000000", "--app", "acme"], 1,
     "00000000-0000-0000-0000-000000000000 is not a live key of the app 'acme'"),
])
def test_bad_input_to_eros_keys_is_refused_and_makes_no_key(db, capsys, argv, code, problem):
    assert run(capsys, "apps", "create", "acme", "--name", "Acme")[0] == 0
    assert run(capsys, "keys", *argv) == (code, "", f"eros keys: {problem}\n")
    assert app_store.keys("acme") == []


@pytest.mark.parametrize("argv, problem", [
    (["apps", "set", "default"], "the following arguments are required: KEY=VALUE"),
    (["apps", "list", "acme"], "unrecognized arguments: acme"),
    (["apps", "delete"], "the following arguments are required: id"),
    (["apps", "rename", "acme"], "invalid choice: 'rename'"),
    (["keys", "rotate", "--app", "acme"], "the following arguments are required: key_id"),
    (["keys", "list", "123", "--app", "acme"], "unrecognized arguments: 123"),
    (["keys", "list"], "the following arguments are required: --app"),
])
def test_a_command_line_missing_an_id_or_with_one_too_many_is_refused_with_its_usage(db, capsys, argv, problem):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2 and problem in capsys.readouterr().err
    assert [a["id"] for a in app_store.every()] == ["default"] and app_store.keys("default") == []


def test_options_may_come_before_or_after_the_ids(db, capsys, tmp_path):
    """`eros keys rotate --app acme KEY_ID` and `eros apps create --name Acme acme`, as people type them."""
    assert run(capsys, "apps", "create", "--name", "Acme", "acme")[0] == 0
    assert run(capsys, "apps", "set", "acme", "turns_per_minute=3")[0] == 0
    assert run(capsys, "keys", "create", "--name", "backend", "--app", "acme")[0] == 0
    [key] = app_store.keys("acme")
    code, out, err = run(capsys, "keys", "rotate", "--app", "acme", str(key["id"]))
    assert code == 0, err
    [new, old] = app_store.keys("acme")
    assert old["replaced_by"] == new["id"] and new["name"] == "backend"
    assert run(capsys, "keys", "revoke", "--app", "acme", str(new["id"]))[0] == 0
    assert all(k["revoked_at"] for k in app_store.keys("acme"))
    prompt = tmp_path / "guide.txt"
    prompt.write_text("You guide acme's users.")
    assert run(capsys, "personas", "set", "--app", "acme", "acme-guide", "--name", "Guide", "--prompt-file",
               str(prompt))[0] == 0
    assert run(capsys, "personas", "--app", "acme", "retire", "acme-guide")[0] == 0
    code, out, _ = run(capsys, "personas", "list", "--app", "acme")
    assert code == 0 and re.search(r"^acme-guide +v1 +retired", out, re.M)
    assert "luna" not in run(capsys, "personas", "--app", "acme")[1]
    assert run(capsys, "apps", "delete", "--yes", "acme")[0] == 0


def test_a_deleted_apps_keys_are_not_kept(db, capsys):
    from eros.store import account as account_store

    assert run(capsys, "apps", "create", "acme", "--name", "Acme")[0] == 0
    assert account_store.begin_app_deletion("acme")
    assert run(capsys, "keys", "create", "--app", "acme") == (
        1, "", "eros keys: there is no app 'acme' (`eros apps list` lists them)\n")
    code, out, _ = run(capsys, "apps", "list")
    assert code == 0 and re.search(r"^acme .* \(being deleted since \d{4}-\d\d-\d\d \d\d:\d\d\)$", out, re.M)


def test_eros_apps_export_writes_the_apps_record_to_a_new_file_or_standard_output(db, capsys, tmp_path):
    from apiclient import Api

    from eros.store import personas

    assert run(capsys, "apps", "create", "acme", "--name", "Acme")[0] == 0
    personas.keep_app("acme", "acme-guide", "Guide", "", "You guide acme's users.")
    api = Api()
    for app in ("acme", None):
        assert api.call("POST", "/v1/memories", {"content": f"Stated in {app or 'default'}", "category": "fact"},
                        app=app)[0] == 201
    capsys.readouterr()  # the API's own output
    out = tmp_path / "acme.jsonl"
    code, printed, err = run(capsys, "apps", "export", "acme", "--out", str(out))
    assert code == 0 and printed == "" and err.strip() == f"exported app acme: 1 users, {out.stat().st_size:,} bytes" \
        f" to {out}"
    header, alice = (json.loads(line) for line in out.read_text().splitlines())
    assert header["app"] == "acme" and [p["id"] for p in header["personas"]] == ["acme-guide"]
    assert (alice["app"], alice["user_id"]) == ("acme", "alice")
    assert [m["content"] for m in alice["memories"]] == ["Stated in acme"]
    code, printed, _ = run(capsys, "apps", "export", "acme")  # the same record, to standard output

    def timeless(line: str) -> dict:
        return {k: v for k, v in json.loads(line).items() if k != "exported_at"}

    assert code == 0 and [timeless(line) for line in printed.splitlines()] == \
        [timeless(line) for line in out.read_text().splitlines()]
    # Refused: an existing file (never overwritten), an unknown app (no file made), settings given to it.
    assert run(capsys, "apps", "export", "acme", "--out", str(out))[0] == 2
    assert run(capsys, "apps", "export", "initech", "--out", str(tmp_path / "x.jsonl"))[0] == 1
    assert not (tmp_path / "x.jsonl").exists()
    with pytest.raises(SystemExit):
        cli.main(["apps", "export", "acme", "colour=blue"])


def test_a_user_of_another_app_is_shown_as_subject_at_app_in_what_people_read(capsys):
    """A user key holds U+001F, which a terminal does not show: the sweep's report and the text logs name the user
    alice@acme (the first app's users as before)."""
    import logging

    from eros.observability import logger

    key = apps.user_key("acme", "alice")
    assert apps.shown(key) == "alice@acme" and apps.shown("alice") == "alice"
    lines = cli.swept({"claimed": 1, "users_claimed": 1, "jobs": [
        {"kind": "session", "session_id": "s1", "user_id": key, "outcome": "extracted", "memories": 1},
        {"kind": "deep_pass", "user_id": "bob", "outcome": "done"}]}, 1800, True)
    assert "  session s1 of alice@acme: extracted (1 memories)" in lines and "  deep pass of bob: done" in lines
    formatter = logger.registered_formatter
    record = logging.LogRecord("eros", logging.INFO, __file__, 1, "turn done", None, None)
    record.user_id = key
    assert "user=alice@acme" in formatter.text(record)
