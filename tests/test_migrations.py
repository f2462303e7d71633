"""Migrations: ordered, tracked, idempotent, and safe when two runners race on a fresh database."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from eros.migrate import function_files, migrate, migration_files, personas


@pytest.fixture
def fresh_database(database_url):
    name = f"fresh_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    params = conninfo_to_dict(database_url) | {"dbname": name}
    yield make_conninfo(**params)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_files_are_numbered_in_order_and_commented():
    files = migration_files()
    numbers = [int(name[:4]) for name, _ in files]
    assert numbers == list(range(1, len(files) + 1))
    assert all(sql.lstrip().startswith("--") for _, sql in files), "every migration starts by saying why"


def test_rerunning_is_a_no_op(fresh_database):
    first = migrate(fresh_database)
    assert first == [name for name, _ in migration_files() + function_files()]
    assert migrate(fresh_database) == []
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT count(*) FROM engine.schema_migrations").fetchone()[0] == len(migration_files())
        assert conn.execute("SELECT count(*) FROM engine.schema_objects").fetchone()[0] == len(function_files())
        assert conn.execute("SELECT count(*) FROM engine.personas").fetchone()[0] == len(personas())


def test_two_concurrent_runners_apply_each_migration_once(fresh_database):
    results, errors = [], []
    barrier = threading.Barrier(4)

    def run():
        barrier.wait()
        try:
            results.append(migrate(fresh_database))
        except Exception as exc:  # any error fails the test below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    applied = sorted(name for result in results for name in result)
    assert applied == sorted(name for name, _ in migration_files() + function_files())  # each once, across runners


def test_schema_constraints_hold(db):
    from pgvector import Vector

    vec = Vector([1.0] + [0.0] * 511)
    for bad in [("x", "gossip", 0.5), ("x", "fact", 1.5), ("x", "fact", -0.1), ("", "fact", 0.5)]:
        with pytest.raises(psycopg.errors.CheckViolation):
            db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance)"
                       " VALUES ('u', %s, %s, %s, %s)", (bad[0], vec, bad[1], bad[2]))
    with pytest.raises(psycopg.errors.DataException):
        db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding) VALUES ('u', 'x', %s)",
                   (Vector([1.0, 0.0]),))


# --- the application's DML-only role (migration 0006, eros.migrate.ensure_app_user) --------------------------

@pytest.fixture
def app_user(database_url):
    """A login made the way the migrate function makes it, on the shared test database; dropped afterwards."""
    from eros.migrate import ensure_app_user

    name = f"eros_app_test_{uuid.uuid4().hex[:8]}"
    assert ensure_app_user(database_url, name, "pw-1") == "created"
    yield name, make_conninfo(database_url, user=name, password="pw-1")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")


def test_the_app_role_is_a_nologin_group_that_owns_nothing(db):
    role = db.execute("SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb FROM pg_roles"
                      " WHERE rolname = 'eros_app'").fetchone()
    assert role == {"rolcanlogin": False, "rolsuper": False, "rolcreaterole": False, "rolcreatedb": False}
    owned = db.execute("SELECT count(*) AS n FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner"
                       " WHERE r.rolname = 'eros_app'").fetchone()["n"]
    assert owned == 0


def test_the_app_user_reads_and_writes_rows(db, app_user):
    _, dsn = app_user
    with psycopg.connect(dsn, autocommit=True) as app:
        app.execute("INSERT INTO engine.persona_instances (id, user_id, persona_id) VALUES (%s, 'u1', 'luna')",
                    (instance := uuid.uuid4(),))
        app.execute("INSERT INTO engine.chat_sessions (id, user_id, instance_id) VALUES (%s, 'u1', %s)",
                    (session := uuid.uuid4(), instance))
        app.execute("INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id)"
                    " SELECT id, user_id, 'user', 'hello', 't1' FROM engine.chat_sessions WHERE id = %s",
                    (session,))  # an identity column: its sequence
        app.execute("UPDATE engine.chat_sessions SET last_active_at = now() WHERE id = %s", (session,))
        assert app.execute("SELECT count(*) FROM engine.personas").fetchone()[0] >= 1
        assert app.execute("SELECT count(*) FROM engine.schema_migrations").fetchone()[0] >= 6
        with app.transaction():
            app.execute("SELECT * FROM engine.chat_sessions WHERE id = %s FOR UPDATE SKIP LOCKED", (session,))
        app.execute("DELETE FROM engine.chat_messages WHERE session_id = %s", (session,))
        app.execute("DELETE FROM engine.chat_sessions WHERE id = %s", (session,))


@pytest.mark.parametrize("statement", [
    "CREATE TABLE engine.intruder (id int)",
    "CREATE TABLE public.intruder (id int)",
    "CREATE SCHEMA intruder",
    "DROP TABLE engine.chat_messages",
    "ALTER TABLE engine.chat_sessions ADD COLUMN intruder int",
    "ALTER TABLE engine.companion_memories DROP CONSTRAINT IF EXISTS companion_memories_pkey",
    "CREATE INDEX intruder ON engine.chat_messages (content)",
    "TRUNCATE engine.chat_messages",
    "DROP SCHEMA engine CASCADE",
    "ALTER ROLE eros_app LOGIN",
    "CREATE ROLE intruder LOGIN",
    "INSERT INTO engine.schema_migrations (name) VALUES ('9999_intruder')",
    "DELETE FROM engine.schema_migrations",
    "UPDATE engine.schema_objects SET sha256 = 'x'",
    # The turn's statements are functions (eros/sql/functions): the app cannot rewrite one to skip a check.
    "CREATE OR REPLACE FUNCTION engine.touch_session(of_user text, of_session uuid) RETURNS void"
    " LANGUAGE sql AS 'SELECT'",
    "ALTER FUNCTION engine.turn_recall RESET plan_cache_mode",
])
def test_the_app_user_cannot_change_the_schema(db, app_user, statement):
    _, dsn = app_user
    with psycopg.connect(dsn, autocommit=True) as app, pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute(statement)
    assert db.execute("SELECT count(*) AS n FROM information_schema.tables WHERE table_name = 'intruder'"
                      ).fetchone()["n"] == 0


# What the runtime does to each table or view (store/, the turn's functions in eros/sql/functions, the erasure, the
# retention), and so all the app role may do to it (eros/sql/functions/grants.sql). A table of a later migration
# must be named here with what its code does to it.
READ_WRITE = {"SELECT", "INSERT", "UPDATE", "DELETE"}
APP_TABLE_PRIVILEGES = {
    "schema_migrations": {"SELECT"},  # written by the migrations' own user
    "schema_objects": {"SELECT"},  # likewise
    "personas": {"SELECT"},  # seeded by the migrations' own user: no runtime path changes a persona's prompt;
    "persona_versions": {"SELECT"},  # a user's own characters are written by sql/functions/personas.sql alone
    "chat_messages": {"SELECT", "INSERT", "DELETE"},  # a message is never changed; retention and erasure delete
    "relationship_terms": {"SELECT", "INSERT", "DELETE"},  # the trigger of migration 0027, as the memory's writer
    "persona_instances": {"SELECT", "INSERT", "DELETE"},  # and UPDATE of user_id alone (below)
    "embedding_space": {"SELECT", "INSERT", "UPDATE"},  # sql/functions/embedding.sql's trigger records the model
    "embedding_calibrations": {"SELECT", "INSERT"},  # `eros calibrate` adds a row; none is ever changed
    "chat_sessions": READ_WRITE, "companion_memories": READ_WRITE, "user_deep_pass": READ_WRITE,
    "user_reembedding": READ_WRITE,
    "memory_events": READ_WRITE, "user_event_sequence": READ_WRITE,  # the events outbox (migration 0035)
    "user_usage": READ_WRITE, "user_model_usage": READ_WRITE, "provider_blocks": READ_WRITE,
    "apps": {"SELECT"},  # operators make, set and delete apps at the command line (migration 0036)
    "app_keys": {"SELECT", "INSERT", "UPDATE"},  # an app's operator keeps its keys; a row goes with its app only
    "app_webhooks": READ_WRITE,  # the operator API sets and deletes an app's endpoint (migration 0037)
    "webhook_deliveries": READ_WRITE,  # the sweeper's attempts; erasure and redrive (migration 0037)
    "user_consolidation": READ_WRITE,  # a view: user_deep_pass by the previous release's name (migration 0022)
}
# create_session's INSERT .. ON CONFLICT DO UPDATE SET user_id = EXCLUDED.user_id returns the existing instance.
APP_COLUMN_UPDATES = {("persona_instances", "user_id")}


def test_the_app_role_may_do_to_each_table_only_what_the_runtime_does(db):
    tables = {r["name"]: {p for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
                          if r[p.lower()]}
              for r in db.execute(
                  "SELECT c.relname AS name, " + ", ".join(
                      f"has_table_privilege('eros_app', c.oid, '{p}') AS {p.lower()}"
                      for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")) +
                  " FROM pg_class c WHERE c.relnamespace = 'engine'::regnamespace AND c.relkind IN ('r', 'p', 'v')"
                  " AND NOT c.relispartition").fetchall()}
    assert tables.keys() == APP_TABLE_PRIVILEGES.keys(), "name every table in APP_TABLE_PRIVILEGES"
    assert tables == APP_TABLE_PRIVILEGES
    columns = {(r["table_name"], r["column_name"]) for r in db.execute(
        "SELECT table_name, column_name FROM information_schema.column_privileges WHERE grantee = 'eros_app'"
        " AND table_schema = 'engine' AND privilege_type = 'UPDATE'").fetchall()}
    assert columns - {(t, c) for t, c in columns if "UPDATE" in APP_TABLE_PRIVILEGES.get(t, ())} == APP_COLUMN_UPDATES


@pytest.mark.parametrize("statement", [
    "UPDATE engine.personas SET system_prompt = 'Ignore your instructions'",
    "INSERT INTO engine.personas (id, name, description, system_prompt) VALUES ('intruder', 'x', 'x', 'x')",
    "DELETE FROM engine.personas",
    "UPDATE engine.chat_messages SET content = 'what I never said'",
    "UPDATE engine.persona_instances SET persona_id = 'nova'",
    "UPDATE engine.schema_migrations SET applied_at = now()",
    "TRUNCATE engine.user_usage",
    "SELECT setval(pg_get_serial_sequence('engine.chat_messages', 'id'), 1)",
])
def test_the_app_user_cannot_write_what_the_runtime_never_writes(db, app_user, statement):
    _, dsn = app_user
    prompts = db.execute("SELECT id, system_prompt FROM engine.personas ORDER BY id").fetchall()
    with psycopg.connect(dsn) as app, pytest.raises(psycopg.errors.InsufficientPrivilege):  # rolled back if not
        app.execute(statement)
    assert db.execute("SELECT id, system_prompt FROM engine.personas ORDER BY id").fetchall() == prompts


def test_the_grants_survive_a_migration_run_and_a_partitioned_schema(db, database_url):
    """eros.migrate grants again after every run (for tables another user created): the same narrow grants."""
    from eros.migrate import migrate

    db.execute("GRANT UPDATE ON engine.personas, engine.chat_messages TO eros_app")  # as before migration 0019
    migrate(database_url)
    assert not db.execute("SELECT has_table_privilege('eros_app', 'engine.personas', 'UPDATE') AS u").fetchone()["u"]
    assert not db.execute("SELECT has_table_privilege('eros_app', 'engine.chat_messages', 'UPDATE') AS u"
                          ).fetchone()["u"]


def test_the_whole_app_runs_as_the_app_user(db, app_user, env):
    """A chat turn, a listing, a sweep and an extraction through the handlers, connected as the app user:
    the grants are all the code needs."""
    from datetime import datetime, timedelta

    from apiclient import Api

    from eros.dreaming import session
    from eros.store import dreaming as store
    from eros_dev.lambda_runtime import LambdaContext, load_function

    name, dsn = app_user
    env(DATABASE_URL=dsn)
    api = Api()
    sid = api.session()
    status, turn = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I moved to Lisbon last spring"})
    assert status == 200, turn
    assert api.call("GET", f"/v1/sessions/{sid}/messages")[0] == 200
    db.execute("UPDATE engine.chat_sessions SET last_active_at = now() - interval '2 hours'")
    now = datetime.now(UTC)
    [row] = store.claim(now, now - timedelta(seconds=600), 10)
    result = load_function("extract").lambda_handler(session.event(row), LambdaContext("extract"))
    assert result["memories"] >= 1, result
    status, listing = api.call("GET", "/v1/memories")
    assert status == 200 and any(m["layer"] == "profile" for m in listing["memories"])
    from eros.db import connection
    assert connection().execute("SELECT current_user AS u").fetchone()["u"] == name


def test_every_route_and_dreaming_job_runs_as_the_app_user(db, app_user, env, tmp_path):
    """What the narrowed grants (0019) must still allow, as the app user: a second session with the same
    persona (its instance's ON CONFLICT update), the memory API (state, edit, restore, search, delete), the
    usage report, a sweep with an extraction and a deep pass, the transcript's retention, an export, and the
    erasure of everything."""
    from apiclient import Api
    from pgvector import Vector

    from eros.providers.offline import hash_embed
    from eros_dev.dreaming import sweep_locally

    name, dsn = app_user
    env(DATABASE_URL=dsn, EXPORT_DIR=str(tmp_path), EXPORT_BASE_URL="http://127.0.0.1:9/local",
        TRANSCRIPT_RETENTION_DAYS=1)
    api = Api()
    first, second = api.session(), api.session()  # the second reuses the instance: ON CONFLICT DO UPDATE
    assert api.call("POST", f"/v1/sessions/{first}/turns", {"content": "I moved to Lisbon last spring"})[0] == 200
    assert api.call("POST", f"/v1/sessions/{second}/turns", {"content": "I keep bees"})[0] == 200
    status, stated = api.call("POST", "/v1/memories", {"content": "Likes green tea", "category": "preference"})
    assert status == 201, stated
    status, edited = api.call("PATCH", f"/v1/memories/{stated['id']}", {"content": "Likes black tea"})
    assert status == 200, edited
    assert api.call("POST", f"/v1/memories/{stated['id']}/restore")[0] == 200
    assert api.call("POST", "/v1/memories/search", {"query": "tea"})[0] == 200
    assert api.call("DELETE", f"/v1/memories/{edited['id']}")[0] == 204
    assert api.call("GET", "/v1/usage")[0] == 200
    # A deep pass is due (copies of one fact, changed two hours ago); the sessions are old enough to expire.
    for days in (3, 2):
        db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, source, created_at)"
                   " VALUES ('alice', 'Keeps bees', %s, 'fact', 'dreaming', now() - make_interval(days => %s))",
                   (Vector(hash_embed("Keeps bees")), days))
    db.execute("UPDATE engine.user_deep_pass SET changed_at = now() - interval '2 h'")
    db.execute("UPDATE engine.chat_messages SET sent_at = now() - interval '3 days'")
    swept = sweep_locally(idle_now=True)
    assert sorted((job["kind"], job["outcome"]) for job in swept["jobs"]) == [
        ("deep_pass", "consolidated"), ("session", "extracted"), ("session", "extracted")], swept
    sweep_locally()  # the sessions are extracted through their messages: retention deletes them
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 0
    assert api.call("GET", "/v1/export")[0] == 200
    status, erased = api.call("DELETE", "/v1/me")
    assert status == 200 and erased["erased"]["sessions"] == 2, erased
    from eros.db import connection
    assert connection().execute("SELECT current_user AS u").fetchone()["u"] == name


def test_the_previous_releases_name_of_the_deep_pass_table_still_reads_and_writes_it(db, app_user):
    """0022 renamed engine.user_consolidation to engine.user_deep_pass and left the old name as a view, for the
    containers of the previous release during a deploy. Their statements (this release's, by the old name), as the
    app user, reach the table's rows: the change mark, the claim, the lease, the erasure's row lock, the spend's
    key share, the DELETE."""
    from eros.store import deep_pass as deep_pass_store
    from eros.store import usage as usage_store

    def old(statement: str) -> str:
        return statement.replace("engine.user_deep_pass", "engine.user_consolidation")

    _, dsn = app_user
    user, mark = "old-release", ("INSERT INTO engine.user_consolidation (user_id, changed_at) VALUES (%s, %s)"
                                 " ON CONFLICT (user_id) DO UPDATE SET changed_at = EXCLUDED.changed_at")
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as app:
        app.execute(mark, (user, datetime.now(UTC) - timedelta(hours=3)))
        app.execute(mark, (user, datetime.now(UTC) - timedelta(hours=2)))  # the conflict's UPDATE
        now = datetime.now(UTC)
        [claimed] = app.execute(old(deep_pass_store._CLAIM), {
            "quiet_before": now - timedelta(hours=1), "stale_before": now - timedelta(minutes=10), "now": now,
            "limit": 10}).fetchall()
        assert claimed == {"user_id": user, "claim_token": now}
        assert app.execute("UPDATE engine.user_consolidation SET started_at = %s WHERE user_id = %s"
                           " AND claimed_at = %s AND started_at IS NULL RETURNING user_id", (now, user, now)
                           ).fetchone() == {"user_id": user}
        with app.transaction():
            assert app.execute("SELECT user_id FROM engine.user_consolidation WHERE user_id = %s FOR UPDATE",
                               (user,)).fetchone() == {"user_id": user}
            assert app.execute(old(usage_store._HELD_BY["deep_pass"]), {"held": user}).fetchone() is not None
        row = db.execute("SELECT claimed_at, started_at, changed_at < now() - interval '90 minutes' AS marked"
                         " FROM engine.user_deep_pass WHERE user_id = %s", (user,)).fetchone()
        assert row == {"claimed_at": now, "started_at": now, "marked": True}
        assert app.execute("DELETE FROM engine.user_consolidation WHERE user_id = %s", (user,)).rowcount == 1
    assert db.execute("SELECT count(*) AS n FROM engine.user_deep_pass WHERE user_id = %s", (user,)
                      ).fetchone()["n"] == 0


def test_tables_of_later_migrations_are_granted_too(db, app_user, database_url):
    from eros.migrate import migrate

    _, dsn = app_user
    try:
        db.execute("CREATE TABLE engine.later_table (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, x text)")
        with psycopg.connect(dsn, autocommit=True) as app:  # default privileges of the migrating user
            app.execute("INSERT INTO engine.later_table (x) VALUES ('a')")
        db.execute("REVOKE ALL ON engine.later_table FROM eros_app")
        migrate(database_url)  # and every run grants again, whoever created the table
        with psycopg.connect(dsn, autocommit=True) as app:
            app.execute("INSERT INTO engine.later_table (x) VALUES ('b')")
    finally:
        db.execute("DROP TABLE IF EXISTS engine.later_table")


def test_ensure_app_user_updates_the_password_and_is_idempotent(database_url, app_user):
    from eros.migrate import ensure_app_user

    name, _ = app_user
    with psycopg.connect(database_url, autocommit=True) as conn:
        def verifier():
            return conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (name,)).fetchone()[0]

        before = verifier()
        assert before.startswith("SCRAM-SHA-256$")  # a verifier, never the password itself
        assert ensure_app_user(database_url, name, "pw-2") == "updated"
        assert verifier() != before and "pw-2" not in verifier()
        members = conn.execute("SELECT count(*) FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
                               " JOIN pg_roles u ON u.oid = m.member WHERE g.rolname = 'eros_app'"
                               " AND u.rolname = %s", (name,)).fetchone()[0]
        assert members == 1


def test_ensure_app_user_never_takes_over_a_powerful_role(database_url):
    from eros.migrate import UnsafeAppUser, ensure_app_user

    admin = conninfo_to_dict(database_url).get("user") or "postgres"
    with pytest.raises(UnsafeAppUser, match="migration's own user"):
        ensure_app_user(database_url, admin, "pw")
    name = f"eros_powerful_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN CREATEROLE")
        try:
            with pytest.raises(UnsafeAppUser, match="rolcreaterole"):
                ensure_app_user(database_url, name, "pw")
            assert conn.execute("SELECT count(*) FROM pg_auth_members m JOIN pg_roles u ON u.oid = m.member"
                                " WHERE u.rolname = %s", (name,)).fetchone()[0] == 0
        finally:
            conn.execute(f"DROP ROLE {name}")


def test_a_database_without_pgvector_is_named_as_such_and_a_migrated_one_round_trips_vectors(fresh_database):
    from pgvector import Vector

    from eros.db import connect

    with pytest.raises(psycopg.ProgrammingError, match="vector type is not in this database"):
        connect(fresh_database)
    migrate(fresh_database)
    with connect(fresh_database) as conn:
        loaded = conn.execute("SELECT %s::vector AS v", (Vector([1.5, -2.0, 0.25]),)).fetchone()["v"]
        assert loaded.to_list() == [1.5, -2.0, 0.25]
