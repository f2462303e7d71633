"""Per-user spend: the rate window and the daily token budget (migrations 0007 and 0018).

Every request that pays a provider is admitted by one atomic SQL statement (engine.admit_v2): the limits are
checked by the same upsert that counts against them, on the row's latest version (ON CONFLICT DO UPDATE locks
it), and under a budget it *reserves* an upper estimate of the request's tokens. The statement that counts the
real usage releases the reservation (engine.spend). Concurrent requests of one user are admitted one after
the other, each counting what the others spent and reserved: the day's tokens end below the budget plus the
reservation of the last request admitted, as long as no request spends more than it reserved (migration 0018
and docs/DESIGN.md, "Usage", state the bound and its one assumption). A chat turn runs the admission and the
settlement inside its own statements (engine.open_turn_v2, engine.record_turn), so that they cost no round trip
of their own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal, Protocol
from uuid import UUID

from ..db import connection
from .rows import UsageCalls, UsageCount, UsageDay


def next_day(moment: datetime) -> datetime:
    """Midnight UTC after ``moment``: when the daily budget resets."""
    day = moment.astimezone(UTC).date() + timedelta(days=1)
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


# Why a provider call was made (migration 0009): a turn's reply and query embedding are "chat"; the
# memory API's embeddings "curation"; dreaming's calls "extraction" or "deep_pass". The last two are what
# user_usage counts as dream_tokens, the first two as chat_tokens (engine.spend, migration 0016).
Purpose = Literal["chat", "extraction", "deep_pass", "curation", "reembedding"]
PURPOSES: tuple[Purpose, ...] = ("chat", "extraction", "deep_pass", "curation", "reembedding")


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


# How long a reservation holds: longer than any request that made it can run (the chat function's Timeout is 29 s,
# template.yaml; tests/test_template.py checks it is shorter), so that it never expires under a live request, and
# short enough that a reservation left by a killed container holds the user's budget back for a minute only.
RESERVATION_SECS = 60
# What a turn's reservation adds to the bytes of its prompt's text (engine.open_turn_v2 counts those): the prompt's
# own fixed text (the data rule, headings, category labels) and an allowance per recalled memory, whose text is
# not known before the turn's recall. A memory written by dreaming is one short sentence (~20-40 tokens).
PROMPT_OVERHEAD = 256
PER_MEMORY = 128


def turn_reserve(chat_max_tokens: int, recalled_at_most: int) -> int:
    """The part of a turn's reservation that its prompt's text does not tell: the reply's cap, the prompt's
    fixed text and the recalled memories' allowance (engine.open_turn_v2 adds the text's bytes)."""
    return chat_max_tokens + PROMPT_OVERHEAD + PER_MEMORY * recalled_at_most


def embedding_reserve(text: str) -> int:
    """An embedding's reservation: its text's UTF-8 bytes (a token spans at least one), and some framing."""
    return len(text.encode("utf-8")) + 8


def admission(now: datetime, turns_per_minute: int, daily_budget: int, reserve: int = 0) -> dict:
    """The spend limits' parameters of engine.admit_v2 (and engine.open_turn_v2) for a request at ``now``; ``limited``
    is false when no limit is on (then nothing is counted or reserved and every request is admitted)."""
    return {"limited": bool(turns_per_minute or daily_budget), "day": now.astimezone(UTC).date(),
            "window": _window(now), "rate": turns_per_minute, "budget": daily_budget, "at": now,
            "reserve": reserve, "until": now + timedelta(seconds=RESERVATION_SECS)}


@dataclass(frozen=True)
class Admitted:
    """A request the limits admitted: the day it counts on (the admission's, also when it ends after midnight)
    and its reservation (None: none was made), which its settlement releases."""

    day: date
    reservation: UUID | None = None


def admit(user_id: str, now: datetime, turns_per_minute: int, daily_budget: int, reserve: int) -> Admitted | None:
    """Admit a request that will pay a provider, reserving ``reserve`` tokens under a budget (engine.admit_v2, the
    admission a chat turn makes inside engine.open_turn_v2); None: a limit refused it (nothing was counted)."""
    values = admission(now, turns_per_minute, daily_budget, reserve)
    if not values["limited"]:
        return Admitted(values["day"])
    row = connection().execute(
        "SELECT reservation FROM engine.admit_v2(%(user)s::text, %(day)s::date, %(at)s::timestamptz,"
        " %(window)s::timestamptz, %(rate)s::int, %(budget)s::bigint, %(reserve)s::bigint, %(until)s::timestamptz, 0)"
        " AS reservation", values | {"user": user_id}).fetchone()
    return None if row is None else Admitted(values["day"], row["reservation"])


def _window(now: datetime) -> datetime:
    """The start of ``now``'s rate window (a fixed minute)."""
    return now.replace(second=0, microsecond=0)


def refusal(user_id: str, now: datetime, daily_budget: int) -> tuple[str, datetime]:
    """Why a request that the spend limits did not admit was refused, and until when: ``"budget_exhausted"`` until
    the budget has room again (``held_until``), else ``"rate_limited"`` until the rate window ends (a refused
    request was not counted)."""
    until = held_until(user_id, now, daily_budget)
    if until is not None:
        return "budget_exhausted", until
    return "rate_limited", _window(now) + timedelta(minutes=1)


def held_until(user_id: str, now: datetime, daily_budget: int) -> datetime | None:
    """Until when the budget has no room for the user's next request: None when it has room (or there is no
    budget); midnight UTC when the day's tokens reach it; else, when only reservations of requests in flight
    fill it, the latest of their expiries (they are settled sooner, when their requests end). What admission
    reads, so that dreaming, which pays without reserving, waits exactly when a turn would be refused."""
    if not daily_budget:
        return None
    row = connection().execute(
        "SELECT tokens, engine.reserved(reservations, %(at)s) AS reserved,"
        " (SELECT max((r.value->>'until')::timestamptz) FROM jsonb_each(reservations) r"
        "  WHERE (r.value->>'until')::timestamptz > %(at)s) AS until"
        " FROM engine.user_usage WHERE user_id = %(user)s AND day = %(day)s",
        {"user": user_id, "day": now.astimezone(UTC).date(), "at": now}).fetchone()
    if row is None or row["tokens"] + row["reserved"] < daily_budget:
        return None
    return next_day(now) if row["tokens"] >= daily_budget else row["until"]


# Dreaming's calls are counted only while what the work is for still exists: the session (extraction)
# or the user's deep-pass row. The row is locked (FOR KEY SHARE) by the same statement, so a concurrent
# erasure (store.account, which locks and deletes them) either finishes first, and nothing is counted, or
# waits for the count and deletes it with the rest: an erased user gets no usage row from work in flight.
_HELD_BY = {
    "session": "SELECT 1 FROM engine.chat_sessions h WHERE h.id = %(held)s AND h.user_id = %(user)s FOR KEY SHARE",
    "deep_pass": "SELECT 1 FROM engine.user_deep_pass h WHERE h.user_id = %(held)s FOR KEY SHARE",
    "reembedding": "SELECT 1 FROM engine.user_reembedding h WHERE h.user_id = %(held)s FOR KEY SHARE",
}


def calls(user_id: str, day: date, spent: Sequence[Call]) -> dict:
    """The parameters of engine.spend (and of a turn's record) for ``spent`` calls of ``user_id`` on ``day``."""
    return {"user": user_id, "day": day, "purposes": [c.purpose for c in spent],
            "models": [c.model for c in spent], "inputs": [c.input_tokens for c in spent],
            "outputs": [c.output_tokens for c in spent]}


_SPEND = ("SELECT engine.spend(%(user)s::text, %(day)s::date, %(purposes)s::text[], %(models)s::text[],"
          " %(inputs)s::bigint[], %(outputs)s::bigint[], %(reservation)s::uuid)")


def record(user_id: str, call: Call, now: datetime, *, held_by: tuple[str, object] | None = None) -> None:
    """Count one provider call of the user's (its tokens, by purpose and model); ``held_by``:
    ("session", id) or ("deep_pass", user id), counted only while that row exists."""
    values = calls(user_id, now.astimezone(UTC).date(), [call]) | {"reservation": None}
    held = ""
    if held_by is not None:
        values["held"] = held_by[1]
        held = f" WHERE EXISTS ({_HELD_BY[held_by[0]]})"  # evaluated (and the row locked) before the call
    connection().execute(_SPEND + held, values)


def settle(user_id: str, admitted: Admitted, spent: Sequence[Call]) -> None:
    """Count the ``spent`` calls of an admitted request on its day and release its reservation, in one statement
    (engine.spend); with no calls (the request failed before paying), only the release."""
    if not spent and admitted.reservation is None:
        return
    connection().execute(_SPEND, calls(user_id, admitted.day, spent) | {"reservation": admitted.reservation})


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


def calls_by_user(app: str, first: date, last: date) -> list[UsageCalls]:
    """Every user of ``app``'s provider calls in the range, summed per purpose and model (its operator's report)."""
    return connection().execute(
        "SELECT user_id, purpose, model, sum(calls)::bigint AS calls, sum(input_tokens)::bigint AS input_tokens,"
        " sum(output_tokens)::bigint AS output_tokens FROM engine.user_model_usage"
        " WHERE day BETWEEN %(first)s AND %(last)s AND engine.app_of(user_id) = %(app)s"
        " GROUP BY user_id, purpose, model ORDER BY user_id, purpose, model",
        {"app": app, "first": first, "last": last}).fetchall()


def tokens_by_user(app: str, first: date, last: date) -> dict[str, UsageCount]:
    """Every user of ``app``'s tokens in the range, as the budget counted them."""
    rows = connection().execute(
        "SELECT user_id, sum(tokens)::bigint AS tokens FROM engine.user_usage"
        " WHERE day BETWEEN %(first)s AND %(last)s AND engine.app_of(user_id) = %(app)s GROUP BY user_id",
        {"app": app, "first": first, "last": last}).fetchall()
    return {row.pop("user_id"): row for row in rows}
