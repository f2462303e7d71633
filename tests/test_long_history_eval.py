"""The long-history evaluation (bench/long_history_eval.py) and its generator (bench/data/make_long_history.py):
the data is what its labels say, and the smallest size runs end to end (the real turn statements, claim,
extract handler with the scripted model, recall) with sane figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import long_history_eval  # noqa: E402

gen = long_history_eval.generator()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_history_is_what_its_labels_say(lang):
    history = gen.generate(lang, 500)
    again = gen.generate(lang, 500)
    assert json.dumps(history, sort_keys=True) == json.dumps(again, sort_keys=True)  # deterministic
    sessions, questions = history["sessions"], history["questions"]
    assert sum(len(s["turns"]) for s in sessions) == 500
    assert [s["at"] for s in sessions] == sorted(s["at"] for s in sessions)
    assert len(questions) == 24 and sum(q["age"] == "old" for q in questions) == 16
    assert {q["kind"] for q in questions} == {"detail", "event", "preference"}
    for q in questions:
        ev = q["evidence"]
        session = sessions[ev["session"]]
        assert session["turns"][ev["turn"]] == ev["text"] and q["key"] in ev["text"], q["id"]
        # What the scripted model writes for the evidence session names the key: the episode, and the memory.
        assert q["key"].casefold() in session["episode"].casefold(), q["id"]
        assert len(session["episode"]) <= 600
        if q["memory"]:
            assert any(m["content"] == q["memory"] and q["key"] in m["content"] for m in session["memories"])
        # The key is said nowhere else: a hit is the evidence, never filler that happens to match.
        said = [t for s in sessions for t in s["turns"] if q["key"].casefold() in t.casefold()]
        assert said == [ev["text"]], (q["id"], said)
        if q["kind"] == "preference":
            assert q["stale"] and q["stale"]["session"] < ev["session"]
        if q["age"] == "recent":
            assert ev["session"] >= len(sessions) - gen.RECENT_SESSIONS
        else:
            assert q["utterances_back"] > 100 and q["days_back"] > 14


def test_old_evidence_lies_beyond_the_window_at_5000():
    history = gen.generate("zh", 5000)
    old = [q for q in history["questions"] if q["age"] == "old"]
    assert all(q["utterances_back"] > long_history_eval.WINDOW for q in old)
    assert all(q["utterances_back"] < 200 for q in history["questions"] if q["age"] == "recent")
    assert len({t for s in history["sessions"] for t in s["turns"]}) > 2500  # varied filler, not a few lines


def test_the_scripted_answer_is_what_extraction_reads():
    from eros import extraction

    session = gen.generate("en", 500)["sessions"][3]
    answer = long_history_eval.scripted_answer(session)
    assert [c.content for c in extraction.parse_candidates(answer)] == [m["content"] for m in session["memories"]]
    assert json.loads(answer)["episode"]["content"] == session["episode"]


@pytest.mark.e2e
def test_the_smallest_history_runs_end_to_end(database_url, tmp_path):
    out = tmp_path / "report.md"
    figures = long_history_eval.run(["--quick", "--database-url", database_url, "--out", str(out)])
    rows = {(r["lang"], r["age"], r["arm"]): r for r in figures["rows"]}
    assert {(lang, age) for lang, age, _ in rows} == {(lang, age) for lang in ("en", "zh") for age in ("old", "recent")}
    for (lang, age, arm), r in rows.items():
        assert r["n"] == (16 if age == "old" else 8)
        assert 0 <= r["hit1"] <= r["hit5"] <= r["any"] <= 1, (lang, age, arm)
        # A name said once, weeks back, shares its words with the question: the exact scan finds some of them.
        assert r["hit5"] >= 0.25, (lang, age, arm, r)
        # The profile memories the scripted model wrote for the evidence are stored and recalled.
        assert r["profile"] is not None and r["profile"] >= 0.5, (lang, age, arm, r)
    report = out.read_text()
    assert "| en | 500 | old | exact scan | 16 |" in report and "--quick" in report
