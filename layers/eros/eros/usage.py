"""What a user's provider calls cost: the report of ``GET /v1/usage`` (the caller's) and ``eros usage``
(every user's, for an operator).

Every provider call is counted when it is made, by purpose and model (``eros.store.usage``, migrations
0007 and 0009). A report prices the tokens when it is asked for, with the settings' price table
(``Settings.prices``: DEFAULT_PRICES and MODEL_PRICES): an *estimate* at list prices. A model with no
price counts nothing towards a cost and is named in ``unpriced_models``; the offline stand-ins cost 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any, NoReturn

import psycopg

from . import apps, clock
from .config import ModelPrice, Settings, settings
from .errors import ClientError
from .observability import logger, metrics
from .store import usage as usage_store
from .store.rows import UsageCalls, UsageCount

DEFAULT_DAYS = 30  # a report without dates: the last 30 UTC days, today included
MAX_DAYS = 366
CURRENCY = "USD"
_NONE: UsageCount = {"tokens": 0}


class BadRange(ClientError):
    """The days asked for are not a range a report covers; ``field`` is the parameter at fault."""
    status, code = 422, "invalid_request"

    def __init__(self, field: str, problem: str):
        super().__init__(f"invalid request: {field}: {problem}",
                         errors=[{"field": f"query.{field}", "problem": problem}])
        self.field, self.problem = field, problem


class OverLimit(ClientError):
    """The user is over a spend limit: ``code`` names it ("rate_limited", "budget_exhausted"),
    ``retry_after`` is the seconds until it lifts. Nothing was stored or paid for."""
    status = 429

    def __init__(self, code: str, message: str, retry_after: int, limit: int):
        super().__init__(message, limit=limit, retry_after=retry_after, retryable=True)
        self.code = code
        self.retry_after = retry_after
        self.limit = limit


def refuse(cfg: Settings, user_id: str, now: datetime) -> NoReturn:
    """A request the spend limits did not admit: say which limit and until when (raises OverLimit)."""
    code, until = usage_store.refusal(user_id, now, cfg.daily_token_budget)
    wait = max(1, math.ceil((until - now).total_seconds()))
    metrics.add_metric(name="TurnsRefused", unit="Count", value=1)
    logger.info("request refused by a spend limit", extra={"code": code, "retry_after": wait})
    if code == "rate_limited":
        raise OverLimit(code, f"too many turns: at most {cfg.turns_per_minute} per minute (chat turns and the memory"
                        " API's searches, additions and edits count together)", wait, cfg.turns_per_minute)
    if until == usage_store.next_day(now):
        raise OverLimit(code, f"the daily token budget ({cfg.daily_token_budget} tokens) is spent; it resets at"
                        " midnight UTC", wait, cfg.daily_token_budget)
    raise OverLimit(code, f"the daily token budget ({cfg.daily_token_budget} tokens) is held by requests in progress;"
                    " retry when they have finished", wait, cfg.daily_token_budget)


def release(user_id: str, admitted: usage_store.Admitted, paid: Sequence[usage_store.Call] = ()) -> None:
    """Settle a request that ended without recording its usage with the rest of its work: count what it ``paid``
    and release its reservation. A database that fails this leaves the reservation to expire
    (``store.usage.RESERVATION_SECS``): the request's own error is the one to report."""
    try:
        usage_store.settle(user_id, admitted, paid)
    except psycopg.Error as exc:
        logger.warning("a reservation was not released; it expires by itself", extra={"error": type(exc).__name__})


@contextmanager
def admitted(user_id: str, reserve: int) -> Iterator[list[usage_store.Call]]:
    """Admit a request that pays a provider outside a chat turn (the memory API's embeddings) with the turn's
    limits and admission (``store.usage.admit``; raises OverLimit), then count what it paid, which the body
    appends to the list it is given, and release its reservation, however the body ends."""
    cfg, now = apps.settings_for(user_id), clock.now()  # the user's app's limits
    held = usage_store.admit(user_id, now, cfg.turns_per_minute, cfg.daily_token_budget, reserve)
    if held is None:
        refuse(cfg, user_id, now)
    paid: list[usage_store.Call] = []
    try:
        yield paid
    finally:
        release(user_id, held, paid)
        metrics.add_metric(name="ProviderTokens", unit="Count", value=sum(c.tokens for c in paid))


def spend(user_id: str, call: usage_store.Call, *, held_by: tuple[str, object] | None = None) -> None:
    """Count a provider call of the user's (``store.usage.record``) and its tokens in the ProviderTokens
    metric (what the spend alarm watches). A chat turn counts its calls in its own last statement."""
    usage_store.record(user_id, call, clock.now(), held_by=held_by)
    metrics.add_metric(name="ProviderTokens", unit="Count", value=call.tokens)


def days_of(first: date | None, last: date | None) -> tuple[date, date]:
    """The range a report covers: ``last`` defaults to today (UTC), ``first`` to DEFAULT_DAYS before it (or
    the calendar's first day, 0001-01-01, when ``last`` is closer to it than that)."""
    last = last or clock.now().astimezone(UTC).date()
    first = first or last - timedelta(days=min(DEFAULT_DAYS - 1, (last - date.min).days))
    if first > last:
        raise BadRange("from", f"{first} is after to ({last})")
    if (last - first).days + 1 > MAX_DAYS:
        raise BadRange("from", f"a report covers at most {MAX_DAYS} days; ask for a shorter range")
    return first, last


def cost(prices: Mapping[str, ModelPrice], model: str, input_tokens: int, output_tokens: int) -> float | None:
    """The estimated cost in USD of these tokens on ``model``, or None when it has no price."""
    if model.startswith("offline/"):
        return 0.0
    price = prices.get(model)
    if price is None:
        return None
    return round((input_tokens * price.input + output_tokens * price.output) / 1_000_000, 6)


def _priced(rows: Iterable[UsageCalls], prices: Mapping[str, ModelPrice], unpriced: set[str]) -> list[dict]:
    out = []
    for row in rows:
        estimate = cost(prices, row["model"], row["input_tokens"], row["output_tokens"])
        if estimate is None:
            unpriced.add(row["model"])
        out.append({**row, "estimated_cost": estimate})
    return out


def _sum(rows: Iterable[Mapping[str, Any]], *fields: str) -> dict[str, Any]:
    rows = list(rows)
    summed: dict[str, Any] = {f: sum(r[f] for r in rows) for f in fields}
    summed["estimated_cost"] = round(sum(r["estimated_cost"] or 0.0 for r in rows), 6)
    return summed


def report(user_id: str, first: date, last: date) -> dict[str, Any]:
    """The user's usage from ``first`` to ``last`` (UTC days, both included): per day (the budget's tokens,
    and each purpose and model's calls and tokens), per purpose over the range, and totals."""
    cfg = apps.settings_for(user_id)  # the budget of the user's app
    unpriced: set[str] = set()
    calls = _priced(usage_store.calls_by_day(user_id, first, last), cfg.prices, unpriced)
    per_day: dict[date, list[dict]] = defaultdict(list)
    for row in calls:
        per_day[row.pop("day")].append(row)
    counted: dict[date, UsageCount] = {d["day"]: d for d in usage_store.days(user_id, first, last)}
    days = [{"day": day, "tokens": counted.get(day, _NONE)["tokens"],
             "estimated_cost": _sum(per_day[day])["estimated_cost"], "calls": per_day[day]}
            for day in sorted(set(counted) | set(per_day))]
    purposes = [{"purpose": purpose, **_sum((r for r in calls if r["purpose"] == purpose),
                                            "calls", "input_tokens", "output_tokens")}
                for purpose in usage_store.PURPOSES if any(r["purpose"] == purpose for r in calls)]
    return {"from": first, "to": last, "currency": CURRENCY, "daily_token_budget": cfg.daily_token_budget or None,
            "days": days, "purposes": purposes,
            "totals": {**_sum(calls, "calls", "input_tokens", "output_tokens"),
                       "tokens": sum(d["tokens"] for d in days)},
            "unpriced_models": sorted(unpriced)}


def by_user(app: str, first: date, last: date) -> dict[str, Any]:
    """Every user of ``app``'s usage in the range (its operator's report): per user (the subject, as the app knows
    them) their tokens, calls, tokens per purpose and estimated cost, costliest first; and the app's totals."""
    cfg = settings()
    unpriced: set[str] = set()
    calls = _priced(usage_store.calls_by_user(app, first, last), cfg.prices, unpriced)
    counted = usage_store.tokens_by_user(app, first, last)
    per_user: dict[str, list[dict]] = defaultdict(list)
    for row in calls:
        per_user[row.pop("user_id")].append(row)
    users = []
    for user in set(counted) | set(per_user):
        rows = per_user[user]
        users.append({"user_id": apps.subject_of(user), "tokens": counted.get(user, _NONE)["tokens"],
                      **_sum(rows, "calls", "input_tokens", "output_tokens"),
                      "purposes": {p: sum(r["input_tokens"] + r["output_tokens"] for r in rows if r["purpose"] == p)
                                   for p in usage_store.PURPOSES}})
    users.sort(key=lambda u: (-u["estimated_cost"], -u["tokens"], u["user_id"]))
    return {"from": first, "to": last, "currency": CURRENCY, "app": app, "users": users,
            "totals": {**_sum(calls, "calls", "input_tokens", "output_tokens"),
                       "tokens": sum(u["tokens"] for u in users)},
            "unpriced_models": sorted(unpriced)}
