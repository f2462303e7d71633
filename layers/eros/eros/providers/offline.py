"""Offline providers: deterministic, no network, for running the whole system with no keys.

Used only when no key or base URL is configured (see ``eros.providers``), announced at start-up,
and marked in what they produce (``offline=True``, model names starting with ``offline/``).
The hashing embedder keeps recall meaningful by word overlap: texts that share words (or, for
Chinese, character pairs) get a positive cosine similarity.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterator
from datetime import date, timedelta

from ..config import EMBED_DIM
from ..memory import EventTime, InvalidEventTime, covering, parse_event_time, statement_key
from .embed import Embeddings, InputType
from .llm import Completion

_WORD = re.compile(r"[a-z0-9']+|[\u3400-\u9fff]+")
_STOP = frozenset(["a", "an", "the", "and", "or", "but", "i", "im", "i'm", "me", "my", "you", "your", "to", "of",
                   "in", "on", "at", "is", "am", "are", "was", "were", "be", "it", "this", "that", "with", "for",
                   "so", "just", "do", "did", "have", "has", "had", "not", "no"])


def _features(text: str) -> list[str]:
    features: list[str] = []
    for token in _WORD.findall(text.lower()):
        if token[0] >= "\u3400":  # CJK run: characters and character bigrams
            features.extend(token)
            features.extend(token[i:i + 2] for i in range(len(token) - 1))
        elif token not in _STOP:
            features.append(token[:-1] if len(token) > 4 and token.endswith("s") else token)  # crude plural fold
    return features


def hash_embed(text: str) -> list[float]:
    vector = [0.0] * EMBED_DIM
    for feature in _features(text):
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % EMBED_DIM
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0:  # no features at all: a fixed unit vector, so cosine stays defined
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


class HashingEmbedder:
    model = "offline/lexical-hash-512"
    offline = True  # providers.running_offline() names it

    def describe(self) -> str:
        return f"OFFLINE lexical hashing embedder ({EMBED_DIM}-d, word overlap only)"

    def embed(self, texts: list[str], input_type: InputType, *, deadline=None) -> Embeddings:
        return Embeddings(vectors=[hash_embed(t) for t in texts], model=self.model,
                          usage={"total_tokens": 0}, offline=True)


class OfflineChat:
    model = "offline/echo"
    offline = True  # providers.running_offline() names it

    def describe(self) -> str:
        return "OFFLINE deterministic chat model (echoes, no network)"

    def complete(self, model: str, messages: list[dict], *, max_tokens: int = 600, temperature: float = 0.7,
                 deadline=None, json_mode: bool = False) -> Completion:
        last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        # Like a model, it answers what the prompt asks for: the deep pass shows groups of memories,
        # extraction a session transcript.
        if json_mode and "<group g" in last_user:
            text = json.dumps({"actions": offline_actions(last_user)}, ensure_ascii=False)
        elif json_mode:
            text = json.dumps({"memories": offline_candidates(last_user), "episode": offline_episode(last_user)},
                              ensure_ascii=False)
        else:
            system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
            known = system.count("\n- ")
            text = (f"(offline model) You said: \u201c{last_user[:200]}\u201d. "
                    f"I have {known} memory line(s) about you in front of me.")
        return Completion(text=text, model=self.model, usage={"prompt_tokens": 0, "completion_tokens": 0},
                          offline=True)


# --- what the offline stand-ins know about consolidation -------------------------------------------
# A few "slots" hold one current value each: a person lives in one city and has one job at a time.
# Two statements about the same slot that say different things are an update (the newer wins);
# everything else ("has a daughter, Mia" and "Mia started school") is left alone. Crude and
# English/Chinese only, but deterministic, and it lets the local stack show consolidation with no keys.
_SLOTS = [
    ("home", re.compile(r"\b(live|lives|living|lived|moved|moving|relocated|relocating)\b.*\b(in|to)\b"
                        r"|住在|搬到|搬去|住", re.I)),
    ("job", re.compile(r"\b(work|works|working) (as|at|for|in)\b|\bmy (new )?job\b|\bjob (as|at)\b"
                       r"|在.{1,12}(工作|上班)|换了工作|当", re.I)),
    ("partner", re.compile(r"\b(boyfriend|girlfriend|fianc[ée]e?|husband|wife)\b|男朋友|女朋友|老公|老婆", re.I)),
    ("diet", re.compile(r"\b(vegetarian|vegan|eat(ing)? meat)\b|吃素", re.I)),
]


def topic_slot(text: str) -> str | None:
    """The one-value slot a statement is about (home, job, partner, diet), or None."""
    return next((name for name, rule in _SLOTS if rule.search(text)), None)


# --- the offline extractor: answers the extraction prompt (eros.extraction) -------------------------
_RULES = [
    ("relation", r"\b(mother|mom|mum|father|dad|sister|brother|wife|husband|girlfriend|boyfriend|partner|friend|"
                 r"boss|daughter|son|family)\b|妈妈|母亲|爸爸|父亲|男朋友|女朋友|老板|朋友|女儿|儿子"),
    ("emotion", r"\b(feel|feeling|felt|sad|happy|angry|anxious|stressed|lonely|tired|excited|worried|scared)\b|"
                r"难过|开心|焦虑|压力|孤独|累"),
    ("preference", r"\b(like|love|hate|prefer|favou?rite|enjoy|can't stand)\b|喜欢|讨厌|爱吃"),
    ("event", r"\b(yesterday|today|tomorrow|last|next|tonight|went|going to|will|moved|started|quit|met)\b|"
              r"昨天|今天|明天|下周|搬"),
]
_FIRST_PERSON = re.compile(r"\b(i|i'm|im|my|me|i've|i'll|mine)\b|我", re.I)
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s*")
_MOST = 10  # memories per answer, as the extraction prompt asks
_KNOWN_LINE = re.compile(r"^- (m\d+) \((\w+), noted [0-9-]+(?:; when: [^)]*)?\): (.*)$")
_DAY_LINE = re.compile(r"^\[\w+ ([0-9]{4}-[0-9]{2}-[0-9]{2})\]$")  # eros.extraction.day_line


def _user_sentences(session: str) -> Iterator[tuple[date | None, str]]:
    """The first-person sentences of the user's turns, each with the day its message was sent."""
    day = None
    for line in session.splitlines():
        if opened := _DAY_LINE.match(line):
            day = date.fromisoformat(opened[1])
        if not line.startswith("user: "):
            continue
        for sentence in _SENTENCE.split(line[6:]):
            sentence = sentence.strip()
            if len(sentence) >= 8 and _FIRST_PERSON.search(sentence):
                yield day, sentence


def offline_candidates(transcript: str) -> list[dict]:
    """A deterministic stand-in for the extraction model: first-person sentences of the user's new
    turns, put in a category by keyword, with the event time of a few common time words, and consolidated
    against the known memories shown (the same statement is ``same_as``; a different statement about a
    one-value slot such as home or job ``supersedes``). Rough, but it lets the whole pipeline run with no
    keys. The text stays the user's own words (a quote, "The user said: ..."), time words included: the
    event time shown next to it says which week "last week" was."""
    known = [m.groups() for line in transcript.split("</known_memories>", 1)[0].splitlines()
             if (m := _KNOWN_LINE.match(line))] if "<known_memories>" in transcript else []
    found: list[dict] = []
    for day, sentence in _user_sentences(transcript.split("<session>", 1)[-1]):
        category = next((c for c, rule in _RULES if re.search(rule, sentence, re.I)), "fact")
        importance = 0.8 if category in ("relation", "emotion") else 0.5
        memory = {"content": f"The user said: {sentence}", "category": category, "importance": importance}
        when = resolve_when(sentence, day) if day else None
        if when:
            memory["occurred_at"] = when.text()
        key, slot = statement_key(sentence), topic_slot(sentence)
        same = next((h for h, _, text in known if statement_key(text) == key), None)
        if same:
            memory["same_as"] = same
        elif slot:
            memory["supersedes"] = [h for h, _, text in known if topic_slot(text) == slot]
        found.append(memory)
    return found[:_MOST]


_PERSONA = re.compile(r"^<persona>(.*)</persona>$", re.M)
_SO_FAR = re.compile(r"<episode_so_far>\n(.*)\n</episode_so_far>")
_EPISODE_CHARS = 480  # under eros.extraction.MAX_EPISODE_CHARS, which refuses a longer one
_QUOTE_CHARS = 140


def _clip(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def offline_episode(transcript: str) -> dict | None:
    """A deterministic stand-in for the extraction model's episode: the persona (``<persona>``) and what the user
    first said in the new part of the session, quoted, appended to the episode so far (``<episode_so_far>``) of a
    resumed session; its event time is the days of the new part's messages for a first episode, and left to the
    server (``eros.extraction.Episode.event_time``) for a rewritten one. None: the user said nothing."""
    persona = found[1] if (found := _PERSONA.search(transcript)) else "the persona"
    so_far = found[1] if (found := _SO_FAR.search(transcript)) else None
    session = transcript.split("<session>", 1)[-1]
    said = [line[6:] for line in session.splitlines() if line.startswith("user: ")]
    days = [date.fromisoformat(m[1]) for line in session.splitlines() if (m := _DAY_LINE.match(line))]
    if not said:
        return None
    told = f"the user told {persona}: \u201c{_clip(said[0], _QUOTE_CHARS)}\u201d."
    if so_far is None:
        return {"content": told[0].upper() + told[1:],
                "occurred_at": covering(days[0], days[-1]).text() if days else None}
    later = f" Later, {told}"
    return {"content": _clip(so_far, _EPISODE_CHARS - len(later)) + later, "occurred_at": None}


# --- the offline extractor's calendar: a few time words, resolved against the day they were said ----------
def _monday(day: date) -> date:
    return day - timedelta(days=day.weekday())


def _month_before(day: date) -> date:
    return date(day.year - 1, 12, 1) if day.month == 1 else date(day.year, day.month - 1, 1)


_WHEN: list[tuple[re.Pattern[str], Callable[[date], EventTime]]] = [
    (re.compile(r"\byesterday\b|昨天", re.I), lambda d: EventTime(d - timedelta(days=1), "day")),
    (re.compile(r"\btoday\b|今天", re.I), lambda d: EventTime(d, "day")),
    (re.compile(r"\btomorrow\b|明天", re.I), lambda d: EventTime(d + timedelta(days=1), "day")),
    (re.compile(r"\blast week\b|上周|上个星期", re.I), lambda d: EventTime(_monday(d) - timedelta(days=7), "week")),
    (re.compile(r"\bnext week\b|下周|下个星期", re.I), lambda d: EventTime(_monday(d) + timedelta(days=7), "week")),
    (re.compile(r"\blast month\b|上个月", re.I), lambda d: EventTime(_month_before(d), "month")),
    (re.compile(r"\blast year\b|去年", re.I), lambda d: EventTime(date(d.year - 1, 1, 1), "year")),
]
_IN_YEAR = re.compile(r"\bin ([0-9]{4})\b|([0-9]{4}) ?年")


def resolve_when(sentence: str, said_on: date) -> EventTime | None:
    """The event time of the first time word of ``sentence`` that the offline extractor knows (yesterday,
    today, tomorrow, last/next week, last month, last year, "in 2019", and their Chinese), said on ``said_on``."""
    resolved = next((resolve(said_on) for rule, resolve in _WHEN if rule.search(sentence)), None)
    year = _IN_YEAR.search(sentence) if resolved is None else None
    if year:
        try:
            return parse_event_time(year[1] or year[2])
        except InvalidEventTime:  # "in 1066": not a time of a person's life
            return None
    return resolved


# --- the offline deep-pass planner: answers the deep-pass prompt (eros.dreaming.deep_pass) ----------
_GROUP_LINE = re.compile(r"^- (m\d+) \((\w+), noted (\S+), mentioned (\d+)x(?:; when: [^)]*)?\): (.*)$")


def offline_actions(rendered: str) -> list[dict]:
    """What OfflineChat answers to the deep-pass prompt, deterministically. Within a group: rows with
    the same statement are repeats (the most mentioned, then the oldest, is kept); statements about
    the same one-value slot (home, job, ...) that differ are a change (the newest is current)."""
    actions: list[dict] = []
    for block in re.findall(r"<group g\d+>\n(.*?)\n</group>", rendered, flags=re.S):
        rows = [m.groups() for m in map(_GROUP_LINE.match, block.splitlines()) if m]
        by_key: dict[str, list[tuple[int, str, int, str]]] = {}
        for position, (handle, _, _, mentions, content) in enumerate(rows):
            by_key.setdefault(statement_key(content), []).append((position, handle, int(mentions), content))
        kept: list[tuple[int, str, str]] = []  # (newest position of the statement, kept handle, content)
        for same in by_key.values():
            keep = min(same, key=lambda r: (-r[2], r[0]))
            if len(same) > 1:
                actions.append({"keep": keep[1], "duplicates": [r[1] for r in same if r is not keep]})
            kept.append((max(r[0] for r in same), keep[1], keep[3]))
        by_slot: dict[str, list[tuple[int, str, str]]] = {}
        for entry in kept:
            slot = topic_slot(entry[2])
            if slot:
                by_slot.setdefault(slot, []).append(entry)
        for entries in by_slot.values():
            if len(entries) > 1:
                current = max(entries)
                actions.append({"current": current[1], "supersedes": [e[1] for e in entries if e is not current]})
    return actions
