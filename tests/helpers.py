"""Plain helpers the test modules share (fixtures live in conftest.py and the plugins it registers)."""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from eros_dev.lambda_runtime import LambdaContext, load_function

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"


def utcnow() -> datetime:
    return datetime.now(UTC)


def event(name: str) -> dict[str, Any]:
    """A sample event from events/ (what `sam local invoke -e` feeds a function)."""
    path = EVENTS / name
    assert path.exists(), f"events/{name} is missing"
    return json.loads(path.read_text())


def invoke(function: str, payload: dict[str, Any], *, timeout_secs: float = 120) -> Any:
    """One invocation of a function's real handler, in-process, with a Lambda-like context."""
    return load_function(function).lambda_handler(dict(payload), LambdaContext(function, timeout_secs=timeout_secs))


def extract(payload: dict[str, Any]) -> Any:
    return invoke("extract", payload)


def tick(timeout_secs: float = 240, *, budget: bool = False) -> dict[str, Any]:
    """One scheduled sweep: the sample EventBridge Scheduler event through the sweeper's handler (the
    tick's budget, in-flight count and provider blocks left out unless ``budget``; retention's count always:
    tests/test_retention.py is about it)."""
    result = invoke("sweeper", event("sweeper_schedule.json"), timeout_secs=timeout_secs)
    assert result.pop("messages_expired") == 0  # retention is off unless a test sets TRANSCRIPT_RETENTION_DAYS
    if not budget:
        for key in ("budget", "in_flight", "blocked"):
            result.pop(key)
    return result


def instance(db: Any, user: str = "alice", persona: str = "luna") -> UUID:
    """The user's persona instance (created on first use)."""
    return db.execute(
        "INSERT INTO engine.persona_instances (user_id, persona_id) VALUES (%s, %s)"
        " ON CONFLICT (user_id, persona_id) DO UPDATE SET user_id = EXCLUDED.user_id RETURNING id",
        (user, persona),
    ).fetchone()["id"]


def go_idle(db: Any, seconds: int = 7200) -> None:
    """Pretend every session's last activity was long ago (instead of waiting for DREAMING_IDLE_SECS)."""
    db.execute("UPDATE engine.chat_sessions SET last_active_at = last_active_at - make_interval(secs => %s)",
               (seconds,))


def cosine(a: list[float], b: list[float]) -> float:
    return math.sumprod(a, b) / math.sqrt(math.sumprod(a, a) * math.sumprod(b, b))


def emitted_metrics(text: str) -> dict[str, float]:
    """The CloudWatch EMF blobs Powertools printed: metric name -> value, summed over blobs."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("{") or '"_aws"' not in line:
            continue
        blob = json.loads(line)
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                value = blob[metric["Name"]]
                found[metric["Name"]] = found.get(metric["Name"], 0) + (sum(value) if isinstance(value, list)
                                                                         else value)
    return found


def claim_concurrently(workers: int, *, idle_before: datetime, stale_before: datetime, limit: int = 25
                       ) -> list[list[Any]]:
    """``workers`` threads, started together, each claiming batches of ``limit`` idle sessions until none is
    left, each on its own connection; the session ids each one claimed."""
    from eros import db as eros_db
    from eros.store import dreaming as dreaming_store

    start = threading.Barrier(workers)

    def claimer(_):
        got = []
        start.wait()
        try:
            while rows := dreaming_store.claim(idle_before=idle_before, stale_before=stale_before, limit=limit):
                got.extend(r["id"] for r in rows)
        finally:
            eros_db.reset()  # this thread's own connection
        return got

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(claimer, range(workers)))


def migrate_before(conn: Any, number: str) -> None:
    """Apply the numbered migrations before ``number`` ("0017") to a fresh database as the runner of that time
    did (names only in engine.schema_migrations, no checksums, no function files): a database of an earlier
    release, for a test of what a later migration does to it."""
    from eros.migrate import migration_files

    conn.execute("CREATE SCHEMA engine")
    conn.execute("CREATE TABLE engine.schema_migrations (name text PRIMARY KEY, applied_at timestamptz"
                 " NOT NULL DEFAULT now())")
    for name, sql in migration_files():
        if name >= number:
            break
        conn.execute(sql)
        conn.execute("INSERT INTO engine.schema_migrations (name) VALUES (%s)", (name,))
