"""Per-user spend: the turn rate window and the daily token budget (migration 0007).

Every change is one atomic SQL statement: the limit is checked by the same statement that counts against
it, on the row's latest version (ON CONFLICT DO UPDATE locks it), so concurrent turns of one user cannot
overshoot a limit. A chat turn runs the admission and the spending as parts of its own statements
(``ADMISSION``, ``spending``), so that they cost no round trip of their own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal, Protocol

from ..db import connection
from .rows import UsageCalls, UsageCount, UsageDay


def utcnow() -> datetime:
    """The spend clock (days are UTC). Tests replace it to cross midnight without waiting."""
    return datetime.now(UTC)


def next_day(moment: datetime) -> datetime:
    """Midnight UTC after ``moment``: when the daily budget resets."""
    day = moment.astimezone(UTC).date() + timedelta(days=1)
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


# Why a provider call was made (migration 0009): a turn's reply and query embedding are "chat"; the
# memory API's embeddings "curation"; dreaming's calls "extraction" or "deep_pass". The last two are what
# user_usage counts as dream_tokens, the first two as chat_tokens.
Purpose = Literal["chat", "extraction", "deep_pass", "curation"]
PURPOSES: tuple[Purpose, ...] = ("chat", "extraction", "deep_pass", "curation")
_DREAMING = ("extraction", "deep_pass")


class ProviderAnswer(Protocol):
    """What a provider call returns and its usage is read from (a Completion, Embeddings)."""

    model: str
    usage: dict


@dataclass(frozen=True)
class Call:
    """One provider call's usage: its purpose, the model that answered and the tokens it reported."""

    purpose: Purpose
    model: str
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @classmethod
    def of(cls, purpose: Purpose, answer: ProviderAnswer) -> Call:
        """The usage the provider reported: prompt and completion tokens (OpenAI's shape); a total beyond
        them (an embedding reports only ``total_tokens``) counts as input. Missing or malformed: 0."""
        usage = answer.usage if isinstance(answer.usage, dict) else {}
        prompt, completion, total = (_count(usage, k) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
        return cls(purpose, str(answer.model), max(prompt, total - completion), completion)


def _count(usage: dict, key: str) -> int:
    value = usage.get(key)
    return max(value, 0) if isinstance(value, int) and not isinstance(value, bool) else 0


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


# Dreaming's calls are counted only while what the work is for still exists: the session (extraction)
# or the user's deep-pass row. The row is locked (FOR KEY SHARE) by the same statement, so a concurrent
# erasure (store.account, which locks and deletes them) either finishes first, and nothing is counted, or
# waits for the count and deletes it with the rest: an erased user gets no usage row from work in flight.
_HELD_BY = {
    "session": "SELECT 1 FROM engine.chat_sessions h WHERE h.id = %(held)s AND h.user_id = %(user)s FOR KEY SHARE",
    "deep_pass": "SELECT 1 FROM engine.user_consolidation h WHERE h.user_id = %(held)s FOR KEY SHARE",
}


def spending(held_by: str | None = None) -> str:
    """The CTEs that count provider calls: ``record``'s statement, and part of the statement that records a
    chat turn (``store.chat.record_turn``). ``spent`` adds the calls' tokens to the user's day (the row the
    budget reads; nothing when they reported none), then ``itemised`` adds each call to its purpose and
    model's row (migration 0009); a statement reads ``itemised`` to run both, in that order (the order a
    turn locks usage rows in). Parameters: ``calls()``'s (and held, with ``held_by``: "session" or
    "deep_pass", counted only while that row exists)."""
    held = f" WHERE EXISTS ({_HELD_BY[held_by]})" if held_by is not None else ""
    dreaming = ", ".join(f"'{p}'" for p in _DREAMING)
    return f"""spent_calls AS (
    SELECT c.purpose, c.model, c.input_tokens, c.output_tokens
    FROM unnest(%(purposes)s::text[], %(models)s::text[], %(inputs)s::bigint[], %(outputs)s::bigint[])
         AS c(purpose, model, input_tokens, output_tokens){held}
), spent AS (
    INSERT INTO engine.user_usage AS u (user_id, day, tokens, chat_tokens, dream_tokens)
    SELECT %(user)s, %(day)s, t.tokens, t.tokens - t.dream, t.dream FROM (
        SELECT coalesce(sum(input_tokens + output_tokens), 0) AS tokens,
               coalesce(sum(input_tokens + output_tokens) FILTER (WHERE purpose IN ({dreaming})), 0) AS dream
        FROM spent_calls) t
    WHERE t.tokens > 0
    ON CONFLICT (user_id, day) DO UPDATE SET tokens = u.tokens + EXCLUDED.tokens,
        chat_tokens = u.chat_tokens + EXCLUDED.chat_tokens, dream_tokens = u.dream_tokens + EXCLUDED.dream_tokens
    RETURNING 1
), itemised AS (
    INSERT INTO engine.user_model_usage AS m (user_id, day, purpose, model, calls, input_tokens, output_tokens)
    SELECT %(user)s, %(day)s, purpose, model, count(*), sum(input_tokens), sum(output_tokens)
    FROM spent_calls, (SELECT count(*) FROM spent) usage_first GROUP BY purpose, model
    ON CONFLICT (user_id, day, purpose, model) DO UPDATE SET calls = m.calls + EXCLUDED.calls,
        input_tokens = m.input_tokens + EXCLUDED.input_tokens, output_tokens = m.output_tokens + EXCLUDED.output_tokens
    RETURNING 1
)"""


def calls(user_id: str, now: datetime, spent: Sequence[Call]) -> dict:
    """The parameters of ``spending`` for ``spent`` calls of ``user_id`` at ``now``."""
    return {"user": user_id, "day": now.astimezone(UTC).date(), "purposes": [c.purpose for c in spent],
            "models": [c.model for c in spent], "inputs": [c.input_tokens for c in spent],
            "outputs": [c.output_tokens for c in spent]}


def record(user_id: str, call: Call, now: datetime, *, held_by: tuple[str, object] | None = None) -> None:
    """Count one provider call of the user's (its tokens, by purpose and model); ``held_by``:
    ("session", id) or ("deep_pass", user id), counted only while that row exists."""
    values = calls(user_id, now, [call])
    if held_by is not None:
        values["held"] = held_by[1]
    connection().execute(f"WITH {spending(held_by[0] if held_by else None)} SELECT count(*) FROM itemised", values)


def usage(user_id: str, now: datetime) -> dict:
    """The user's usage of ``now``'s UTC day (zeros when none)."""
    row = connection().execute(
        "SELECT tokens, chat_tokens, dream_tokens, turns FROM engine.user_usage WHERE user_id = %s AND day = %s",
        (user_id, now.astimezone(UTC).date()),
    ).fetchone()
    return row or {"tokens": 0, "chat_tokens": 0, "dream_tokens": 0, "turns": 0}


def over_budget(user_id: str, now: datetime, daily_budget: int) -> bool:
    return bool(daily_budget) and usage(user_id, now)["tokens"] >= daily_budget


# --- reports (eros.usage): a range of UTC days, both ends included -----------------------------------
def days(user_id: str, first: date, last: date) -> list[UsageDay]:
    """The user's days with any spend in the range, oldest first."""
    return connection().execute(
        "SELECT day, tokens FROM engine.user_usage WHERE user_id = %s AND day BETWEEN %s AND %s"
        " ORDER BY day", (user_id, first, last)).fetchall()


def calls_by_day(user_id: str, first: date, last: date) -> list[UsageCalls]:
    """The user's provider calls in the range per day, purpose and model."""
    return connection().execute(
        "SELECT day, purpose, model, calls, input_tokens, output_tokens FROM engine.user_model_usage"
        " WHERE user_id = %s AND day BETWEEN %s AND %s ORDER BY day, purpose, model", (user_id, first, last)).fetchall()


def calls_by_user(first: date, last: date) -> list[UsageCalls]:
    """Every user's provider calls in the range, summed per purpose and model (an operator's report)."""
    return connection().execute(
        "SELECT user_id, purpose, model, sum(calls)::bigint AS calls, sum(input_tokens)::bigint AS input_tokens,"
        " sum(output_tokens)::bigint AS output_tokens FROM engine.user_model_usage WHERE day BETWEEN %s AND %s"
        " GROUP BY user_id, purpose, model ORDER BY user_id, purpose, model", (first, last)).fetchall()


def tokens_by_user(first: date, last: date) -> dict[str, UsageCount]:
    """Every user's tokens in the range, as the budget counted them."""
    rows = connection().execute(
        "SELECT user_id, sum(tokens)::bigint AS tokens"
        " FROM engine.user_usage WHERE day BETWEEN %s AND %s GROUP BY user_id", (first, last)).fetchall()
    return {row.pop("user_id"): row for row in rows}
