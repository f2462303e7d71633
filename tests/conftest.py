"""Shared fixtures: one embedded Postgres 16 + pgvector for the whole run, a clean schema per test,
and helpers to call the Lambda handlers in-process with real API Gateway events.

Tiers (pyproject.toml registers the markers; ``pytest -m unit`` runs the fast tier alone):

* ``unit``: no database, no servers, no subprocess -- pure functions, parsing, template checks;
* ``integration``: the embedded Postgres and/or loopback fake providers and servers;
* ``e2e``: the whole local stack over HTTP, subprocesses, fault injection, fuzzing, bench smoke runs.

A module says ``pytestmark = pytest.mark.e2e`` (or a test its own marker); every other test gets its tier
from the fixtures it uses (``TIER_FIXTURES``): integration if it reaches the database or a server,
unit otherwise. A unit test that opens a socket or starts a process fails (``_unit_isolation``), and a
test with two tiers stops the run at collection."""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Fixtures registered once for every module: the fake providers (fake_llm, fake_voyage, skipped_sleeps) and
# moto's Lambda for the sweeper's fan-out (sweeper, aws). Plain helpers are in helpers.py.
pytest_plugins = ["fakes", "moto_lambda"]

# Some machines export PYTHONDONTWRITEBYTECODE: then every process of the run (each xdist worker, each
# local-stack and fault-injection subprocess, each function copy) compiles the package, the tests and their
# rewritten asserts from source again. The run keeps bytecode in __pycache__ (git-ignored) instead.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Tests never reach real providers or AWS, whatever the developer's shell has exported.
for name in ("OPENROUTER_API_KEY", "VOYAGE_API_KEY", "LLM_BASE_URL", "EMBED_BASE_URL", "PROVIDER_SECRET_ARN",
             "DATABASE_SECRET_ARN", "DATABASE_URL", "EXTRACT_FUNCTION_NAME", "EVENT_BUS_NAME"):
    os.environ.pop(name, None)
# The memory events the run's sweeps publish (eros.events) go to a file of this process, never the checkout's .data.
os.environ["EVENTS_LOG"] = os.path.join(tempfile.mkdtemp(prefix="eros-events-"), "events.jsonl")
os.environ.update({"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                   "AWS_SECRET_ACCESS_KEY": "testing", "POWERTOOLS_TRACE_DISABLED": "true",
                   "POWERTOOLS_LOG_LEVEL": "WARNING",
                   # The logs as Lambda writes them (tests read them as JSON, and the EMF metric blobs);
                   # test_terminal_output.py covers the terminal's text form.
                   "LOG_FORMAT": "json",
                   "LOCAL_JWT_SECRET": "test-only-signing-key-for-local-tokens-0123456789"})

# The run's Postgres, started by pytest_configure in a thread of its own so that initdb, the server's start
# and the migrations (~2 s, mostly waiting on processes) overlap the collection of the tests (~3 s).
_database: concurrent.futures.Future | None = None


def _start_database():
    import pgserver

    from eros.migrate import migrate

    # Deleted at the end of the run (each run's data is ~100 MB; left behind, they filled /tmp).
    server = pgserver.get_server(tempfile.mkdtemp(prefix="eros-test-pg-"), cleanup_mode="delete")
    url = server.get_uri()
    _throwaway_durability(url)
    migrate(url)
    return server, url


def _runs_database_tests(config) -> bool:
    """False for an xdist controller (its workers run the tests) and for a run of the unit tier alone."""
    from _pytest.mark.expression import Expression

    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return False
    expression = config.option.markexpr
    if not expression:
        return True
    compiled = Expression.compile(expression)
    return compiled.evaluate(lambda name, /, **_: name == "integration") or compiled.evaluate(
        lambda name, /, **_: name == "e2e")


def pytest_configure(config):
    global _database
    if _runs_database_tests(config):
        # Imported here, not in the thread: two threads importing the same modules at once can see each
        # other's half-initialised modules.
        import pgserver  # noqa: F401

        import eros.migrate  # noqa: F401

        _database = concurrent.futures.ThreadPoolExecutor(1, "postgres").submit(_start_database)


def pytest_unconfigure(config):
    if _database is not None:
        server, _ = _database.result()
        server.cleanup()


@pytest.fixture(scope="session")
def database_url() -> str:
    global _database
    if _database is None:  # a run pytest_configure did not expect to need it (e.g. `-m unit` plus a path)
        _database = concurrent.futures.ThreadPoolExecutor(1, "postgres").submit(_start_database)
    _, url = _database.result()
    os.environ["DATABASE_URL"] = url
    return url


def _throwaway_durability(url: str) -> None:
    """This server's data dies with the run, so a commit need not wait for the disk: no fsync, no
    synchronous commit, no full-page writes (each autocommitted statement of a test otherwise waits for a
    WAL flush). Tests about crashes and restarts run their own server with the defaults (test_db_restart)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session", autouse=True)
def _one_botocore_loader():
    """Every new boto3 session reads and parses botocore's JSON models again (Powertools makes a session per
    parameters provider, and the tests a new provider each): ~0.1 s a client. The files never change during
    a run, so the sessions share one loader (its caches included)."""
    import functools

    import botocore.session

    original = botocore.session.create_loader
    botocore.session.create_loader = functools.lru_cache(maxsize=None)(original)
    yield
    botocore.session.create_loader = original


def reset_process_state() -> None:
    """Forget cached settings, providers, connections and what the database said of the embedding space (tests
    change the environment and clean the database)."""
    from eros import apps, calibrated, db, providers
    from eros.config import settings

    settings.cache_clear()
    apps.forget()
    providers.reset()
    calibrated.reset()
    db.reset()


# Children before parents: a DELETE of a handful of rows is several times cheaper than a TRUNCATE (which
# takes exclusive locks and rewrites files), and one statement batch is one round trip.
def clean_schema() -> str:
    """What every test's ``db`` starts from: no user's rows, and the personas as seeded (users' characters and
    operators' new personas and versions go: migration 0030)."""
    from eros.migrate import personas

    seeded = json.dumps([p["id"] for p in personas()])
    return ";".join([*(f"DELETE FROM engine.{table}" for table in (
        "companion_memories", "chat_messages", "chat_sessions", "user_deep_pass", "persona_instances",
        "provider_blocks", "user_usage", "user_model_usage", "user_reembedding", "embedding_space",
        "embedding_calibrations", "memory_events", "user_event_sequence")),  # the events last: the DELETEs write some
        "DELETE FROM engine.personas WHERE owner_id IS NOT NULL"
        f" OR id NOT IN (SELECT jsonb_array_elements_text('{seeded}'::jsonb))",
        "DELETE FROM engine.persona_versions WHERE version > 1",
        "UPDATE engine.personas p SET name = v.name, description = v.description, system_prompt = v.system_prompt,"
        " version = 1, retired_at = NULL FROM engine.persona_versions v WHERE v.persona_id = p.id AND v.version = 1"
        " AND (p.version, p.retired_at) IS DISTINCT FROM (1, NULL)",
        # Apps (migration 0036): the first app alone, as migrated; no webhook nor delivery (migration 0037).
        "DELETE FROM engine.webhook_deliveries", "DELETE FROM engine.app_webhooks",
        "DELETE FROM engine.app_keys", "DELETE FROM engine.apps WHERE id <> 'default'",
        "UPDATE engine.apps SET settings = '{}', deleted_at = NULL WHERE id = 'default'"
        " AND (settings, deleted_at) IS DISTINCT FROM ('{}'::jsonb, NULL)"])


@pytest.fixture(scope="session")
def _shared_connection(database_url):
    """One connection for every test's ``db`` (reopened if a test broke or closed it)."""
    from eros.db import connect

    holder = {"conn": connect(database_url)}
    yield holder
    holder["conn"].close()


@pytest.fixture
def db(database_url, _shared_connection):
    """A clean engine schema (personas kept) and a fresh process state; yields a connection."""
    from eros.db import connect

    reset_process_state()
    conn = _shared_connection["conn"]
    if conn.closed or conn.broken:
        conn = _shared_connection["conn"] = connect(database_url)
    try:
        conn.execute(clean_schema())
    except Exception:  # e.g. the server was restarted under an idle connection: start over once
        conn.close()
        conn = _shared_connection["conn"] = connect(database_url)
        conn.execute(clean_schema())
    yield conn
    reset_process_state()


@pytest.fixture
def env(monkeypatch):
    """Set environment variables for one test and drop every cached setting/provider around it."""
    def set_env(**values):
        for key, value in values.items():
            if value is None:
                monkeypatch.delenv(key, raising=False)
            else:
                monkeypatch.setenv(key, str(value))
        reset_process_state()
    yield set_env
    reset_process_state()


@pytest.fixture
def providers(db, env, fake_llm, fake_voyage):
    """The engine pointed at the fake OpenRouter and Voyage, with no retries: (fake_llm, fake_voyage)."""
    env(LLM_BASE_URL=fake_llm.url, OPENROUTER_API_KEY="test-key", EMBED_BASE_URL=fake_voyage.url,
        VOYAGE_API_KEY="test-key", PROVIDER_MAX_RETRIES=0)
    return fake_llm, fake_voyage


class LocalServer:
    """The local dev server (the same code `make run` serves) on an ephemeral loopback port."""

    def __init__(self):
        import threading

        from eros.config import settings
        from eros_dev.server import make_server

        self.settings = settings()
        self.server = make_server(self.settings, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll: shutdown() waits for the serve loop to notice, 0.5 s per test by default.
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()

    def client(self, user: str | None):
        import httpx

        from eros.providers.base import tls_context
        from eros_dev.tokens import issue_token, local_jwt_key

        headers = {"Authorization": f"Bearer {issue_token(user, self.settings, local_jwt_key())}"} if user else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, verify=tls_context())

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def local_server(db):
    server = LocalServer()
    yield server
    server.close()


# --- tiers ------------------------------------------------------------------------------------------------
TIERS = ("unit", "integration", "e2e")
# Using any of these (directly or through another fixture) makes a test at least an integration test.
TIER_FIXTURES = {"database_url", "db", "local_server", "fake_llm", "fake_voyage"}
# Modules this conftest cannot mark themselves (owned elsewhere) that run the bench end to end.
E2E_MODULES = {"test_bench_smoke.py"}


def pytest_ignore_collect(collection_path, config):
    """``-m`` over tiers alone (``-m unit``, ``-m "not e2e"``): a module that declares its tier for all its
    tests is not even imported when that tier is not selected -- importing is most of the fast tier's time."""
    import re

    from _pytest.mark.expression import Expression

    expression = config.option.markexpr
    if not expression or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if not set(re.findall(r"[A-Za-z_]\w*", expression)) - {"and", "or", "not"} <= set(TIERS):
        return None
    declared = re.search(r"^pytestmark = pytest\.mark\.(unit|integration|e2e)$", collection_path.read_text(), re.M)
    if declared is None or Expression.compile(expression).evaluate(lambda name, **_: name == declared[1]):
        return None
    return True


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    conflicts = []
    for item in items:
        tiers = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        if not tiers:
            if item.path.name in E2E_MODULES:
                tier = "e2e"
            else:
                tier = "integration" if TIER_FIXTURES & set(getattr(item, "fixturenames", ())) else "unit"
            item.add_marker(tier)
            tiers = {tier}
        if len(tiers) != 1:
            conflicts.append(f"{item.nodeid}: {sorted(tiers)}")
    if conflicts:
        raise pytest.UsageError("every test has exactly one tier (unit, integration, e2e):\n  "
                                + "\n  ".join(conflicts))


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a unit test {what}: mark it integration or e2e (tests/conftest.py, tiers)")
    return refuse


@pytest.fixture(autouse=True)
def _unit_isolation(request):
    """A unit test reaches no database, no server and no process: the tier is checked, not trusted."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    if _database is not None:  # the Postgres start in its thread opens sockets and processes: let it finish first
        _database.result()
    import multiprocessing.process
    import socket
    import subprocess

    import psycopg

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _refuse("opened a network connection"))
        patch.setattr(socket.socket, "connect_ex", _refuse("opened a network connection"))
        patch.setattr(socket.socket, "bind", _refuse("started a server"))
        patch.setattr(psycopg.Connection, "connect", _refuse("connected to a database"))
        patch.setattr(subprocess.Popen, "_execute_child", _refuse("started a process"))
        patch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("started a process"))
        patch.setattr(os, "fork", _refuse("forked"))
        yield


def pytest_collection_finish(session):
    """What collection imported (the package, boto3, moto, hypothesis, the test modules) lives until the run
    ends: move it out of the garbage collector's generations, so that each full collection during the run
    no longer walks it again: the two workers' collections took 6.6 s of a run before, 4.9 s after."""
    import gc

    gc.collect()
    gc.freeze()
