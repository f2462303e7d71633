"""Per-user spend: the turn rate window and the daily token budget (migration 0007).

Every change is one atomic SQL statement: the limit is checked by the same statement that counts against
it, on the row's latest version (ON CONFLICT DO UPDATE locks it), so concurrent turns of one user cannot
overshoot a limit. A chat turn runs the admission and the spending as parts of its own statements
(``ADMISSION``, ``spending``), so that they cost no round trip of their own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ..db import connection


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


# The admission of one turn, a data-modifying CTE of the statement that opens it (``store.chat.open_turn``),
# so that counting the turn costs no round trip of its own. That statement defines ``to_admit``: one row when
# the turn is to be counted, none otherwise (no session, a replay, no limit on). ``admitted`` has a row when
# the turn was admitted and counted. Parameters: ``admission()``'s, and ``user``.
ADMISSION = """
admitted AS (
    INSERT INTO engine.user_usage AS u (user_id, day, turns, window_start, window_turns)
    SELECT %(user)s, %(day)s, 1, %(window)s, 1 FROM to_admit
    ON CONFLICT (user_id, day) DO UPDATE SET
        turns = u.turns + 1,
        window_turns = CASE WHEN u.window_start = EXCLUDED.window_start THEN u.window_turns + 1 ELSE 1 END,
        window_start = EXCLUDED.window_start
    WHERE (%(rate)s = 0 OR u.window_start IS DISTINCT FROM EXCLUDED.window_start OR u.window_turns < %(rate)s)
      AND (%(budget)s = 0 OR u.tokens < %(budget)s)
    RETURNING u.turns
)"""


def admission(now: datetime, turns_per_minute: int, daily_budget: int) -> dict:
    """The parameters of ``ADMISSION`` for a turn at ``now``; ``limited`` is false when no limit is on (then
    nothing is counted and every turn is admitted)."""
    return {"limited": bool(turns_per_minute or daily_budget), "day": now.astimezone(UTC).date(),
            "window": _window(now), "rate": turns_per_minute, "budget": daily_budget}


def _window(now: datetime) -> datetime:
    """The start of ``now``'s rate window (a fixed minute)."""
    return now.replace(second=0, microsecond=0)


def refusal(user_id: str, now: datetime, daily_budget: int) -> tuple[str, datetime]:
    """Why a turn that ``ADMISSION`` did not admit was refused, and until when: ``"budget_exhausted"`` until
    midnight UTC, else ``"rate_limited"`` until the rate window ends (a refused turn was not counted)."""
    if daily_budget and usage(user_id, now)["tokens"] >= daily_budget:
        return "budget_exhausted", next_day(now)
    return "rate_limited", _window(now) + timedelta(minutes=1)


# Dreaming's tokens are counted only while what the work is for still exists: the session (extraction)
# or the user's deep-pass row. The row is locked (FOR KEY SHARE) by the same statement, so a concurrent
# erasure (store.account, which locks and deletes them) either finishes first, and nothing is counted, or
# waits for the count and deletes it with the rest: an erased user gets no usage row from work in flight.
_HELD_BY = {
    "session": ("engine.chat_sessions h", "h.id = %(held)s"),
    "deep_pass": ("engine.user_consolidation h", "h.user_id = %(held)s"),
}


def spending(kind: str, held_by: str | None = None) -> str:
    """The statement that adds ``%(tokens)s`` (none when 0) to the user's day: ``record``'s, and a CTE of the
    statement that records a chat turn (``store.chat.record_turn``). Parameters: user, day, tokens (and held,
    with ``held_by``: "session" or "deep_pass", counted only while that row exists)."""
    column = {"chat": "chat_tokens", "dream": "dream_tokens"}[kind]
    source, where = "", " WHERE %(tokens)s::bigint > 0"
    if held_by is not None:
        table, match = _HELD_BY[held_by]
        source, where = f" FROM {table}", f"{where} AND {match} FOR KEY SHARE OF h"
    return (f"INSERT INTO engine.user_usage AS u (user_id, day, tokens, {column})"
            f" SELECT %(user)s, %(day)s, %(tokens)s::bigint, %(tokens)s::bigint{source}{where}"
            f" ON CONFLICT (user_id, day) DO UPDATE SET tokens = u.tokens + EXCLUDED.tokens,"
            f" {column} = u.{column} + EXCLUDED.{column} RETURNING 1")


def record(user_id: str, tokens: int, kind: str, now: datetime, *,
           held_by: tuple[str, object] | None = None) -> None:
    """Add a provider call's tokens to the user's day (``kind``: "chat" or "dream"); ``held_by``:
    ("session", id) or ("deep_pass", user id), counted only while that row exists."""
    if tokens <= 0:
        return
    values = {"user": user_id, "day": now.astimezone(UTC).date(), "tokens": tokens}
    if held_by is not None:
        values["held"] = held_by[1]
    connection().execute(spending(kind, held_by[0] if held_by else None), values)


def usage(user_id: str, now: datetime) -> dict:
    """The user's usage of ``now``'s UTC day (zeros when none)."""
    row = connection().execute(
        "SELECT tokens, chat_tokens, dream_tokens, turns FROM engine.user_usage WHERE user_id = %s AND day = %s",
        (user_id, now.astimezone(UTC).date()),
    ).fetchone()
    return row or {"tokens": 0, "chat_tokens": 0, "dream_tokens": 0, "turns": 0}


def over_budget(user_id: str, now: datetime, daily_budget: int) -> bool:
    return bool(daily_budget) and usage(user_id, now)["tokens"] >= daily_budget
