"""Episodes (migration 0021): the session's extraction also writes one short account of what happened between the
user and the persona, in the persona's memory voice, into that persona's relationship layer -- in the same LLM call
and the same embedding batch as the memories; a resumed session rewrites it in place; a bad one costs nothing else."""

from __future__ import annotations

import json
from datetime import date

import pytest
from apiclient import Api
from helpers import go_idle

from eros.extraction import EPISODE_PROMPT, MAX_EPISODE_CHARS, Unparsable, parse_extraction
from eros.memory import EventTime
from eros.providers.offline import offline_episode
from eros_dev.dreaming import sweep_locally

MEMORIES = [{"content": "Has an interview at Siemens", "category": "event", "importance": 0.8},
            {"content": "Is nervous about interviews", "category": "emotion", "importance": 0.6}]
EPISODE = "Mei told Luna she was nervous about the Siemens interview; Luna helped her rehearse."


def answer(episode=None, memories=MEMORIES, **extra) -> str:
    return json.dumps({"memories": memories, "episode": episode, **extra})


def answer_with(fake_llm, text_or_fn) -> None:
    fake_llm.responder = lambda body: ((text_or_fn(body) if callable(text_or_fn) else text_or_fn)
                                       if body.get("response_format") else "fake reply")


def extraction_prompts(fake_llm) -> list[str]:
    return [r["json"]["messages"][-1]["content"] for r in fake_llm.requests if r["json"].get("response_format")]


def episodes(db) -> list[dict]:
    return db.execute("SELECT * FROM engine.companion_memories WHERE source = 'episode' ORDER BY created_at").fetchall()


def messages(db, sid) -> list[int]:
    return [r["id"] for r in db.execute("SELECT id FROM engine.chat_messages WHERE session_id = %s ORDER BY id",
                                        (sid,)).fetchall()]


def chat(api: Api, sid: str, *texts: str) -> None:
    for text in texts:
        status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": text})
        assert status == 200, body


def dream(db) -> dict:
    go_idle(db)
    result = sweep_locally()
    assert result["invoked"] >= 1, result
    return result


@pytest.fixture
def online(providers, env):
    env(DREAMING_IDLE_SECS=1800)
    return providers


# --- the extraction writes it --------------------------------------------------------------------------------------
def test_extraction_writes_the_episode_in_the_relationship_layer_with_provenance_in_the_same_two_calls(online, db):
    fake_llm, fake_voyage = online
    answer_with(fake_llm, answer({"content": EPISODE, "occurred_at": "2026-11-25"}))
    api = Api()
    sid = api.session(persona="luna")
    chat(api, sid, "I have the Siemens interview on Friday", "Can we rehearse?")
    llm_before, embed_before = fake_llm.calls, fake_voyage.calls
    result = dream(db)
    assert result["invoked"] == 1
    # Still one LLM call and one embedding batch: the episode rides in the memories' batch, last.
    assert (fake_llm.calls - llm_before, fake_voyage.calls - embed_before) == (1, 1)
    batch = fake_voyage.requests[-1]["json"]
    assert batch["input_type"] == "document" and batch["input"] == [m["content"] for m in MEMORIES] + [EPISODE]
    prompt = extraction_prompts(fake_llm)[-1]
    assert "<persona>Luna</persona>" in prompt and "<episode_so_far>" not in prompt

    [row] = episodes(db)
    session = db.execute("SELECT * FROM engine.chat_sessions WHERE id = %s", (sid,)).fetchone()
    ids = messages(db, sid)
    assert row["content"] == EPISODE and row["category"] is None and row["importance"] is None
    assert row["instance_id"] == session["instance_id"] and row["session_id"] == session["id"]
    assert (row["from_message_id"], row["through_message_id"]) == (ids[0], ids[-1])
    assert row["metadata"]["model"] == "anthropic/claude-haiku-4.5" and row["metadata"]["embed_model"]
    assert (row["occurred_at"], row["occurred_precision"]) == (date(2026, 11, 25), "day")
    assert session["extracted_at"] is not None and session["extraction_error"] is None
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories WHERE source = 'dreaming'"
                      ).fetchone()["n"] == 2


def test_an_episode_without_a_time_gets_the_day_its_messages_were_sent(online, db):
    answer_with(online[0], answer(EPISODE))  # bare text, no occurred_at
    api = Api()
    chat(api, api.session(), "I have the Siemens interview on Friday")
    dream(db)
    [row] = episodes(db)
    sent = db.execute("SELECT sent_at FROM engine.chat_messages ORDER BY id LIMIT 1").fetchone()["sent_at"]
    assert (row["occurred_at"], row["occurred_precision"]) == (sent.date(), "day")


def test_a_session_with_only_an_episode_writes_it_with_one_embedding_and_is_extracted(online, db):
    fake_llm, fake_voyage = online
    answer_with(fake_llm, json.dumps({"episode": {"content": "Luna and the user said hello.", "occurred_at": None}}))
    api = Api()
    sid = api.session()
    chat(api, sid, "hello there")
    embed_before = fake_voyage.calls
    dream(db)
    assert fake_voyage.calls - embed_before == 1 and fake_voyage.requests[-1]["json"]["input"] == [
        "Luna and the user said hello."]
    assert [r["content"] for r in episodes(db)] == ["Luna and the user said hello."]
    row = db.execute("SELECT extracted_at, extraction_error FROM engine.chat_sessions WHERE id = %s", (sid,)).fetchone()
    assert row["extracted_at"] is not None and row["extraction_error"] is None


def test_the_offline_stand_in_writes_a_plain_deterministic_episode(db):
    api = Api()
    sid = api.session(persona="kai")
    chat(api, sid, "My boss keeps piling on new demands. I love hiking.", "I will quit.")
    dream(db)
    [row] = episodes(db)
    assert row["content"] == "The user told Kai: \u201cMy boss keeps piling on new demands. I love hiking.\u201d."
    assert row["metadata"]["model"] == "offline/echo" and row["occurred_precision"] == "day"
    # The same transcript, the same episode.
    transcript = ("<persona>Kai</persona>\n\n<session>\n[Monday 2026-11-23]\nuser: hi there\nassistant: hello\n"
                  "user: I got the job\n</session>")
    assert offline_episode(transcript) == offline_episode(transcript) == {
        "content": "The user told Kai: \u201cI got the job\u201d.", "occurred_at": "2026-11-23"}
    assert offline_episode("<session>\nassistant: hello\n</session>") is None
    assert offline_episode("<session>\nuser: hi there\nassistant: hello\n</session>") is None  # small talk only


# --- resumed sessions ------------------------------------------------------------------------------------------------
def test_a_resumed_session_rewrites_its_episode_in_place_shown_the_one_before(online, db):
    fake_llm, _ = online
    answer_with(fake_llm, answer({"content": EPISODE, "occurred_at": "2026-11-25"}))
    api = Api()
    sid = api.session()
    chat(api, sid, "I have the Siemens interview on Friday")
    dream(db)
    [first] = episodes(db)

    rewritten = EPISODE + " Later she told Luna she got the job."
    answer_with(fake_llm, answer({"content": rewritten, "occurred_at": "2026-W48"}, memories=[]))
    chat(api, sid, "I got the job!")
    dream(db)
    prompt = extraction_prompts(fake_llm)[-1]
    assert f"<episode_so_far>\n{EPISODE}\n</episode_so_far>" in prompt
    [row] = episodes(db)  # one episode per session, never a second
    ids = messages(db, sid)
    assert row["id"] == first["id"] and row["created_at"] == first["created_at"]
    assert row["content"] == rewritten and row["embedding"] != first["embedding"]
    assert (row["from_message_id"], row["through_message_id"]) == (ids[0], ids[-1])
    assert (row["occurred_at"], row["occurred_precision"]) == (date(2026, 11, 23), "week")
    assert row["metadata"]["rewrites"] == 1


def test_a_resumed_session_whose_answer_has_no_episode_keeps_the_one_it_has(online, db):
    fake_llm, _ = online
    answer_with(fake_llm, answer(EPISODE))
    api = Api()
    sid = api.session()
    chat(api, sid, "I have the Siemens interview on Friday")
    dream(db)
    answer_with(fake_llm, answer(None, memories=[{"content": "Got the job", "category": "event"}]))
    chat(api, sid, "I got the job!")
    dream(db)
    [row] = episodes(db)
    assert row["content"] == EPISODE and "rewrites" not in row["metadata"]


def test_the_offline_stand_in_resumes_its_episode(db):
    api = Api()
    sid = api.session(persona="mei")
    chat(api, sid, "I have the Siemens interview on Friday.")
    dream(db)
    chat(api, sid, "I got the job at Siemens!")
    dream(db)
    [row] = episodes(db)
    assert row["content"] == ("The user told Mei: \u201cI have the Siemens interview on Friday.\u201d. Later, the user"
                              " told Mei: \u201cI got the job at Siemens!\u201d.")
    assert row["occurred_precision"] == "day"  # the server's: both parts were said today


def test_each_window_of_a_long_session_is_shown_the_episode_the_window_before_wrote(online, db, monkeypatch):
    from eros.dreaming import session
    monkeypatch.setattr(session, "WINDOW_CHARS", 200)
    fake_llm, _ = online
    answer_with(fake_llm, lambda body: answer(f"Episode after {body['messages'][-1]['content'].count('user: ')} turns"
                                              + (" (resumed)" if "<episode_so_far>" in body["messages"][-1]["content"]
                                                 else ""), memories=[]))
    api = Api()
    sid = api.session()
    chat(api, sid, *(f"message number {n} " + "x" * 60 for n in range(4)))
    dream(db)
    prompts = extraction_prompts(fake_llm)
    assert len(prompts) >= 2 and "<episode_so_far>" not in prompts[0]
    assert all("<episode_so_far>\nEpisode after" in p for p in prompts[1:])
    [row] = episodes(db)
    assert row["content"].endswith("(resumed)") and row["through_message_id"] == messages(db, sid)[-1]


# --- bad episodes cost nothing else --------------------------------------------------------------------------------
BAD = {
    "too long": {"content": "x" * (MAX_EPISODE_CHARS + 1)},
    "a number": 42,
    "a list": ["Luna", "helped"],
    "content not text": {"content": {"nested": "object"}},
    "empty content": {"content": "   "},
}


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_a_bad_episode_is_refused_and_the_sessions_memories_are_written(online, db, bad, caplog):
    fake_llm, fake_voyage = online
    answer_with(fake_llm, answer(bad))
    api = Api()
    sid = api.session()
    chat(api, sid, "I have the Siemens interview on Friday")
    dream(db)
    assert episodes(db) == []
    assert fake_voyage.requests[-1]["json"]["input"] == [m["content"] for m in MEMORIES]  # not embedded
    assert {r["content"] for r in db.execute("SELECT content FROM engine.companion_memories WHERE source = 'dreaming'")
            } == {m["content"] for m in MEMORIES}
    row = db.execute("SELECT extracted_at, extraction_error FROM engine.chat_sessions WHERE id = %s", (sid,)).fetchone()
    assert row["extracted_at"] is not None and row["extraction_error"] is None
    refused = [r for r in caplog.records if r.getMessage() == "an extracted episode was refused"]
    assert len(refused) == 1 and "x" * 20 not in str(refused[0].__dict__)  # says why, never quotes it


def test_parse_reads_the_episode_beside_the_memories():
    parsed = parse_extraction(answer({"content": f"  {EPISODE}\n", "occurred_at": "2026-W48"}))
    assert [c.content for c in parsed.candidates] == [m["content"] for m in MEMORIES]
    assert parsed.episode is not None and parsed.episode.content == EPISODE
    assert parsed.episode.occurred_at == EventTime(date(2026, 11, 23), "week")
    assert parse_extraction(answer({"content": EPISODE, "occurred_at": "last week"})).episode.occurred_at is None
    assert parse_extraction(answer(None)).episode is None and parse_extraction(answer(None)).episode_refused is None
    assert parse_extraction(json.dumps([{"content": "Likes tea"}])).episode is None  # a bare list: no episode
    only = parse_extraction('Here you go: {"episode": "Luna and the user said hello."}')
    assert only.candidates == [] and only.episode is not None
    refused = parse_extraction(answer({"content": "x" * 10_000}))
    assert refused.episode is None and "over 600" in refused.episode_refused and len(refused.candidates) == 2
    with pytest.raises(Unparsable):
        parse_extraction('{"summary": "nothing"}')


def test_an_episode_that_told_a_changed_fact_leaves_recall_with_it_and_comes_back_on_restore(online, db):
    fake_llm, _ = online
    answer_with(fake_llm, answer({"content": "The user told Luna she lives in Shanghai."},
                                 memories=[{"content": "Lives in Shanghai", "category": "fact"}]))
    api = Api()
    chat(api, api.session(), "I live in Shanghai")
    dream(db)

    def moved(body):
        handle = "m1" if "Lives in Shanghai" in body["messages"][-1]["content"] else None
        return answer(None, memories=[{"content": "Lives in Tokyo", "category": "fact", "supersedes": [handle]}])
    answer_with(fake_llm, moved)
    chat(api, api.session(), "I moved: I live in Tokyo now, not Shanghai")
    dream(db)
    old = db.execute("SELECT id FROM engine.companion_memories WHERE content = 'Lives in Shanghai'").fetchone()["id"]
    [episode] = episodes(db)
    # As the utterance that said it: the prompt must not bring the old city back next to the new one.
    assert (episode["superseded_reason"], episode["superseded_by"]) == ("outdated", old)
    status, body = api.call("POST", f"/v1/memories/{old}/restore")
    assert status == 200, body
    assert episodes(db)[0]["superseded_at"] is None


# --- the memory API: listed, filtered, corrected, deleted, exported --------------------------------------------------
def test_the_api_lists_filters_gets_corrects_deletes_and_exports_episodes(online, db, env, tmp_path):
    fake_llm, fake_voyage = online
    env(EXPORT_DIR=str(tmp_path), EXPORT_BASE_URL="http://127.0.0.1:9/local")
    answer_with(fake_llm, answer({"content": EPISODE, "occurred_at": "2026-11-25"}))
    api = Api()
    sid = api.session()
    chat(api, sid, "I have the Siemens interview on Friday")
    dream(db)
    ids = messages(db, sid)

    status, page = api.call("GET", "/v1/memories?source=episode")
    assert status == 200 and len(page["memories"]) == 1
    [listed] = page["memories"]
    assert {k: listed[k] for k in ("layer", "category", "source", "persona_id", "session_id", "from_message_id",
                                   "through_message_id", "model", "occurred_at", "occurred_precision")} == {
        "layer": "relationship", "category": None, "source": "episode", "persona_id": "luna", "session_id": sid,
        "from_message_id": ids[0], "through_message_id": ids[-1], "model": "anthropic/claude-haiku-4.5",
        "occurred_at": "2026-11-25", "occurred_precision": "day"}
    assert {m["source"] for m in api.call("GET", "/v1/memories?layer=relationship")[1]["memories"]} == {
        "utterance", "episode"}
    assert {m["source"] for m in api.call("GET", "/v1/memories?source=utterance")[1]["memories"]} == {"utterance"}
    status, body = api.call("GET", "/v1/memories?source=diary")
    assert status == 422 and "source" in json.dumps(body)
    assert api.call("GET", "/v1/memories?source=episode", user="bob")[1]["memories"] == []

    status, one = api.call("GET", f"/v1/memories/{listed['id']}")
    assert status == 200 and one["source"] == "episode" and [h["id"] for h in one["history"]] == [listed["id"]]

    # Corrected in place: the same row, its text embedded again, its provenance kept.
    embed_before = fake_voyage.calls
    fixed = "Mei told Luna she was nervous about the Siemens interview; they rehearsed it twice."
    status, edited = api.call("PATCH", f"/v1/memories/{listed['id']}", {"content": fixed, "occurred_at": "2026-W48"})
    assert status == 200, edited
    assert (edited["id"], edited["content"], edited["occurred_at"], edited["session_id"]) == (
        listed["id"], fixed, "2026-W48", sid)
    assert fake_voyage.calls == embed_before + 1 and fake_voyage.requests[-1]["json"]["input"] == [fixed]
    row = episodes(db)[0]
    assert row["metadata"]["edited_at"] and row["superseded_at"] is None
    status, body = api.call("PATCH", f"/v1/memories/{listed['id']}", {"category": "event"})
    assert status == 422 and body["code"] == "not_an_episode_field" and episodes(db)[0]["content"] == fixed

    # The export carries it, with its provenance.
    status, link = api.call("GET", "/v1/export")
    assert status == 200
    document = json.loads((tmp_path / link["url"].split("/local/", 1)[1]).read_text())
    [exported] = [m for m in document["memories"] if m["source"] == "episode"]
    assert (exported["content"], exported["session_id"], exported["through_message_id"]) == (fixed, sid, ids[-1])

    # A resumed session goes on from the correction; deleted, the next extraction writes a new one.
    answer_with(fake_llm, answer(None, memories=[]))
    chat(api, sid, "It went well")
    dream(db)
    assert f"<episode_so_far>\n{fixed}\n</episode_so_far>" in extraction_prompts(fake_llm)[-1]
    assert api.call("DELETE", f"/v1/memories/{listed['id']}")[0] == 204
    assert api.call("GET", "/v1/memories?source=episode")[1]["memories"] == []
    answer_with(fake_llm, answer("Mei told Luna the interview went well.", memories=[]))
    chat(api, sid, "They called back")
    dream(db)
    assert "<episode_so_far>" not in extraction_prompts(fake_llm)[-1]
    [again] = episodes(db)
    assert again["content"] == "Mei told Luna the interview went well." and again["id"] != listed["id"]


# --- the backfill for sessions extracted before episodes -------------------------------------------------------------
def test_the_backfill_writes_one_episode_per_past_session_within_budget_and_skips_cut_transcripts(online, db, env):
    from eros.config import settings
    from eros.dreaming.episodes import backfill
    fake_llm, fake_voyage = online
    answer_with(fake_llm, json.dumps({"memories": MEMORIES}))  # an earlier release: no episodes
    api = Api()
    sessions = {}
    for user, persona in (("alice", "luna"), ("alice", "kai"), ("bob", "luna"), ("carol", "mei")):
        sid = api.session(user=user, persona=persona)
        for text in (f"{user} has the Siemens interview", "Can we rehearse?"):
            assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": text}, user=user)[0] == 200
        sessions[(user, persona)] = sid
    dream(db)
    assert episodes(db) == []
    pending = api.session(user="alice", persona="mei")  # never extracted: dreaming's, not the backfill's
    chat(api, pending, "hello")
    # Retention cut carol's transcript; bob is over his day's budget.
    db.execute("DELETE FROM engine.chat_messages WHERE id = (SELECT min(id) FROM engine.chat_messages"
               " WHERE session_id = %s)", (sessions[("carol", "mei")],))
    env(DAILY_TOKEN_BUDGET=1_000_000)
    db.execute("UPDATE engine.user_usage SET tokens = 2000000 WHERE user_id = 'bob'")

    def told(body):
        prompt = body["messages"][-1]["content"]
        assert body["messages"][0]["content"] == EPISODE_PROMPT  # the episode alone: the memories were extracted
        persona = prompt.split("<persona>", 1)[1].split("</persona>", 1)[0]
        return json.dumps({"episode": {"content": f"Alice told {persona} about the Siemens interview.",
                                       "occurred_at": None}})
    answer_with(fake_llm, told)
    llm_before, embed_before = fake_llm.calls, fake_voyage.calls
    done = backfill(settings(), limit=10)
    assert (done.written, done.deferred, done.retention_skipped, done.failed) == (2, 1, 1, 0)
    assert done.deferred_users == ["bob"]
    assert (fake_llm.calls - llm_before, fake_voyage.calls - embed_before) == (2, 2)  # 1 + 1 per session
    rows = {r["session_id"]: r for r in episodes(db)}
    assert set(map(str, rows)) == {sessions[("alice", "luna")], sessions[("alice", "kai")]}
    kai = rows[next(k for k in rows if str(k) == sessions[("alice", "kai")])]
    ids = messages(db, sessions[("alice", "kai")])
    assert kai["content"] == "Alice told Kai about the Siemens interview."
    assert (kai["from_message_id"], kai["through_message_id"]) == (ids[0], ids[-1])
    assert kai["metadata"]["backfilled"] is True and kai["occurred_precision"] == "day"
    assert db.execute("SELECT calls FROM engine.user_model_usage WHERE user_id = 'alice' AND purpose = 'extraction'"
                      " AND model = 'anthropic/claude-haiku-4.5'").fetchone()["calls"] >= 3  # its extraction, 2 more

    # Run again: nothing left for it, nothing paid; bob's budget back, his session is done.
    llm_before = fake_llm.calls
    again = backfill(settings(), limit=10)
    assert (again.written, again.deferred, fake_llm.calls - llm_before) == (0, 1, 0)
    db.execute("UPDATE engine.user_usage SET tokens = 0 WHERE user_id = 'bob'")
    assert backfill(settings(), user_id="bob").written == 1 and len(episodes(db)) == 3


def test_the_backfill_never_replaces_an_episode_and_the_command_runs_offline(db, capsys):
    from eros_dev import cli
    api = Api()
    sid = api.session(persona="kai")
    chat(api, sid, "My sister Lin visits next weekend.")
    dream(db)  # the offline stand-in of this release writes its episode
    [written] = episodes(db)
    db.execute("DELETE FROM engine.companion_memories WHERE source = 'episode'")
    other = api.session(persona="luna")
    chat(api, other, "I started running on Sundays.")
    dream(db)
    assert cli.main(["backfill-episodes", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "episodes written: 1;" in out and "calls: 1 LLM + 1 embedding" in out
    [backfilled] = [r for r in episodes(db) if r["session_id"] == written["session_id"]]
    assert backfilled["content"] == written["content"]  # the same deterministic episode, from the whole transcript
    assert len(episodes(db)) == 2
    assert cli.main(["backfill-episodes"]) == 0 and "episodes written: 0;" in capsys.readouterr().out


def test_the_backfill_takes_one_apps_users_with_app(db, capsys):
    """`--app`: that app's users' sessions alone, and `--user` is a user of it (of the first app without it);
    neither: every app's."""
    from eros.store import apps as app_store
    from eros.store import personas as persona_store
    from eros_dev import cli

    app_store.create("acme", "Acme", {}, db)
    persona_store.keep_app("acme", "nova", "Nova", "", "You are Nova, a patient tutor.")
    api = Api()
    for user, app, persona in (("alice", None, "luna"), ("alice", "acme", "nova"), ("bob", "acme", "nova")):
        sid = api.session(user=user, persona=persona, app=app)
        status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": f"{user} runs on Sundays."},
                                user=user, app=app)
        assert status == 200, body
    dream(db)
    db.execute("DELETE FROM engine.companion_memories WHERE source = 'episode'")

    def backfilled(*flags: str) -> list[str]:
        before = {r["user_id"] for r in episodes(db)}
        assert cli.main(["backfill-episodes", *flags]) == 0
        capsys.readouterr()
        return sorted({r["user_id"] for r in episodes(db)} - before)

    assert backfilled("--user", "alice", "--app", "acme") == ["acme\x1falice"]
    assert backfilled("--app", "acme") == ["acme\x1fbob"]
    assert backfilled("--app", "acme") == []
    assert backfilled("--user", "bob") == []  # the first app's bob has no session
    assert backfilled("--user", "alice") == ["alice"]
    db.execute("DELETE FROM engine.companion_memories WHERE source = 'episode'")
    assert backfilled() == ["acme\x1falice", "acme\x1fbob", "alice"]  # an upgrade's backfill: every app's
    assert cli.main(["backfill-episodes", "--app", "globex"]) == 1
    assert "there is no app 'globex'" in capsys.readouterr().err

