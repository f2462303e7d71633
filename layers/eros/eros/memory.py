"""The memory domain's vocabulary: the two memory layers, the profile categories, where a memory came from,
why one stopped being current, and when what it is about happened (its event time). Routes, stores, recall
and the prompt all speak these names."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from datetime import date, timedelta
from enum import StrEnum
from typing import Literal, cast, get_args


class MemoryLayer(StrEnum):
    """Which of the two memory layers a memory is in (not to be confused with the Lambda layer)."""

    PROFILE = "profile"  # who the user is: distilled facts, the user's across every persona
    RELATIONSHIP = "relationship"  # what happened with one persona instance: raw utterances and episodes


# The profile layer's categories, in the order the prompt shows them.
Category = Literal["fact", "preference", "event", "emotion", "relation"]
CATEGORIES: tuple[Category, ...] = get_args(Category)  # the one list, typed once (the CHECK of 0001 is the SQL's)

# What wrote a memory: a chat utterance, session-end extraction (dreaming), the per-user deep pass, the user,
# and a session's episode (written by the same extraction into the relationship layer; migration 0021).
Source = Literal["utterance", "dreaming", "deep_pass", "user", "episode"]

# Why a memory stopped being current (migration 0004; docs/CONSOLIDATION.md). 'outdated' is a relationship-layer
# utterance's (a fact it stated changed); the others are a profile memory's, as supersession writes them.
SupersededReason = Literal["changed", "duplicate", "reverted", "edited", "outdated"]
SUPERSESSIONS: tuple[SupersededReason, ...] = tuple(r for r in get_args(SupersededReason) if r != "outdated")


def stored_importance(value: float) -> float:
    """An importance as its column (``real``, a float4) holds it: rounded to the nearest float4, as Postgres
    rounds every number it stores there, except that a number too small for a float4 (below ~1.4e-45) is 0
    here, where Postgres would refuse the whole statement ("value out of range: underflow"); -0 is 0. A
    number too large for a float4, or NaN, is returned as it is, for the caller's range check to refuse."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0] + 0.0
    except OverflowError:
        return value


_SAID = re.compile(r"^the user said:\s*", re.I)
_KEY_DROP = re.compile(r"[^\w\s]")


def statement_key(text: str) -> str:
    """Two memories with the same key say the same thing (case, punctuation, the offline prefix folded)."""
    return " ".join(_KEY_DROP.sub(" ", _SAID.sub("", text.strip()).casefold()).split())


# --- event time ------------------------------------------------------------------------------------------------
# When the thing a memory is about happened, or will happen, when a session said so (migration 0011): the first
# day of a period and its size. Text carries it in one of four fixed forms, the same for the extraction model's
# answer, the API and the export: a day "2026-12-03", an ISO week "2026-W47" (Monday to Sunday), a month
# "2019-03", a year "2019".
Precision = Literal["day", "week", "month", "year"]
EVENT_TIME_FORMS = "a day YYYY-MM-DD, an ISO week YYYY-Www, a month YYYY-MM or a year YYYY"
FIRST_YEAR, LAST_YEAR = 1900, 2200  # a person's past and plans; a year outside is a mistake, not a memory
_EVENT_TIME = re.compile(r"([0-9]{4})(?:-[Ww]([0-9]{2})|-([0-9]{2})(?:-([0-9]{2}))?)?")
# Fixed English names, not strftime's %B: the prompt must not change with the process's locale.
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


class InvalidEventTime(ValueError):
    """Text that is not an event time in one of the four forms (the message says what is wrong, never echoes it)."""


@dataclass(frozen=True)
class EventTime:
    """A period a memory is about: ``start`` is its first day (a Monday for a week, the 1st for a month,
    1 January for a year)."""

    start: date
    precision: Precision

    @property
    def end(self) -> date:
        """The first day after the period."""
        if self.precision == "day":
            return self.start + timedelta(days=1)
        if self.precision == "week":
            return self.start + timedelta(days=7)
        if self.precision == "month":
            return date(self.start.year + self.start.month // 12, self.start.month % 12 + 1, 1)
        return date(self.start.year + 1, 1, 1)

    def within(self, other: EventTime) -> bool:
        """This period lies inside ``other`` (the same period included)."""
        return other.start <= self.start and self.end <= other.end

    def text(self) -> str:
        """The normalised form: what the API answers and the export holds."""
        if self.precision == "week":
            year, week, _ = self.start.isocalendar()  # the ISO year: 2026-W01 starts on 2025-12-29
            return f"{year:04d}-W{week:02d}"
        if self.precision == "month":
            return f"{self.start.year:04d}-{self.start.month:02d}"
        if self.precision == "year":
            return f"{self.start.year:04d}"
        return self.start.isoformat()

    def describe(self) -> str:
        """For a prompt: unambiguous to a reader, whatever the reader's conventions for weeks and dates."""
        if self.precision == "day":
            return f"on {self.start.isoformat()}"
        if self.precision == "week":
            return f"in the week of {self.start.isoformat()}"
        if self.precision == "month":
            return f"in {_MONTHS[self.start.month - 1]} {self.start.year}"
        return f"in {self.start.year}"


def parse_event_time(text: object) -> EventTime:
    """``text`` in one of the four forms as an event time; raises ``InvalidEventTime`` saying what is wrong."""
    if not isinstance(text, str):
        raise InvalidEventTime(f"must be text: {EVENT_TIME_FORMS}")
    found = _EVENT_TIME.fullmatch(text.strip()) if len(text) <= 16 else None
    if found is None:
        raise InvalidEventTime(f"must be {EVENT_TIME_FORMS}")
    year = int(found[1])
    week, month, day = (int(part) if part else None for part in found.groups()[1:])
    if not FIRST_YEAR <= year <= LAST_YEAR:
        raise InvalidEventTime(f"the year must be between {FIRST_YEAR} and {LAST_YEAR}")
    if week is not None:
        try:
            return EventTime(date.fromisocalendar(year, week, 1), "week")
        except ValueError:
            raise InvalidEventTime(f"{year} has no ISO week {week}: its weeks are 01 to "
                                   f"{date(year, 12, 28).isocalendar().week}") from None
    if month is not None and not 1 <= month <= 12:
        raise InvalidEventTime("the month must be 01 to 12")
    if day is not None:
        try:
            return EventTime(date(year, month or 1, day), "day")
        except ValueError:
            raise InvalidEventTime(f"{year}-{month:02d} has no day {day}") from None
    return EventTime(date(year, month or 1, 1), "month" if month else "year")


def event_time(start: date | None, precision: str | None) -> EventTime | None:
    """A stored row's event time (its occurred_at and occurred_precision columns), if it has one."""
    if start is None or precision not in ("day", "week", "month", "year"):
        return None
    return EventTime(start, cast(Precision, precision))


def event_columns(event: EventTime | None) -> tuple[date | None, str | None]:
    """An event time as the row stores it: (occurred_at, occurred_precision), both None when there is none."""
    return (event.start, event.precision) if event else (None, None)


def event_time_text(start: date | None, precision: str | None) -> str | None:
    """A stored row's event time in its normalised text form, or None."""
    event = event_time(start, precision)
    return event.text() if event else None


def covering(first: date, last: date) -> EventTime:
    """The event time of something that took place from day ``first`` to day ``last`` (a session, an
    episode): the smallest of the day, the ISO week, the month or the year that holds both; a span across a
    new year is the first day's year."""
    if first == last:
        return EventTime(first, "day")
    monday = first - timedelta(days=first.weekday())
    if last < monday + timedelta(days=7):
        return EventTime(monday, "week")
    if (first.year, first.month) == (last.year, last.month):
        return EventTime(date(first.year, first.month, 1), "month")
    return EventTime(date(first.year, 1, 1), "year")


def later_telling(earlier: EventTime | None, later: EventTime | None) -> EventTime | None:
    """The event time of one memory told twice (a repeat, a merged duplicate): the later telling's, which
    knows more (or resolved "last week" against a later day), unless the earlier one lies within it: then
    the two agree, and the earlier is the more precise ("the week of 2026-11-16" over "November 2026").
    A telling that names no time never clears one."""
    if later is None or (earlier is not None and earlier.within(later)):
        return earlier
    return later
