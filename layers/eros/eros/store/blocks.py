"""Provider blocks: while a provider refuses our configuration (401/402/403: a bad key, no credit; a model it does
not serve, ``ModelNotFound``), dreaming's work is held, nothing counted against any job, and one probe job per
DREAMING_CONFIG_PROBE_SECS is claimed to see whether the configuration was fixed. Every kind of dreaming job sets
and lifts them (``eros.dreaming.jobs``); the sweep and ``/v1/health`` read them."""

from __future__ import annotations

from datetime import datetime, timedelta

from ..db import connection


def block(provider: str, status: int | None, error: str, now: datetime, probe_secs: float) -> None:
    """A provider refused our credentials: hold dreaming's work (one probe per ``probe_secs``)."""
    connection().execute(
        "INSERT INTO engine.provider_blocks (provider, status, error, since, next_probe_at)"
        " VALUES (%(p)s, %(status)s, %(error)s, %(now)s, %(next)s)"
        " ON CONFLICT (provider) DO UPDATE SET status = EXCLUDED.status, error = EXCLUDED.error,"
        " next_probe_at = EXCLUDED.next_probe_at",
        {"p": provider, "status": status, "error": error[:1000], "now": now,
         "next": now + timedelta(seconds=probe_secs)},
    )


def unblock(provider: str) -> bool:
    """A call to ``provider`` got through: its block (if any) is over."""
    return connection().execute("DELETE FROM engine.provider_blocks WHERE provider = %s RETURNING provider",
                                (provider,)).fetchone() is not None


def blocks() -> list[dict]:
    return connection().execute(
        "SELECT provider, status, error, since, next_probe_at FROM engine.provider_blocks ORDER BY provider"
    ).fetchall()


def take_probe(now: datetime, probe_secs: float) -> bool:
    """While blocked: True for the one sweep per ``probe_secs`` that may try one job (atomic across sweepers)."""
    return connection().execute(
        "UPDATE engine.provider_blocks SET next_probe_at = %s WHERE next_probe_at <= %s RETURNING provider",
        (now + timedelta(seconds=probe_secs), now),
    ).fetchone() is not None
