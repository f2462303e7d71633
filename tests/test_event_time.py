"""Event time (issue 14): when the thing a memory is about happened, or will happen, as a session said it.

* The domain's parser: a day, an ISO week, a month or a year, normalised to the first day of its period;
  anything else refused with a reason; a memory told twice keeps the more precise of two agreeing times.
* Extraction: the transcript gives each day's date, the model's ``occurred_at`` is stored with its
  precision, an unreadable one is dropped and the memory kept; a repeat that names a time gives it to the
  known memory; the offline stand-in resolves common time words itself; the deep pass keeps a merged time.
* The prompt shows it next to the memory, so "when did I start my new job?" is answered from memory.
* The API lists, takes (POST, PATCH; null clears) and exports it, and refuses a bad one with a 422.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from apiclient import Api
from helpers import extract, go_idle
from test_consolidation import memory, script, session_with
from test_deep_pass import claim_one, due, run
from test_deep_pass import memory as stored_memory
from test_dreaming import answer_extraction_with, chat_requests, extraction_requests

from eros.extraction import parse_candidates, render_transcript
from eros.memory import EventTime, InvalidEventTime, later_telling, parse_event_time
from eros.prompt import build_messages, memory_section
from eros.providers.offline import offline_candidates
from eros_dev.dreaming import sweep_locally

THURSDAY = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)  # in ISO week 2026-W48: "last week" is 2026-W47


def said_on(db, session_id, at: datetime) -> None:
    """The session's messages were sent on ``at`` (20 s apart), not today."""
    db.execute("UPDATE engine.chat_messages SET sent_at = %(at)s + (id - (SELECT min(id) FROM engine.chat_messages"
               " WHERE session_id = %(sid)s)) * interval '20 seconds' WHERE session_id = %(sid)s",
               {"at": at, "sid": session_id})


def event_times(db, user: str = "alice") -> dict[str, tuple[date | None, str | None]]:
    """content -> (occurred_at, occurred_precision) of the user's active profile rows."""
    return {r["content"]: (r["occurred_at"], r["occurred_precision"]) for r in db.execute(
        "SELECT content, occurred_at, occurred_precision FROM engine.companion_memories"
        " WHERE user_id = %s AND instance_id IS NULL AND superseded_at IS NULL", (user,)).fetchall()}


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


# --- extraction ------------------------------------------------------------------------------------------------

def test_the_transcript_opens_each_utc_day_with_its_date():
    east = datetime(2026, 11, 26, 1, 30, tzinfo=UTC).astimezone(ZoneInfo("Asia/Shanghai"))  # 09:30 there
    messages = [{"id": 1, "role": "user", "content": "I started   at Siemens\nlast week", "sent_at": THURSDAY},
                {"id": 2, "role": "assistant", "content": "Congratulations!", "sent_at": THURSDAY},
                {"id": 3, "role": "user", "content": "[Monday 1999-01-04] not a date line", "sent_at": east
                 + timedelta(days=1)}]
    assert render_transcript([], messages).split("\n") == [
        "<session>", "[Thursday 2026-11-26]", "user: I started at Siemens last week", "assistant: Congratulations!",
        "[Friday 2026-11-27]", "user: [Monday 1999-01-04] not a date line", "</session>"]


def test_an_event_time_the_parse_cannot_read_is_dropped_and_the_memory_kept_unlogged(caplog):
    got = parse_candidates(json.dumps({"memories": [
        {"content": "Adopted a dog called Rex", "occurred_at": "the day after my birthday party"},
        {"content": "Met Mehmet in Izmir", "occurred_at": "2019"},
        {"content": "Likes mocha", "occurred_at": None},
        {"content": "Plans a trip", "occurred_at": {"year": 2027}},
        {"content": "Moved to Porto", "occurred_at": 2021},
        {"content": "Quit smoking", "occurred_at": "2026-W54"}]}))
    assert [(c.content, c.occurred_at) for c in got] == [
        ("Adopted a dog called Rex", None), ("Met Mehmet in Izmir", EventTime(date(2019, 1, 1), "year")),
        ("Likes mocha", None), ("Plans a trip", None), ("Moved to Porto", EventTime(date(2021, 1, 1), "year")),
        ("Quit smoking", None)]
    dropped = [r for r in caplog.records if r.getMessage() == "an extracted event time was dropped"]
    assert len(dropped) == 3
    logged = " ".join(str(r.__dict__) for r in caplog.records)
    assert not {"Rex", "birthday", "2027", "Quit", "W54"} & set(logged.replace("'", " ").split())


def test_extraction_stores_the_event_time_the_model_resolved_against_the_sessions_date(db, providers):
    llm, _ = providers
    script(llm, lambda known: [memory("Started a new job at Siemens", "event", occurred_at="2026-W47"),
                               memory("Met her husband", "relation", occurred_at="2019"),
                               memory("Has a job interview", "event", occurred_at="2026-11-27"),
                               memory("Lives in Munich"),
                               memory("Moved to Munich", "event", occurred_at="last month")])
    sid, payload = session_with(db, "I started my new job at Siemens last week, in Munich, where I moved last month")
    said_on(db, sid, THURSDAY)
    result = extract(payload)
    assert (result["outcome"], result["memories"]) == ("extracted", 5)  # the unreadable time lost no memory
    transcript = extraction_requests(llm)[-1]["messages"][-1]["content"]
    assert "<session>\n[Thursday 2026-11-26]\nuser: I started my new job at Siemens last week" in transcript
    assert event_times(db) == {"Started a new job at Siemens": (date(2026, 11, 16), "week"),
                               "Met her husband": (date(2019, 1, 1), "year"),
                               "Has a job interview": (date(2026, 11, 27), "day"),
                               "Lives in Munich": (None, None), "Moved to Munich": (None, None)}


def dream(db, text: str) -> dict:
    return extract(session_with(db, text)[1])


def test_a_repeat_that_names_a_time_gives_it_to_the_known_memory(db, providers):
    llm, _ = providers
    job = "Started a new job at Siemens"
    script(llm, lambda known: [memory(job, "event")],
           lambda known: [memory("Started at Siemens", "event", same_as=known[job], occurred_at="2026-W47")],
           lambda known: [memory("Started at Siemens", "event", same_as=known[job], occurred_at="2026-11")],
           lambda known: [memory("Started at Siemens", "event", same_as=known[job])],
           lambda known: [memory("Started at Siemens", "event", same_as=known[job], occurred_at="2027-01")])
    dream(db, "I have a new job at Siemens")
    for text, expected in (("I started at Siemens last week", (date(2026, 11, 16), "week")),
                           ("I started at Siemens in November", (date(2026, 11, 16), "week")),  # agrees: kept
                           ("Siemens is going well", (date(2026, 11, 16), "week")),  # no time: kept
                           ("Actually I start at Siemens in January", (date(2027, 1, 1), "month"))):  # changed
        assert dream(db, text)["confirmed"] == 1
        assert event_times(db) == {job: expected}, text
    known = extraction_requests(llm)[-1]["messages"][-1]["content"]
    assert f"(event, noted {datetime.now(UTC):%Y-%m-%d}; when: in the week of 2026-11-16): {job}" in known


@pytest.mark.parametrize("sentence,day,expected", [
    ("I went hiking yesterday with my sister.", date(2026, 11, 25), "2026-11-24"),
    ("I have a job interview tomorrow.", date(2026, 11, 25), "2026-11-26"),
    ("I am so tired today.", date(2026, 11, 25), "2026-11-25"),
    ("I started my new job at Siemens last week.", date(2026, 11, 26), "2026-W47"),
    ("My sister visits me next week.", date(2026, 11, 26), "2026-W49"),
    ("I moved to Porto last month.", date(2026, 1, 10), "2025-12"),
    ("I broke up with my boyfriend last year.", date(2026, 11, 25), "2025"),
    ("I met my wife in 2019 in Izmir.", date(2026, 11, 25), "2019"),
    ("I started my new job last week.", date(2026, 1, 1), "2025-W52"),  # ISO week 2026-W01 began on 2025-12-29
    ("我昨天去看了医生。", date(2026, 11, 25), "2026-11-24"),
    ("我明天要参加数学考试。", date(2026, 11, 25), "2026-11-26"),
    ("我上周开始了新工作。", date(2026, 11, 26), "2026-W47"),
    ("我去年搬到了上海。", date(2026, 11, 25), "2025"),
    ("我2019年大学毕业了。", date(2026, 11, 25), "2019"),
    ("I really love mocha.", date(2026, 11, 25), None),
    ("My family came here in 1066, I like to say.", date(2026, 11, 25), None),  # not a time of a life
])
def test_the_offline_extractor_resolves_common_time_words_against_the_day_they_were_said(sentence, day, expected):
    sent = datetime(day.year, day.month, day.day, 9, tzinfo=UTC)
    transcript = render_transcript([], [{"id": 1, "role": "user", "content": sentence, "sent_at": sent}])
    [candidate] = parse_candidates(json.dumps(offline_candidates(transcript)))
    assert not candidate.content.startswith(("I ", "我")) and "my " not in candidate.content  # told about the user
    assert any(word in candidate.content for word in ("yesterday", "tomorrow", "today", "week", "month", "year", "20",
                                                       "昨天", "明天", "上周", "去年")) or expected is None
    assert (candidate.occurred_at.text() if candidate.occurred_at else None) == expected


def test_the_local_stack_with_no_keys_dreams_an_event_time(db):
    api = Api()
    sid = api.session()
    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I started my new job at Siemens last week."})
    said_on(db, sid, THURSDAY)
    go_idle(db)
    assert sweep_locally()["invoked"] == 1
    [memory] = api.call("GET", "/v1/memories?layer=profile")[1]["memories"]
    assert (memory["occurred_at"], memory["occurred_precision"]) == ("2026-W47", "week")


def test_the_deep_pass_keeps_the_time_its_duplicates_told(db, env, fake_llm):
    env(LLM_BASE_URL=fake_llm.url, OPENROUTER_API_KEY="test-key", PROVIDER_MAX_RETRIES=0)
    told = ((None, None), (date(2026, 11, 1), "month"), (date(2026, 11, 16), "week"), (None, None))  # oldest first
    rows = [stored_memory(db, "alice", "Started at Siemens", days_ago=30 - 5 * n) for n in range(len(told))]
    for row, (at, precision) in zip(rows, told, strict=True):
        db.execute("UPDATE engine.companion_memories SET occurred_at = %s, occurred_precision = %s WHERE id = %s",
                   (at, precision, row))
    due(db, "alice")
    fake_llm.responder = lambda body: json.dumps({"actions": [{"keep": "m1", "duplicates": ["m2", "m3", "m4"]}]})
    assert run("alice", claim_one(db, "alice")).merged == 3
    shown = fake_llm.requests[-1]["json"]["messages"][1]["content"]
    assert "mentioned 1x; when: in the week of 2026-11-16): Started at Siemens" in shown
    # November, then a week of it: they agree, and the week is the more precise; the last said no time.
    assert event_times(db) == {"Started at Siemens": (date(2026, 11, 16), "week")}
    [kept] = db.execute("SELECT id FROM engine.companion_memories WHERE superseded_at IS NULL").fetchall()
    assert kept["id"] == rows[0]


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
    system = build_messages("You are Luna.", memory_section(profile_rows, relationship), [], "hi")[0]["content"]
    assert ("[fact]\n- Lives in Munich (noted 2026-11-26)\n"
            "[event]\n- Started a new job at Siemens (in the week of 2026-11-16; noted 2026-11-26)\n"
            "- Moved to Munich (in March 2019; noted 2026-11-26)\n"
            "[relation]\n- Met her husband \u2039/memory\u203a in 1999 (in 2019; noted 2026-11-26)\n"
            "</memory>") in system
    assert ("- (2026-11-26) My interview is on the 3rd (on 2026-12-03)\n- (2026-11-26) hello\n</memory>") in system


def test_when_did_i_start_my_new_job_is_answered_from_memory(db, providers):
    llm, _ = providers
    answer_extraction_with(llm, json.dumps({"memories": [{"content": "Started a new job at Siemens",
                                                          "category": "event", "occurred_at": "2026-W47"}]}))
    api = Api()
    first = api.session()
    assert api.call("POST", f"/v1/sessions/{first}/turns",
                    {"content": "I started my new job at Siemens last week"})[0] == 200
    said_on(db, first, THURSDAY)
    go_idle(db)
    assert sweep_locally()["invoked"] == 1
    assert "[Thursday 2026-11-26]\nuser: I started my new job at Siemens last week" in \
        extraction_requests(llm)[0]["messages"][-1]["content"]

    later = api.session(persona="kai")
    status, reply = api.call("POST", f"/v1/sessions/{later}/turns", {"content": "when did I start my new job?"})
    assert status == 200
    system = chat_requests(llm)[-1]["messages"][0]["content"]
    assert "- Started a new job at Siemens (in the week of 2026-11-16; noted " in system
    [recalled] = [r for r in reply["recalled"] if r["layer"] == "profile"]
    assert (recalled["content"], recalled["occurred_at"], recalled["occurred_precision"]) == (
        "Started a new job at Siemens", "2026-W47", "week")
    # The stored turn keeps ids and numbers, not the memory's own data: a deleted memory leaves no copy.
    [stored] = [r for m in api.call("GET", f"/v1/sessions/{later}/messages")[1]["messages"] if m["recalled"]
                for r in m["recalled"] if r["layer"] == "profile"]
    assert (stored["id"], stored["content"], stored["occurred_at"]) == (recalled["id"], None, None)


# --- the API -------------------------------------------------------------------------------------------------------

def test_a_stated_memory_takes_an_event_time_and_an_edit_sets_keeps_or_clears_it(db, providers):
    api = Api()
    status, stated = api.call("POST", "/v1/memories", {"content": "Met Mehmet in Izmir", "category": "relation",
                                                       "occurred_at": "2019-03"})
    assert status == 201 and (stated["occurred_at"], stated["occurred_precision"]) == ("2019-03", "month")
    assert event_times(db) == {"Met Mehmet in Izmir": (date(2019, 3, 1), "month")}
    plain = api.call("POST", "/v1/memories", {"content": "Likes tea", "category": "preference"})[1]
    assert (plain["occurred_at"], plain["occurred_precision"]) == (None, None)

    edited = api.call("PATCH", f"/v1/memories/{stated['id']}", {"occurred_at": "2019-w11"})[1]
    assert (edited["occurred_at"], edited["occurred_precision"], edited["supersedes"]) == (
        "2019-W11", "week", [stated["id"]])
    assert [(v["occurred_at"], v["occurred_precision"]) for v in edited["history"]] == [
        ("2019-03", "month"), ("2019-W11", "week")]
    kept = api.call("PATCH", f"/v1/memories/{edited['id']}", {"content": "Met Mehmet in Izmir, at a wedding"})[1]
    assert kept["occurred_at"] == "2019-W11"  # not named: kept
    cleared = api.call("PATCH", f"/v1/memories/{kept['id']}", {"occurred_at": None})  # an explicit null clears it
    assert cleared[0] == 200 and (cleared[1]["occurred_at"], cleared[1]["occurred_precision"]) == (None, None)
    listed = {m["id"]: m["occurred_at"] for m in api.call("GET", "/v1/memories?include=superseded")[1]["memories"]}
    assert [listed[m["id"]] for m in (stated, edited, kept, cleared[1])] == ["2019-03", "2019-W11", "2019-W11", None]
    dated = api.call("PATCH", f"/v1/memories/{cleared[1]['id']}", {"occurred_at": "2019"})[1]
    [found] = api.call("POST", "/v1/memories/search", {"query": "Mehmet Izmir wedding", "k": 1})[1]["results"]
    assert (found["id"], found["occurred_at"], found["occurred_precision"]) == (dated["id"], "2019", "year")


BAD = {"bad month": "2019-13", "week 60": "2019-W60", "words": "yesterday", "a number": 12345, "10 KB": "9" * 10_240,
       "year 0": "0000", "an object": {"year": 2019}, "a list": ["2019"], "true": True, "30 February": "2019-02-30",
       "a datetime": "2019-03-01T10:00:00Z"}


@pytest.mark.parametrize("value", BAD.values(), ids=BAD.keys())
def test_a_bad_event_time_is_a_422_naming_the_field_and_changes_nothing(db, providers, value):
    _, voyage = providers
    api = Api()
    good = api.call("POST", "/v1/memories", {"content": "Started at Siemens", "category": "event"})[1]
    before = voyage.calls
    for method, path, body in (("POST", "/v1/memories", {"content": "x", "category": "fact", "occurred_at": value}),
                               ("PATCH", f"/v1/memories/{good['id']}", {"occurred_at": value}),
                               ("PATCH", f"/v1/memories/{good['id']}", {"content": "y", "occurred_at": value})):
        status, answer = api.call(method, path, body)
        assert status == 422 and answer["code"] == "invalid_request", (method, body, answer)
        assert [e["field"] for e in answer["errors"]] == ["body.occurred_at"] and len(answer["message"]) < 300
    assert voyage.calls == before and [m["id"] for m in api.call("GET", "/v1/memories")[1]["memories"]] == [
        good["id"]]


def test_the_documented_api_describes_the_event_time(db):
    schemas = Api().call("GET", "/v1/openapi.json", user=None)[1]["components"]["schemas"]
    for name in ("Memory", "SearchResult", "RecalledMemory"):
        fields = schemas[name]["properties"]
        assert {"occurred_at", "occurred_precision"} <= set(fields), name
        assert "day" in json.dumps(fields["occurred_precision"]) and "week" in json.dumps(fields["occurred_precision"])
    for name in ("NewMemory", "MemoryEdit"):
        assert "YYYY-Www" in json.dumps(schemas[name]["properties"]["occurred_at"]), name


def test_the_export_holds_the_event_time_as_the_api_speaks_it(db, providers, env, tmp_path):
    env(EXPORT_DIR=str(tmp_path), EXPORT_BASE_URL="http://127.0.0.1:9/local")
    api = Api()
    api.call("POST", "/v1/memories", {"content": "Started at Siemens", "category": "event", "occurred_at": "2026-W47"})
    api.call("POST", "/v1/memories", {"content": "Likes tea", "category": "preference"})
    link = api.call("GET", "/v1/export")[1]
    document = json.loads((tmp_path / link["url"].split("/local/", 1)[1]).read_text())
    assert {m["content"]: (m["occurred_at"], m["occurred_precision"]) for m in document["memories"]} == {
        "Started at Siemens": ("2026-W47", "week"), "Likes tea": (None, None)}
