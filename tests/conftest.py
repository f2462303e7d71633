"""Shared fixtures: one embedded Postgres 16 + pgvector for the whole run, a clean schema per test,
and helpers to call the Lambda handlers in-process with real API Gateway events."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

# Tests never reach real providers or AWS, whatever the developer's shell has exported.
for name in ("OPENROUTER_API_KEY", "VOYAGE_API_KEY", "LLM_BASE_URL", "EMBED_BASE_URL", "PROVIDER_SECRET_ARN",
             "DATABASE_SECRET_ARN", "DATABASE_URL", "EXTRACT_FUNCTION_NAME"):
    os.environ.pop(name, None)
os.environ.update({"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
                   "AWS_SECRET_ACCESS_KEY": "testing", "POWERTOOLS_TRACE_DISABLED": "true",
                   "POWERTOOLS_METRICS_NAMESPACE": "ErosTest", "POWERTOOLS_LOG_LEVEL": "WARNING",
                   "LOCAL_JWT_SECRET": "test-only-signing-key-for-local-tokens-0123456789"})

_PG_DIR = Path(tempfile.mkdtemp(prefix="eros-test-pg-"))


@pytest.fixture(scope="session")
def database_url() -> str:
    import pgserver

    from eros.migrate import migrate

    server = pgserver.get_server(str(_PG_DIR), cleanup_mode="stop")
    url = server.get_uri()
    os.environ["DATABASE_URL"] = url
    migrate(url)
    yield url
    server.cleanup()


def reset_process_state() -> None:
    """Forget cached settings, providers and connections (tests change the environment)."""
    from eros import db, providers
    from eros.config import settings

    settings.cache_clear()
    providers.reset()
    db.reset()


@pytest.fixture
def db(database_url, monkeypatch):
    """A clean engine schema (personas kept) and a fresh process state; yields a connection."""
    from eros.db import connect

    reset_process_state()
    with connect(database_url) as conn:
        conn.execute("TRUNCATE engine.companion_memories, engine.chat_messages, engine.chat_sessions,"
                     " engine.user_consolidation, engine.persona_instances, engine.provider_blocks,"
                     " engine.user_usage CASCADE")
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


class LocalServer:
    """The local dev server (the same code `make run` serves) on an ephemeral loopback port."""

    def __init__(self):
        import threading

        from eros.config import settings
        from eros.local import make_server

        self.settings = settings()
        self.server = make_server(self.settings, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def client(self, user: str | None):
        import httpx

        from eros.local import issue_token, local_jwt_key

        headers = {"Authorization": f"Bearer {issue_token(user, self.settings, local_jwt_key())}"} if user else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def local_server(db):
    server = LocalServer()
    yield server
    server.close()
