"""Per-user spend: the turn rate window and the daily token budget (migration 0007).

Every change is one atomic SQL statement: the limit is checked by the same statement that counts against
it, on the row's latest version (ON CONFLICT DO UPDATE locks it), so concurrent turns of one user cannot
overshoot a limit. A chat turn runs the admission and the spending as parts of its own statements
(engine.open_turn, engine.record_turn: migration 0016), so that they cost no round trip of their own."""

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
# user_usage counts as dream_tokens, the first two as chat_tokens (engine.spend, migration 0016).
Purpose = Literal["chat", "extraction", "deep_pass", "curation"]
PURPOSES: tuple[Purpose, ...] = ("chat", "extraction", "deep_pass", "curation")


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


def admission(now: datetime, turns_per_minute: int, daily_budget: int) -> dict:
    """The spend limits' parameters of engine.open_turn for a turn at ``now``; ``limited`` is false when no
    limit is on (then nothing is counted and every turn is admitted)."""
    return {"limited": bool(turns_per_minute or daily_budget), "day": now.astimezone(UTC).date(),
            "window": _window(now), "rate": turns_per_minute, "budget": daily_budget}


def _window(now: datetime) -> datetime:
    """The start of ``now``'s rate window (a fixed minute)."""
    return now.replace(second=0, microsecond=0)


def refusal(user_id: str, now: datetime, daily_budget: int) -> tuple[str, datetime]:
    """Why a turn that the spend limits did not admit was refused, and until when: ``"budget_exhausted"`` until
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


def calls(user_id: str, now: datetime, spent: Sequence[Call]) -> dict:
    """The parameters of engine.spend (and of a turn's record) for ``spent`` calls of ``user_id`` at ``now``."""
    return {"user": user_id, "day": now.astimezone(UTC).date(), "purposes": [c.purpose for c in spent],
            "models": [c.model for c in spent], "inputs": [c.input_tokens for c in spent],
            "outputs": [c.output_tokens for c in spent]}


def record(user_id: str, call: Call, now: datetime, *, held_by: tuple[str, object] | None = None) -> None:
    """Count one provider call of the user's (its tokens, by purpose and model); ``held_by``:
    ("session", id) or ("deep_pass", user id), counted only while that row exists."""
    values = calls(user_id, now, [call])
    held = ""
    if held_by is not None:
        values["held"] = held_by[1]
        held = f" WHERE EXISTS ({_HELD_BY[held_by[0]]})"  # evaluated (and the row locked) before the call
    connection().execute("SELECT engine.spend(%(user)s::text, %(day)s::date, %(purposes)s::text[], %(models)s::text[],"
                         f" %(inputs)s::bigint[], %(outputs)s::bigint[]){held}", values)


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
