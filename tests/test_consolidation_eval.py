"""The consolidation evaluation (bench/consolidation_eval.py) runs and its figures hold: the scripted
model on a few users, both arms, through the real chat handler, claim, extract handler and recall."""

from __future__ import annotations

import json
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
    assert groups["repeat-only"]["sessions"] >= 2 and groups["repeat-only"]["calls"] == {1: groups["repeat-only"]["sessions"]}
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
