"""The consolidation evaluation (bench/consolidation_eval.py) runs and its figures hold: the scripted
model on a few users, both arms, through the real chat handler, claim, extract handler and recall."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import consolidation_eval  # noqa: E402

# Two English users and a Chinese one: update chains, repeats, repeat-only sessions, a session with
# nothing to remember, and traps.
SLICE = "en-02,en-17,zh-03"


def test_every_scripted_memory_is_labelled_as_its_own_fact():
    """The regexes that attribute stored rows to facts recognise every text the script writes, and only
    as the fact version it belongs to (otherwise the figures would count the wrong rows)."""
    users = consolidation_eval.load_users()
    assert len(users) >= 20 and any(u["lang"] == "zh" for u in users)
    for user in users:
        label = consolidation_eval.labeller(user)
        for name, fact in user["facts"].items():
            for v, version in enumerate(fact["versions"]):
                for text in [version["content"], *version["variants"]]:
                    assert label(text) == (name, v), (user["user"], text, label(text))
            if fact["kind"] == "chain":  # a row naming the old and the new value states the new one
                old, new = fact["versions"][0]["value"], fact["versions"][-1]["value"]
                assert label(f"Moved on from {old}: now {new}") == (name, len(fact["versions"]) - 1)


def test_scripted_run_reaches_the_targets_and_the_before_arm_does_not(database_url, tmp_path):
    out = tmp_path / "report.md"
    figures = consolidation_eval.run(["--users", SLICE, "--database-url", database_url, "--out", str(out)])
    after, before = figures["arms"]["after"], figures["arms"]["before"]

    # Consolidation on, with a model that names exactly the handles it was shown.
    assert after["script"]["supersedes shown"] == after["script"]["supersedes asked"] > 0
    assert after["script"]["same_as shown"] == after["script"]["same_as asked"] > 0
    assert after["probes"] == 6
    assert after["current_above_superseded"] == 1.0
    assert after["superseded_shown"] == 0.0
    assert after["stable_kept"] == 1.0 and after["false_supersession"] == 0.0
    assert after["traps"] > 0 and after["traps_kept"] == 1.0 and after["trap_bases_kept"] == 1.0
    assert after["repeated_facts"] > 0 and after["active_per_repeated"] == 1.0
    assert after["chains_one_active"] == 1.0 and after["stale_active_rows"] == 0
    assert after["unlabelled_rows"] == 0 and after["ignored"] == 0
    # Exactly 2 calls with new memories, 1 for repeat-only sessions and for nothing to remember.
    groups = after["sessions_by_outcome"]
    assert groups["new"]["calls"] == {2: groups["new"]["sessions"]}
    repeat_only = groups["repeat-only"]
    assert repeat_only["sessions"] >= 2 and repeat_only["calls"] == {1: repeat_only["sessions"]}
    assert groups["nothing"]["calls"] == {1: 1}
    assert after["calls_met"] and after["wire_matches_seam"] and after["expected_matches_outcome"] == 1.0

    # Consolidation off: the same sessions leave old versions active and repeats duplicated, and the
    # eval sees it (it can fail).
    assert before["stale_active_rows"] > 0 and before["chains_one_active"] == 0.0
    assert before["superseded_shown"] > 0
    assert before["active_per_repeated"] > 1.0
    assert before["superseded_rows"] == 0
    assert "repeat-only" not in before["sessions_by_outcome"]

    report = out.read_text()
    assert "| current above superseded (probes) | " in report and "after (consolidation on)" in report
    assert SLICE in report  # the exact command


def test_configured_model_is_refused_without_a_key(monkeypatch):
    for name in ("OPENROUTER_API_KEY", "LLM_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit, match="OPENROUTER_API_KEY"):
        consolidation_eval.run(["--llm", "configured", "--out", "-"])


def test_configured_mode_runs_a_configured_server_and_the_before_arm_strips_its_consolidation(
        database_url, tmp_path, monkeypatch):
    """--llm configured with LLM_BASE_URL pointing at an OpenAI-compatible server (here a fake that answers
    like the script, found by the session's turns): the answers reach the engine through the configured
    client, calls are counted at the client seam, and the before arm drops supersedes/same_as itself."""
    from fakes import FakeOpenRouter

    from eros.extraction import SYSTEM_PROMPT

    user = consolidation_eval.load_users(only=["zh-03"])[0]
    by_turns = {tuple(s["turns"]): s for s in user["sessions"]}
    asked = []

    def respond(body):
        assert body["messages"][0]["content"] == SYSTEM_PROMPT  # chat replies never reach the configured model
        text = body["messages"][-1]["content"]
        turns = tuple(line[len("user: "):] for line in text.split("<session>", 1)[1].splitlines()
                      if line.startswith("user: "))
        block = text.split("</known_memories>", 1)[0] if "<known_memories>" in text else ""
        asked.append(turns)
        return consolidation_eval.scripted_answer(by_turns[turns], user["facts"], block, True, collections.Counter())

    server = FakeOpenRouter(respond)
    try:
        monkeypatch.setenv("LLM_BASE_URL", server.url)
        monkeypatch.setenv("OPENROUTER_API_KEY", "k")
        figures = consolidation_eval.run(["--llm", "configured", "--users", "zh-03", "--database-url", database_url,
                                          "--out", str(tmp_path / "configured.md")])
    finally:
        server.close()
    after, before = figures["arms"]["after"], figures["arms"]["before"]
    assert len(asked) == 2 * len(user["sessions"]) == server.calls  # one extraction call per session and arm
    assert after["current_above_superseded"] == 1.0 and after["stale_active_rows"] == 0
    assert after["superseded_rows"] > 0 and after["calls_met"]
    assert before["superseded_rows"] == 0 and before["stale_active_rows"] > 0 and before["calls_met"]
