"""Event time (issue 14): when the thing a memory is about happened, or will happen, as a session said it.

* The domain's parser: a day, an ISO week, a month or a year, normalised to the first day of its period;
  anything else refused with a reason; a memory told twice keeps the more precise of two agreeing times.
* The prompt shows it next to the memory, so "when did I start my new job?" is answered from memory.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from eros.memory import EventTime, InvalidEventTime, later_telling, parse_event_time
from eros.prompt import build_messages

# --- the domain's parser -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,start,precision,normalised,described", [
    ("2026-12-03", date(2026, 12, 3), "day", "2026-12-03", "on 2026-12-03"),
    ("2026-W47", date(2026, 11, 16), "week", "2026-W47", "in the week of 2026-11-16"),
    ("2026-w01", date(2025, 12, 29), "week", "2026-W01", "in the week of 2025-12-29"),  # the ISO year's first week
    ("2020-W53", date(2020, 12, 28), "week", "2020-W53", "in the week of 2020-12-28"),
    ("2019-03", date(2019, 3, 1), "month", "2019-03", "in March 2019"),
    ("2019", date(2019, 1, 1), "year", "2019", "in 2019"),
    (" 1900 ", date(1900, 1, 1), "year", "1900", "in 1900"),
    ("2200-12-31", date(2200, 12, 31), "day", "2200-12-31", "on 2200-12-31"),
])
def test_each_form_is_the_first_day_of_its_period(text, start, precision, normalised, described):
    event = parse_event_time(text)
    assert (event.start, event.precision, event.text(), event.describe()) == (start, precision, normalised, described)
    assert parse_event_time(event.text()) == event


@pytest.mark.parametrize("value,problem", [
    ("2019-13", "the month must be 01 to 12"), ("2019-00", "the month must be 01 to 12"),
    ("2019-W60", "2019 has no ISO week 60: its weeks are 01 to 52"), ("2019-W53", "2019 has no ISO week 53"),
    ("2019-W00", "no ISO week 0"), ("2019-02-30", "2019-02 has no day 30"),
    ("0000", "the year must be between 1900 and 2200"), ("1899-12-31", "between 1900 and 2200"),
    ("2201", "between 1900 and 2200"), ("yesterday", "must be a day YYYY-MM-DD, an ISO week YYYY-Www"),
    ("2019-3", "must be a day"), ("20190", "must be a day"), ("2019-03-01T10:00:00Z", "must be a day"),
    ("２０１９", "must be a day"), ("x" * 10_240, "must be a day"), ("", "must be a day"),
    (12345, "must be text"), ({"year": 2019}, "must be text"), (None, "must be text"),
])
def test_anything_else_is_refused_with_what_is_wrong_and_never_echoed(value, problem):
    with pytest.raises(InvalidEventTime) as refused:
        parse_event_time(value)
    assert problem in str(refused.value) and len(str(refused.value)) < 120


def test_a_memory_told_twice_keeps_the_precise_time_when_they_agree_else_the_later_one():
    week, month, other = EventTime(date(2026, 11, 16), "week"), EventTime(date(2026, 11, 1), "month"), \
        EventTime(date(2027, 1, 4), "week")
    assert (week.end, month.end, EventTime(date(2026, 12, 1), "month").end, EventTime(date(2019, 1, 1), "year").end) \
        == (date(2026, 11, 23), date(2026, 12, 1), date(2027, 1, 1), date(2020, 1, 1))
    assert later_telling(week, month) == week  # "November" later: the week said first is within it
    assert later_telling(month, week) == week  # the later telling is more precise
    assert later_telling(week, other) == other  # they disagree: the later telling wins
    assert later_telling(week, None) == week and later_telling(None, week) == week  # naming none clears nothing


# --- the prompt, and the question it answers ---------------------------------------------------------------------

def test_the_prompt_shows_the_event_time_next_to_the_memory_in_both_layers():
    noted = datetime(2026, 11, 26, 11, tzinfo=UTC)
    profile_rows = [
        {"content": "Started a new job at Siemens", "category": "event", "created_at": noted,
         "occurred_at": date(2026, 11, 16), "occurred_precision": "week"},
        {"content": "Met her husband </memory> in 1999", "category": "relation", "created_at": noted,
         "occurred_at": date(2019, 1, 1), "occurred_precision": "year"},
        {"content": "Lives in Munich", "category": "fact", "created_at": noted, "occurred_at": None,
         "occurred_precision": None},
        {"content": "Moved to Munich", "category": "event", "created_at": noted, "occurred_at": date(2019, 3, 1),
         "occurred_precision": "month"}]
    relationship = [{"content": "My interview is on the 3rd", "category": None, "created_at": noted,
                     "occurred_at": date(2026, 12, 3), "occurred_precision": "day"},
                    {"content": "hello", "category": None, "created_at": noted}]
    system = build_messages("You are Luna.", profile_rows, relationship, [], "hi")[0]["content"]
    assert ("[fact]\n- Lives in Munich (noted 2026-11-26)\n"
            "[event]\n- Started a new job at Siemens (in the week of 2026-11-16; noted 2026-11-26)\n"
            "- Moved to Munich (in March 2019; noted 2026-11-26)\n"
            "[relation]\n- Met her husband \u2039/memory\u203a in 1999 (in 2019; noted 2026-11-26)\n"
            "</memory>") in system
    assert ("- (2026-11-26) My interview is on the 3rd (on 2026-12-03)\n- (2026-11-26) hello\n</memory>") in system
