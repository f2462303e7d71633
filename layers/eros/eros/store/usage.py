"""Per-user spend: the turn rate window and the daily token budget (migration 0007).

Every function here is one atomic SQL statement: the limit is checked by the same statement that
counts against it, on the row's latest version (ON CONFLICT DO UPDATE locks it), so concurrent turns
of one user cannot overshoot a limit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ..db import Connection, connection


def utcnow() -> datetime:
    """The spend clock (days are UTC). Tests replace it to cross midnight without waiting."""
    return datetime.now(UTC)


def next_day(moment: datetime) -> datetime:
    """Midnight UTC after ``moment``: when the daily budget resets."""
    day = moment.astimezone(UTC).date() + timedelta(days=1)
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def tokens_of(usage: dict | None) -> int:
    """Tokens a provider reported: total_tokens, else prompt + completion (0 when it said nothing)."""
    if not isinstance(usage, dict):
        return 0
    total = usage.get("total_tokens")
    if isinstance(total, int) and not isinstance(total, bool):
        return max(total, 0)
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens")]
    return sum(max(v, 0) for v in parts if isinstance(v, int) and not isinstance(v, bool))


_ADMIT = """
INSERT INTO engine.user_usage AS u (user_id, day, turns, window_start, window_turns)
VALUES (%(user)s, %(day)s, 1, %(window)s, 1)
ON CONFLICT (user_id, day) DO UPDATE SET
    turns = u.turns + 1,
    window_turns = CASE WHEN u.window_start = EXCLUDED.window_start THEN u.window_turns + 1 ELSE 1 END,
    window_start = EXCLUDED.window_start
WHERE (%(rate)s = 0 OR u.window_start IS DISTINCT FROM EXCLUDED.window_start OR u.window_turns < %(rate)s)
  AND (%(budget)s = 0 OR u.tokens < %(budget)s)
RETURNING u.turns
"""


def admit_turn(user_id: str, now: datetime, turns_per_minute: int, daily_budget: int) -> tuple[str, datetime] | None:
    """Count one turn against the user's rate window and check the daily budget, atomically.

    None: admitted (counted). Else (why, until): ``"rate_limited"`` until the window ends, or
    ``"budget_exhausted"`` until midnight UTC; a refused turn is not counted."""
    day = now.astimezone(UTC).date()
    window = now.replace(second=0, microsecond=0)
    conn = connection()
    admitted = conn.execute(_ADMIT, {"user": user_id, "day": day, "window": window,
                                     "rate": turns_per_minute, "budget": daily_budget}).fetchone()
    if admitted is not None:
        return None
    if daily_budget and usage(user_id, now)["tokens"] >= daily_budget:
        return "budget_exhausted", next_day(now)
    return "rate_limited", window + timedelta(minutes=1)


# Dreaming's tokens are counted only while what the work is for still exists: the session (extraction)
# or the user's deep-pass row. The row is locked (FOR KEY SHARE) by the same statement, so a concurrent
# erasure (store.account, which locks and deletes them) either finishes first, and nothing is counted, or
# waits for the count and deletes it with the rest: an erased user gets no usage row from work in flight.
_HELD_BY = {
    "session": " FROM engine.chat_sessions h WHERE h.id = %(held)s FOR KEY SHARE OF h",
    "deep_pass": " FROM engine.user_consolidation h WHERE h.user_id = %(held)s FOR KEY SHARE OF h",
}


def record(user_id: str, tokens: int, kind: str, now: datetime, conn: Connection | None = None, *,
           held_by: tuple[str, object] | None = None) -> None:
    """Add a provider call's tokens to the user's day (``kind``: "chat" or "dream"); ``conn``: inside a
    transaction the caller holds (the turn's own, so the count costs no commit of its own); ``held_by``:
    ("session", id) or ("deep_pass", user id), counted only while that row exists."""
    if tokens <= 0:
        return
    column = {"chat": "chat_tokens", "dream": "dream_tokens"}[kind]
    values = {"user": user_id, "day": now.astimezone(UTC).date(), "n": tokens}
    source = " VALUES (%(user)s, %(day)s, %(n)s, %(n)s)"
    if held_by is not None:
        source = " SELECT %(user)s, %(day)s, %(n)s, %(n)s" + _HELD_BY[held_by[0]]
        values["held"] = held_by[1]
    (conn or connection()).execute(
        f"INSERT INTO engine.user_usage AS u (user_id, day, tokens, {column}){source}"
        f" ON CONFLICT (user_id, day) DO UPDATE SET tokens = u.tokens + EXCLUDED.tokens,"
        f" {column} = u.{column} + EXCLUDED.{column}",
        values,
    )


def usage(user_id: str, now: datetime) -> dict:
    """The user's usage of ``now``'s UTC day (zeros when none)."""
    row = connection().execute(
        "SELECT tokens, chat_tokens, dream_tokens, turns FROM engine.user_usage WHERE user_id = %s AND day = %s",
        (user_id, now.astimezone(UTC).date()),
    ).fetchone()
    return row or {"tokens": 0, "chat_tokens": 0, "dream_tokens": 0, "turns": 0}


def over_budget(user_id: str, now: datetime, daily_budget: int) -> bool:
    return bool(daily_budget) and usage(user_id, now)["tokens"] >= daily_budget
