"""The application's clock: what every decision that depends on the time of day reads (a claim's cut-offs, a
lease, a backoff, the spend limits' UTC day and rate window, an export's expiry). One seam, so that a test moves
time for all of them at once (``monkeypatch.setattr(clock, "now", ...)``) without sleeping. Callers read it as
``clock.now()``, never ``from .clock import now``, so that the replacement is seen. The database's own clock
(``now()`` in SQL) stamps rows; the two meet only where a statement takes the application's time as a parameter."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)
