"""The offline stand-in extractor (eros.providers.offline): what a newcomer with no keys sees first. It must make
memories a person would write -- one fact a clause, about the user in the third person, no questions or small talk
-- and supersede only the fact that changed."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from apiclient import Api
from helpers import extract, go_idle
from test_consolidation import active, dream, profile, session_with

from eros.dreaming import session as session_job
from eros.extraction import handles, render_transcript
from eros.providers.offline import OfflineChat, chatter, offline_candidates, offline_episode, third_person
from eros.store import dreaming as store

SENT = datetime(2026, 11, 30, 9, tzinfo=UTC)


def candidates(*turns: str, known: list[dict] | None = None) -> list[dict]:
    messages = [{"id": i, "role": "user", "content": t, "sent_at": SENT} for i, t in enumerate(turns, 1)]
    return offline_candidates(render_transcript([], messages, handles(known) if known else None))


@pytest.mark.parametrize(("said", "told"), [
    ("I live in Shanghai", "Lives in Shanghai"),
    ("I'm a nurse", "Works as a nurse"),
    ("I am an ER nurse at the city hospital.", "Works as an ER nurse at the city hospital"),
    ("I really love mocha.", "Really loves mocha"),
    ("I moved to Tokyo!", "Moved to Tokyo"),
    ("So, I moved to Tokyo last week", "Moved to Tokyo last week"),
    ("Yesterday I went hiking with my sister", "Went hiking with their sister yesterday"),
    ("I study law", "Studies law"),
    ("I watch anime with my dad", "Watches anime with their dad"),
    ("I have a daughter, Mia", "Has a daughter, Mia"),
    ("I've started dating Jonas", "Has started dating Jonas"),
    ("I don't eat meat", "Doesn't eat meat"),
    ("I'd love to visit Japan someday", "Would love to visit Japan someday"),
    ("I'm feeling anxious about my exam", "Is feeling anxious about their exam"),
    ("My sister is called Mia", "Their sister is called Mia"),
    ("我住在上海", "住在上海"),
    ("我的猫叫咪咪", "TA的猫叫咪咪"),
])
def test_a_statement_is_told_in_the_third_person(said, told):
    assert third_person(said) == told


def test_a_compound_statement_is_one_memory_a_clause_and_a_list_stays_whole():
    assert [c["content"] for c in candidates("I live in Shanghai and I'm a nurse.")] == [
        "Lives in Shanghai", "Works as a nurse"]
    assert [c["content"] for c in candidates("I like tea and coffee.")] == ["Likes tea and coffee"]
    assert [c["content"] for c in candidates("我住在上海，我是护士。")] == ["住在上海", "是护士"]
    assert [c["category"] for c in candidates("I love hiking, but my knee hurts.")] == ["preference", "fact"]


@pytest.mark.parametrize("turn", [
    "Where do I live now?", "Do you remember my sister?", "Hi!", "Hello there, thanks!", "I'm fine, thanks.",
    "lol", "ok", "I guess.", "I love you", "我住在哪里？", "你好", "Good morning!"])
def test_questions_and_small_talk_are_not_memories(turn):
    assert candidates(turn) == []


def test_small_talk_alone_has_no_episode_and_a_statement_has_one():
    assert offline_episode(render_transcript([], [{"id": 1, "role": "user", "content": "Hi!", "sent_at": SENT},
                                                   {"id": 2, "role": "user", "content": "thanks", "sent_at": SENT}])) \
        is None
    told = offline_episode(render_transcript([], [{"id": 1, "role": "user", "content": "Hi!", "sent_at": SENT},
                                                  {"id": 2, "role": "user", "content": "I got the job!",
                                                   "sent_at": SENT}]))
    assert told is not None and "I got the job!" in told["content"]


def test_a_change_supersedes_only_its_own_slot_and_a_repeat_is_the_same_memory():
    known = [{"id": 1, "content": "Lives in Shanghai", "category": "fact", "created_at": SENT},
             {"id": 2, "content": "Works as a nurse", "category": "fact", "created_at": SENT},
             {"id": 3, "content": "The user said: I like tea.", "category": "preference", "created_at": SENT}]
    found = {c["content"]: c for c in candidates("Guess what, I moved to Tokyo. I like tea.", known=known)}
    assert set(found) == {"Moved to Tokyo", "Likes tea"}
    assert found["Moved to Tokyo"]["supersedes"] == ["m1"]  # not the nurse fact
    assert found["Likes tea"]["same_as"] == "m3"  # an older quoted memory is the same statement


def test_a_later_statement_about_a_slot_in_the_same_session_wins_and_a_repeat_is_given_once():
    said = candidates("I live in Shanghai.", "I live in Shanghai.", "Actually I moved to Tokyo.", "I'm a chef.")
    assert [c["content"] for c in said] == ["Moved to Tokyo", "Works as a chef"]


def test_the_stand_in_is_deterministic_and_labelled():
    chat = OfflineChat()
    messages = [{"role": "system", "content": "extract"},
                {"role": "user", "content": render_transcript([], [{"id": 1, "role": "user", "sent_at": SENT,
                                                                    "content": "I live in Lisbon and I'm a chef."}])}]
    first = chat.complete(chat.model, messages, json_mode=True)
    again = chat.complete(chat.model, messages, json_mode=True)
    assert first.text == again.text and first.offline and first.model.startswith("offline/")
    assert [m["content"] for m in json.loads(first.text)["memories"]] == ["Lives in Lisbon", "Works as a chef"]
    assert first.usage["prompt_tokens"] > 0 and first.usage["completion_tokens"] > 0
    assert chatter("hi there") and not chatter("I live in Lisbon")


def test_shanghai_to_tokyo_with_no_keys_keeps_the_job(db):
    """The newcomer's demo, through the API and dreaming: a move to Tokyo supersedes the home, not the job."""
    dream(db, "Hi! I live in Shanghai and I'm a nurse.", "Where do I live now?")
    assert active(db) == ["Lives in Shanghai", "Works as a nurse"]
    dream(db, "Guess what, I moved to Tokyo last week!")
    assert active(db) == ["Moved to Tokyo last week", "Works as a nurse"]
    shanghai = next(r for r in profile(db) if r["content"] == "Lives in Shanghai")
    assert shanghai["superseded_reason"] == "changed"
    nurse = next(r for r in profile(db) if r["content"] == "Works as a nurse")
    assert nurse["superseded_at"] is None


def test_a_session_of_small_talk_is_shown_as_nothing_to_remember_not_as_extracted(db):
    api = Api()
    sid, payload = session_with(db, "Hi!", "How are you?", "thanks")
    extract(payload)
    kept, chatty = session_with(db, "I adopted a cat named Miso.")
    extract(chatty)
    quiet = api.session()  # a session with no message at all, dreamt about once quiet
    go_idle(db)
    now = datetime.now(UTC)
    [claimed] = store.claim(now, now - timedelta(seconds=600), 50)
    assert str(claimed["id"]) == quiet
    extract(session_job.event(claimed))
    states = {s["id"]: s["dreaming"] for s in api.call("GET", "/v1/sessions")[1]["sessions"]}
    assert [states[s]["state"] for s in (sid, kept, quiet)] == ["nothing", "extracted", "nothing"]
    assert states[kept]["error"] is None
    assert active(db) == ["Adopted a cat named Miso"]
