"""Migrations: ordered, tracked, idempotent, and safe when two runners race on a fresh database."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from eros.migrate import migrate, migration_files, personas


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
    assert first == [name for name, _ in migration_files()]
    assert migrate(fresh_database) == []
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT count(*) FROM engine.schema_migrations").fetchone()[0] == len(first)
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
    assert applied == sorted(name for name, _ in migration_files())  # each exactly once, across runners


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
