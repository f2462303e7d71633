"""Recall's lexical part (issue 14): the lexemes every memory gets (migration 0012), BM25 over the user's own
rows against a computation by hand, ties broken by a shared name, meaning not overridden, Chinese, and the
messages a careless or hostile client sends."""

from __future__ import annotations

import math
import random
import re
import uuid

import pytest
from apiclient import Api
from test_recall import NOW, insert, instance_for, near, random_vector, replace

from eros.config import RecallKnobs
from eros.memory import MemoryLayer
from eros.store import recall as recall_store

CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def lexemes(db, text: str) -> set[str]:
    return set(db.execute("SELECT tsvector_to_array(engine.lexemes(%s)) AS l", (text,)).fetchone()["l"] or [])


def pairs(text: str) -> set[str]:
    """Overlapping pairs of Han/kana characters, written independently of the SQL."""
    return {text[i:i + 2] for i in range(len(text) - 1) if CJK.match(text[i]) and CJK.match(text[i + 1])}


def test_lexemes_of_english_chinese_japanese_and_mixed_text(db):
    assert lexemes(db, "Lunch with Mehmet at Café Zürich, 2019!") == {
        "lunch", "with", "mehmet", "at", "café", "zürich", "2019"}
    chinese = "养了一只猫，叫年糕"
    assert lexemes(db, chinese) == pairs(chinese) == {"养了", "了一", "一只", "只猫", "叫年", "年糕"}  # not across "，"
    japanese = "カタカナの猫"
    assert lexemes(db, japanese) == pairs(japanese)
    assert lexemes(db, "和 Oksana 在 Wien 喝咖啡") == {"oksana", "wien", "喝咖", "咖啡"}  # single characters: no pair
    assert lexemes(db, "안녕하세요 친구") == {"안녕하세요", "친구"}  # Korean has spaces: words, as parsed
    assert lexemes(db, "") == set() and lexemes(db, "  ,.!? ") == set()


def test_the_linear_lexemes_equal_0012s_so_stored_columns_stay_valid(db):
    """Migration 0014 replaced engine.lexemes()'s body without rewriting the stored column: sound only if every
    text gets the same tsvector (lexemes and positions) as under 0012's definition, run here beside it."""
    from eros.migrate import migration_files

    original = dict(migration_files())["0012_lexical_recall"]
    definition = re.search(r"CREATE FUNCTION engine\.lexemes\(body text\).*?;\n", original, re.S)
    assert definition, "0012 defines engine.lexemes"
    db.execute(definition.group(0).replace("engine.lexemes", "pg_temp.lexemes_0012"))
    rng = random.Random(14)
    alphabet = "猫狗我今天工作到十点のカタカナひらがな한국어 abcXYZ123,.!?'\"\\-_:*&|()<>年月日\t\n🙂𠀀ＭｅÉ"
    texts = ["", " ", "猫", "猫狗", "a猫", "猫a狗", "猫" * 300, "养了一只猫，叫年糕", "カタカナの猫",
             "和 Oksana 在 Wien 喝咖啡", "Lunch with Mehmet at Café Zürich, 2019!", "mehmet " * 50,
             "a & b | !c:* <-> (d) 'e'"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(500)]
    rows = db.execute("SELECT t, pg_temp.lexemes_0012(t)::text AS before, engine.lexemes(t)::text AS now"
                      " FROM unnest(%s::text[]) AS t", (texts,)).fetchall()
    assert [r["now"] for r in rows] == [r["before"] for r in rows]
    assert sum(1 for r in rows if r["now"]) > 450  # most of them have lexemes: the comparison is not of empties


def test_every_writer_gets_the_lexemes_and_an_edit_recomputes_them(db, providers):
    api = Api()
    raw = insert(db, "alice", "Plays bouldering with Thabo", random_vector(random.Random(1)))
    status, stated = api.call("POST", "/v1/memories", {"content": "Flat number 47 on Rua Augusta", "category": "fact"})
    assert status == 201
    status, edited = api.call("PATCH", f"/v1/memories/{stated['id']}", {"content": "Flat number 52 on Rua Augusta"})
    assert status == 200

    def of(memory_id):
        return set(db.execute("SELECT tsvector_to_array(lexemes) AS l FROM engine.companion_memories WHERE id = %s",
                              (memory_id,)).fetchone()["l"])

    assert of(raw["id"]) == {"plays", "bouldering", "with", "thabo"}
    assert of(stated["id"]) == {"flat", "number", "47", "on", "rua", "augusta"}  # the old version keeps its own
    assert "52" in of(edited["id"]) and "47" not in of(edited["id"])
    # The event's year is one of the memory's words.
    db.execute("UPDATE engine.companion_memories SET occurred_at = '2019-01-01', occurred_precision = 'year'"
               " WHERE id = %s", (raw["id"],))
    assert "2019" in of(raw["id"])


# --- BM25 by hand ----------------------------------------------------------------------------------

WORDS = ["lunch", "with", "mehmet", "oksana", "thabo", "the", "bakery", "bus", "47", "kintsugi", "cello", "my",
         "sister", "doctor", "on", "friday", "aspirin", "shoe", "size", "42"]


def bm25_by_hand(rows: dict[uuid.UUID, set[str]], terms: set[str]) -> dict[uuid.UUID, float]:
    """BM25 with term frequency 1 and no length normalisation over ``rows``, divided by the best row's: the
    rule the comment of eros.store.recall._LEXICAL states."""
    n = len(rows)
    df = {t: sum(t in words for words in rows.values()) for t in terms}
    raw = {i: sum(math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms & words)
           for i, words in rows.items() if terms & words}
    best = max(raw.values(), default=0.0)
    return {i: value / best for i, value in raw.items()}


@pytest.fixture
def wordy(db):
    """Alice: 60 profile rows and 20 relationship rows of random words and random vectors near the query;
    Bob: rows full of the same words (his rows must not change Alice's document frequencies)."""
    rng = random.Random(20261202)
    query = random_vector(rng)
    instance = instance_for(db, "alice")
    rows: dict[str, list[dict]] = {"profile": [], "relationship": []}
    for i in range(80):
        content = " ".join(rng.sample(WORDS, rng.randint(1, 8)))
        layer = "relationship" if i >= 60 else "profile"
        rows[layer].append(insert(db, "alice", content, near(query, rng, rng.uniform(0.8, 3.0)),
                                  category=None if layer == "relationship" else ("fact", "event")[i % 2],
                                  instance=instance if layer == "relationship" else None,
                                  age_days=rng.uniform(0, 500), importance=round(rng.random(), 2)))
    for _ in range(30):
        insert(db, "bob", "mehmet mehmet bakery 47", near(query, rng, 0.5))
    return {"query": query, "instance": instance, "rows": rows}


@pytest.mark.parametrize("strategy", ["grouped", "recency", "composite"])
@pytest.mark.parametrize("layer", ["profile", "relationship"])
def test_the_lexical_part_is_bm25_over_the_users_rows(db, wordy, strategy, layer):
    message = "Did Mehmet like the bakery on bus 47? Nobody else knows"
    params = RecallKnobs(strategy=strategy, lexical_weight=0.2)
    got = recall_store.ranked(MemoryLayer(layer), params, "alice", wordy["query"], k=100, cap=None, message=message,
                              instance_id=wordy["instance"], now=NOW)
    assert len(got) == len(wordy["rows"][layer])
    words = {r["id"]: lexemes(db, r["content"]) for r in wordy["rows"][layer]}
    want = bm25_by_hand(words, lexemes(db, message))
    assert want and max(want.values()) == 1.0 and len(want) < len(words)  # some rows match, not all
    for r in got:
        assert r["lexical_term"] == pytest.approx(0.2 * want.get(r["id"], 0.0), abs=1e-9)
        assert r["score"] == pytest.approx(r["similarity"] + r["recency_term"] + r["importance_term"]
                                           + r["lexical_term"] - r["demotion"], abs=1e-9)
    assert [r["score"] for r in got] == sorted((r["score"] for r in got), reverse=True)
    # Off: no lexical part at all, and the ranking of the similarity alone.
    off = recall_store.ranked(MemoryLayer(layer), replace(params, lexical_weight=0.0), "alice", wordy["query"],
                              k=100, cap=None, message=message, instance_id=wordy["instance"], now=NOW)
    assert {r["lexical_term"] for r in off} == {0.0}
    on = {r["id"]: r for r in got}
    for r in off:  # each row keeps the rest of its score
        assert r["score"] == pytest.approx(on[r["id"]]["score"] - on[r["id"]]["lexical_term"], abs=1e-12)


def two_colleagues(db, first: str, second: str, query: list[float]) -> tuple[dict, dict]:
    """Two memories with the same embedding: similarity cannot tell them apart."""
    return insert(db, "alice", first, query), insert(db, "alice", second, query)


def top(db, query, text, params=None) -> list[str]:
    rows = recall_store.ranked(MemoryLayer.PROFILE, params or RecallKnobs(), "alice", query, k=5, cap=None,
                               message=text, now=NOW)
    return [r["content"] for r in rows]


def test_a_shared_name_breaks_the_tie_in_english_and_chinese(db):
    query = random_vector(random.Random(7))
    insert(db, "alice", "Her colleague Oksana runs the Tuesday meeting", query, memory_id=uuid.UUID(int=1))
    insert(db, "alice", "Her colleague Mehmet runs the Tuesday meeting", query, memory_id=uuid.UUID(int=2))
    assert top(db, query, "how did the meeting with Mehmet go?")[0] == "Her colleague Mehmet runs the Tuesday meeting"
    # Without the lexical part the tie falls back to the id: Oksana's row, whatever the message says.
    off = RecallKnobs(lexical_weight=0.0)
    assert top(db, query, "how did the meeting with Mehmet go?", off)[0] == (
        "Her colleague Oksana runs the Tuesday meeting")

    chinese = random_vector(random.Random(8))
    insert(db, "alice", "同事阿强每周二主持例会", chinese, memory_id=uuid.UUID(int=3))
    insert(db, "alice", "同事小林每周二主持例会", chinese, memory_id=uuid.UUID(int=4))
    assert top(db, chinese, "小林最近怎么样？")[0] == "同事小林每周二主持例会"


def test_a_shared_word_does_not_override_meaning(db):
    rng = random.Random(9)
    query = random_vector(rng)
    meant = insert(db, "alice", "Keeps her savings in a current account", near(query, rng, 0.3))
    trap = insert(db, "alice", "Likes picnics on the river bank", near(query, rng, 2.5))
    rows = recall_store.ranked(MemoryLayer.PROFILE, RecallKnobs(), "alice", query, k=2, cap=None,
                               message="should I move money to another bank?", now=NOW)
    assert [r["id"] for r in rows] == [meant["id"], trap["id"]]
    assert rows[1]["lexical_term"] == RecallKnobs().lexical_weight and rows[0]["lexical_term"] == 0


HOSTILE = ["", "   ", "'; DROP TABLE engine.companion_memories; --", "a & b | !c:* <-> (d) 'e'", "\\", "\\\\'",
           "Ｍｅｈｍｅｔ", "🙂🙂 mehmet 🙂", "mehmet " * 2000, "猫" * 10_000, "\t\n\r", "%(user)s %s {layer}"]


@pytest.mark.parametrize("message", HOSTILE, ids=range(len(HOSTILE)))
def test_any_message_ranks_without_an_error(db, message):
    query = random_vector(random.Random(10))
    insert(db, "alice", "Lunch with Mehmet", query)
    insert(db, "alice", "养了一只猫", query)
    rows = recall_store.ranked(MemoryLayer.PROFILE, RecallKnobs(), "alice", query, k=5, cap=None, message=message,
                               now=NOW)
    assert len(rows) == 2 and all(0 <= r["lexical_term"] <= RecallKnobs().lexical_weight for r in rows)
    assert db.execute("SELECT count(*) AS n FROM engine.companion_memories").fetchone()["n"] == 2


def test_a_year_the_message_names_lifts_the_memory_of_that_year(db):
    query = random_vector(random.Random(11))
    wrist = insert(db, "alice", "Broke her wrist snowboarding", query, memory_id=uuid.UUID(int=6))
    ankle = insert(db, "alice", "Sprained her ankle at football", query, memory_id=uuid.UUID(int=5))
    insert(db, "alice", "Has a cat called Miso", query, memory_id=uuid.UUID(int=7))  # no event time
    for row, year in ((wrist, 2008), (ankle, 2015)):
        db.execute("UPDATE engine.companion_memories SET occurred_at = make_date(%s, 1, 1), occurred_precision = 'year'"
                   " WHERE id = %s", (year, row["id"]))
    params = RecallKnobs(lexical_weight=0.0, lexical_year_weight=0.05)
    for message in ("What happened in 2008?", "2008年发生了什么？"):
        rows = recall_store.ranked(MemoryLayer.PROFILE, params, "alice", query, k=3, cap=None, message=message, now=NOW)
        assert rows[0]["id"] == wrist["id"] and rows[0]["lexical_term"] == 0.05
        assert [r["lexical_term"] for r in rows[1:]] == [0.0, 0.0]
    # A year no memory is about, and no year at all: nothing moves (the order is the one without the term:
    # the newest event first, since recency runs from the event time).
    for message in ("What happened in 1999?", "what happened to my wrist?"):
        rows = recall_store.ranked(MemoryLayer.PROFILE, params, "alice", query, k=3, cap=None, message=message, now=NOW)
        plain = recall_store.ranked(MemoryLayer.PROFILE, RecallKnobs(lexical_weight=0.0), "alice", query, k=3,
                                    cap=None, message=message, now=NOW)
        assert [r["id"] for r in rows] == [r["id"] for r in plain] and {r["lexical_term"] for r in rows} == {0.0}
        assert rows[-1]["id"] == wrist["id"]
