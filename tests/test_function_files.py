"""The database's functions have one current definition each, in eros/sql/functions, and an applied migration is
never edited (eros.migrate, migration 0020, eros/sql/functions/README.md)."""

from __future__ import annotations

import logging

import psycopg
import pytest
from helpers import migrate_before
from test_migrations import fresh_database  # noqa: F401 -- the fixture

from eros import migrate as runner
from eros.migrate import EditedMigration, checksum, function_files, migrate, migration_files

# Defined by migrations, not by the files: what stored data depends on (README.md, "What may not go here") ...
VERSIONED = {"engine.lexemes(text)", "engine.embedding_signs(vector)", "engine.instance_terms(uuid,tsvector)",
             "engine.fill_signs()", "engine.keep_relationship_terms()"}
# Fill the stored signs (migration 0023) and engine.relationship_terms (migration 0027).
VERSIONED_TRIGGERS = {"companion_memories_fill_signs", "companion_memories_keep_relationship_terms",
                      "companion_memories_keep_relationship_terms_on_change"}
# ... and the previous release's signatures, kept for its containers until a later migration drops them (the _v2
# rule): the recall functions of 0015, replaced by the _v2 ones that take engine.recall_knobs_v2 (recall.sql keeps
# the old knobs type while they exist). 0022 dropped 0018's open_turn and admit.
RETIRING = {
    "engine.recall_layer(text,text,uuid,text,vector,text,timestamp with time zone,engine.recall_knobs,integer,"
    "integer)",
    "engine.recall_candidates(text,uuid,vector,text,timestamp with time zone,engine.recall_knobs,integer,integer,"
    "integer,double precision)",
    "engine.turn_recall(text,uuid,vector,text,timestamp with time zone,engine.recall_knobs,integer,integer,integer,"
    "double precision)",
}


def definitions(conn) -> dict:
    """Every function, procedure, composite type and trigger of schema engine, as the catalog defines it."""
    functions = {r[0]: r[1:] for r in conn.execute(
        "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text, p.proowner::regrole::text"
        " FROM pg_proc p WHERE p.pronamespace = 'engine'::regnamespace")}
    types = {r[0]: r[1] for r in conn.execute(
        "SELECT t.typname, array_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum)"
        " FROM pg_type t JOIN pg_class c ON c.oid = t.typrelid AND c.relkind = 'c'"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0"
        " WHERE t.typnamespace = 'engine'::regnamespace GROUP BY t.typname")}
    triggers = {r[0]: r[1] for r in conn.execute(
        "SELECT tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
        " WHERE c.relnamespace = 'engine'::regnamespace AND NOT t.tgisinternal")}
    return {"functions": functions, "types": types, "triggers": triggers}


def test_a_fresh_database_holds_exactly_the_files_definitions(fresh_database):  # noqa: F811 -- the fixture
    """After a fresh migrate, dropping every function, type and trigger the files may define and applying the
    files alone gives the same catalog: each definition the database holds is its file's (not a migration's
    older body), and none is missing from the files but the versioned and the retiring ones."""
    migrate(fresh_database)
    with psycopg.connect(fresh_database) as conn:
        migrated = definitions(conn)
        assert migrated["functions"].keys() >= VERSIONED | RETIRING
        assert {"engine.open_turn_v2", "engine.admit_v2"} <= {f.split("(")[0] for f in migrated["functions"]}
        with conn.transaction(force_rollback=True):
            # Every type but those the retiring functions take or return, which would go with them.
            kept = {r[0] for r in conn.execute(
                "SELECT t.typname FROM pg_proc p JOIN pg_type t ON t.oid = ANY (p.proargtypes::oid[] || p.prorettype)"
                " WHERE p.oid::regprocedure::text = ANY (%s)", (list(RETIRING),))}
            for name in migrated["types"].keys() - kept:
                conn.execute(f"DROP TYPE engine.{name} CASCADE")
            for function in migrated["functions"].keys() - VERSIONED - RETIRING:
                conn.execute(f"DROP ROUTINE IF EXISTS {function} CASCADE")  # a type's CASCADE may have gone first
            assert definitions(conn)["triggers"].keys() == VERSIONED_TRIGGERS  # the others went with their function
            for _, sql in function_files():
                conn.execute(sql)
            assert definitions(conn) == migrated


def test_a_changed_function_file_is_applied_again_alone_and_the_grants_hold(fresh_database, monkeypatch):  # noqa: F811
    migrate(fresh_database)
    with psycopg.connect(fresh_database) as conn:
        before = dict(conn.execute("SELECT name, applied_at FROM engine.schema_objects").fetchall())
    assert migrate(fresh_database) == []  # unchanged files: nothing
    edited = [(name, sql.replace("BEGIN\n    UPDATE engine.chat_sessions", "BEGIN\n    -- edited\n"
                                 "    UPDATE engine.chat_sessions") if name == "functions/turn" else sql)
              for name, sql in function_files()]
    assert edited != function_files()
    monkeypatch.setattr(runner, "function_files", lambda: edited)
    assert migrate(fresh_database) == ["functions/turn"]
    with psycopg.connect(fresh_database) as conn:
        assert "-- edited" in conn.execute("SELECT pg_get_functiondef('engine.touch_session'::regproc)").fetchone()[0]
        after = dict(conn.execute("SELECT name, applied_at FROM engine.schema_objects").fetchall())
        assert {name for name in after if after[name] != before[name]} == {"functions/turn"}
        assert conn.execute("SELECT sha256 FROM engine.schema_objects WHERE name = 'functions/turn'").fetchone()[0] \
            == checksum(dict(edited)["functions/turn"])
        # Replaced, not re-created: the app role keeps what it may call and gets nothing more.
        assert conn.execute("SELECT has_function_privilege('eros_app', 'engine.touch_session(text, uuid)', 'EXECUTE'),"
                            " has_function_privilege('eros_app', 'engine.grant_app_role()', 'EXECUTE'),"
                            " has_table_privilege('eros_app', 'engine.schema_objects', 'UPDATE'),"
                            " has_table_privilege('eros_app', 'engine.personas', 'UPDATE')").fetchone() \
            == (True, False, False, False)
    assert migrate(fresh_database) == []


def edited_migration(name: str) -> list[tuple[str, str]]:
    return [(n, sql + "\n-- edited after it was applied\n" if n == name else sql) for n, sql in migration_files()]


def test_an_edited_applied_migration_is_refused_on_deploy_and_a_warning_locally(fresh_database, monkeypatch,  # noqa: F811
                                                                                 caplog):
    migrate(fresh_database)
    monkeypatch.setattr(runner, "migration_files", lambda: edited_migration("0016_turn_in_the_database"))
    pending = [(name, sql + "-- changed\n" if name == "functions/spend" else sql) for name, sql in function_files()]
    monkeypatch.setattr(runner, "function_files", lambda: pending)
    with pytest.raises(EditedMigration, match=r"applied migration 0016_turn_in_the_database\.sql was edited"):
        migrate(fresh_database)
    with psycopg.connect(fresh_database) as conn:  # refused before anything ran
        assert conn.execute("SELECT sha256 FROM engine.schema_objects WHERE name = 'functions/spend'").fetchone()[0] \
            == checksum(dict(function_files())["functions/spend"])  # this module's own: the files as shipped
    caplog.clear()
    assert migrate(fresh_database, local=True) == ["functions/spend"]  # the local stack goes on
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage().startswith("applied migration 0016_turn_in_the_database.sql was edited")
    with psycopg.connect(fresh_database) as conn:  # the recorded checksum stays the applied text's
        assert conn.execute("SELECT sha256 FROM engine.schema_migrations WHERE name = '0016_turn_in_the_database'"
                            ).fetchone()[0] == checksum(dict(migration_files())["0016_turn_in_the_database"])


def test_migrations_applied_before_checksums_get_their_files_checksum_then_are_held_to_it(fresh_database,  # noqa: F811
                                                                                       monkeypatch, caplog):
    """A database migrated by the runner before 0020 (names only): the first run records each file's checksum
    as it is then, and says so; an edit after that is refused."""
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        migrate_before(conn, "0020")
    caplog.set_level(logging.INFO, logger="eros")
    assert migrate(fresh_database)[0].startswith("0020")
    [first_seen] = [r for r in caplog.records if r.getMessage().startswith("checksums recorded")]
    assert first_seen.migrations == [name for name, _ in migration_files() if name < "0020"]  # not 0020: applied now
    with psycopg.connect(fresh_database) as conn:
        recorded = dict(conn.execute("SELECT name, sha256 FROM engine.schema_migrations").fetchall())
    assert recorded == {name: checksum(sql) for name, sql in migration_files()}
    monkeypatch.setattr(runner, "migration_files", lambda: edited_migration("0004_consolidation"))
    with pytest.raises(EditedMigration, match=r"0004_consolidation\.sql"):
        migrate(fresh_database)


def test_a_file_the_database_refuses_is_named_and_nothing_of_it_is_applied(fresh_database, monkeypatch):  # noqa: F811
    migrate(fresh_database)
    broken = [(name, sql + "\nCREATE FUNCTION engine.broken() RETURNS int LANGUAGE sql AS $$ SELECT nope $$;\n"
               if name == "functions/turn" else sql) for name, sql in function_files()]
    monkeypatch.setattr(runner, "function_files", lambda: broken)
    with pytest.raises(runner.FileFailed, match=r"^sql/functions/turn\.sql failed: UndefinedColumn: column \"nope\""):
        migrate(fresh_database)
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT to_regproc('engine.broken')").fetchone()[0] is None
        assert conn.execute("SELECT sha256 FROM engine.schema_objects WHERE name = 'functions/turn'").fetchone()[0] \
            == checksum(dict(function_files())["functions/turn"])
