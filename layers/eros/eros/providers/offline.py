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
import time
from collections.abc import Callable, Iterator
from datetime import date, timedelta

from ..config import EMBED_DIM
from ..memory import EventTime, InvalidEventTime, covering, parse_event_time, statement_key
from .base import tokens
from .embed import Embeddings, InputType
from .llm import Completion, CompletionStream

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
                          usage={"total_tokens": sum(map(tokens, texts))}, offline=True)


class OfflineChat:
    model = "offline/echo"
    offline = True  # providers.running_offline() names it
    # A streamed answer comes a word at a time, this many seconds apart, so that the local stack shows words
    # arriving with no keys (a real model's pace is ~20-80 ms a token).
    stream_interval = 0.03

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
        prompt, completion = sum(tokens(m["content"]) for m in messages), tokens(text)
        return Completion(text=text, model=self.model, offline=True,
                          usage={"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion})

    def stream(self, model: str, messages: list[dict], *, max_tokens: int = 600, temperature: float = 0.7,
               deadline=None) -> CompletionStream:
        """``complete``'s answer, a word at a time (``stream_interval`` apart), as a streaming server sends it:
        the same chunks, the usage in the last."""
        answer = self.complete(model, messages, max_tokens=max_tokens, temperature=temperature)

        def chunks():
            for n, piece in enumerate(re.findall(r"\s*\S+\s*|\s+", answer.text)):
                if n:
                    time.sleep(self.stream_interval)
                yield {"model": self.model, "choices": [{"index": 0, "delta": {"content": piece}}]}
            yield {"model": self.model, "choices": [], "usage": answer.usage}

        return CompletionStream(chunks(), self.model, messages, offline=True)


# --- what the offline stand-ins know about consolidation -------------------------------------------
# A few "slots" hold one current value each: a person lives in one city and has one job at a time.
# Two statements about the same slot that say different things are an update (the newer wins);
# everything else ("has a daughter, Mia" and "Mia started school") is left alone. Crude and
# English/Chinese only, but deterministic, and it lets the local stack show consolidation with no keys.
_SLOTS = [
    ("home", re.compile(r"\b(live|lives|living|lived|moved|moving|relocated|relocating)\b.*\b(in|to)\b"
                        r"|住在|搬到|搬去|住", re.I)),
    ("job", re.compile(r"\b(work|works|working) (as|at|for|in)\b|\b(my|their) (new )?job\b|\bjob (as|at)\b"
                       r"|在.{1,12}(工作|上班)|换了工作|当|是.{0,6}(护士|老师|医生|工程师|程序员|设计师|会计|律师|厨师)",
                       re.I)),
    ("partner", re.compile(r"\b(boyfriend|girlfriend|fianc[ée]e?|husband|wife|dating)\b|男朋友|女朋友|老公|老婆",
                           re.I)),
    ("diet", re.compile(r"\b(vegetarian|vegan|pescatarian|keto|eat(ing)? meat)\b|吃素", re.I)),
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

# A compound statement is one memory per clause that has its own first-person subject: "I live in Shanghai
# and I'm a nurse" is two facts, and a move to Tokyo changes only the first. "I like tea and coffee" stays whole.
_SUBJECT = r"(?=(?:i|i'm|im|i've|i'll|i'd|my)\b)"
_CLAUSE = re.compile(rf"\s*(?:[,;]\s*(?:and|but)?|\s(?:and|but))\s+{_SUBJECT}|\s*[，；]\s*(?:而且|但是|但)?(?=我)",
                     re.I)
# What a model would not keep: a question is not a fact about the person, small talk is not about anything.
_QUESTION = re.compile(r"[?？]\s*$|[吗呢]\s*[。！]?\s*$|^(what|where|when|who|whom|whose|why|how|which|do|does|did|can|"
                       r"could|would|should|is|are|am|was|were|have|has|shall|may)\b", re.I)
_SMALL_TALK = re.compile(r"^(?:(?:hi|hey|hello|ok|okay|well|oh|so|yes|yeah|no|lol|haha),?\s*)*"
                         r"(?:i'?m (?:fine|good|great|ok|okay|alright|well|here|back|not sure)"
                         r"|i (?:see|know|guess|agree|mean|think so|understand|don't know|suppose|believe)"
                         r"|i (?:love|miss) you|i (?:like to|would|'d|must|have to) say"
                         r"|thank you|thanks)"
                         r"(?:,?\s*(?:thanks|thank you|too|a lot|so much|again|now|then))*[\s.!。！~]*$"
                         r"|^我(?:很好|还好|知道了|明白了|爱你|想你)[。！]?$", re.I)
_CHATTER = frozenset([
    "hi", "hey", "hello", "yo", "thanks", "thank", "you", "ok", "okay", "lol", "haha", "bye", "good", "morning",
    "night", "evening", "yes", "no", "yeah", "nope", "sure", "cool", "nice", "great", "wow", "oh", "hmm", "see",
    "later", "too", "again", "so", "much", "a", "lot", "there", "how", "are", "doing", "what's", "up", "how's", "it",
    "going", "sup", "all", "right", "你好", "谢谢", "好的", "嗯", "哈哈", "晚安", "早上好", "再见"])


def chatter(text: str) -> bool:
    """Small talk: a greeting, thanks, "I'm fine" -- nothing about the person to remember."""
    words = _WORD.findall(text.lower())
    return not words or all(w in _CHATTER for w in words) or bool(_SMALL_TALK.match(text.strip()))


# Words a sentence may open with that are not part of the statement ("So, I moved to Tokyo" -> the move).
_OPENER = re.compile(r"^(?:(?:so|well|now|actually|anyway|also|and|but|oh|btw|by the way|guess what|honestly|"
                     r"update|news)\b[,:!]?\s*)+", re.I)
_TIME_OPENER = re.compile(r"^((?:yesterday|today|tonight|tomorrow|this (?:morning|week|month|year)|last (?:night|week|"
                          r"month|year)|next (?:week|month|year)|recently|lately)),?\s+(?=(?:i|i'm|i've|my)\b)", re.I)


def _clauses(sentence: str) -> list[str]:
    return [c.strip(" ,;，；") for c in _CLAUSE.split(sentence) if c.strip(" ,;，；")]


# --- ... told in the third person, as a memory about the user reads ("Lives in Shanghai") --------------
_OCCUPATION = re.compile(r"^(?:i'm|im|i am) (an?) ((?:[\w-]+ ){0,2}?(?:nurse|teacher|doctor|engineer|developer|"
                         r"programmer|designer|accountant|lawyer|chef|cook|waiter|waitress|barista|writer|artist|musician|"
                         r"photographer|pharmacist|dentist|architect|scientist|researcher|manager|consultant|cashier|"
                         r"driver|pilot|firefighter|officer|electrician|plumber|carpenter|mechanic|farmer|journalist|"
                         r"editor|translator|therapist|psychologist|vet|veterinarian|librarian|professor|tutor|analyst|"
                         r"marketer|paramedic|surgeon|baker|hairdresser|cleaner|clerk|receptionist|secretary))\b",
                         re.I)
# The subject and the verb form after it; a verb that follows "I" directly is conjugated (_conjugate).
_AUXILIARY = [(re.compile(p, re.I), third) for p, third in [
    (r"^(?:i'm|im|i am)\b", "is"), (r"^i was\b", "was"), (r"^(?:i've|i have)\b", "has"),
    (r"^(?:i'll|i will)\b", "will"),
    (r"^(?:i'd|i would)\b", "would"), (r"^i (?:don't|do not)\b", "doesn't"), (r"^i (?:didn't|did not)\b", "didn't"),
    (r"^i (?:can't|cannot|can not)\b", "can't"), (r"^i (can|could|should|might|must|had|won't|wouldn't)\b", r"\1")]]
_ADVERBS = frozenset([
    "just", "really", "also", "still", "usually", "always", "never", "often", "sometimes", "finally",
    "recently", "actually", "totally", "absolutely", "only", "even", "already", "mostly", "rarely",
    "seriously", "definitely", "truly", "basically", "kinda", "probably", "mainly"])
_PAST = frozenset([
    "went", "met", "got", "saw", "quit", "left", "began", "bought", "had", "made", "took", "felt", "found",
    "lost", "told", "said", "came", "ran", "became", "broke", "fell", "gave", "knew", "thought", "wrote",
    "won", "spent", "sold", "sent", "built", "paid", "put", "set", "read", "heard", "kept", "slept", "taught",
    "caught", "brought", "fought", "held", "stood", "understood", "swam", "drove", "rode", "ate", "drank",
    "sang"])
_HAS = {"have": "has", "do": "does", "go": "goes", "be": "is"}
_INSIDE = [(re.compile(p, re.I), them) for p, them in [
    (r"\bi'm\b|\bi am\b", "they're"), (r"\bi was\b", "they were"), (r"\bi've\b", "they've"), (r"\bi'll\b", "they'll"),
    (r"\bi'd\b", "they'd"), (r"\bmyself\b", "themselves"), (r"\bmine\b", "theirs"), (r"\bmy\b", "their"),
    (r"\bme\b", "them"), (r"\bi\b", "they"), (r"我的", "TA的"), (r"我", "TA")]]


def _conjugate(verb: str) -> str:
    """The third person singular of a verb said after "I": "live" -> "lives", "study" -> "studies"; a past form
    stays as it is ("moved", "went")."""
    word = verb.lower()
    if word in _HAS:
        return _HAS[word]
    if word.endswith("ed") or word in _PAST or not word.isalpha():
        return verb
    if word.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _rest(text: str) -> str:
    for rule, them in _INSIDE:
        text = rule.sub(them, text)
    return text


def third_person(clause: str) -> str:
    """A first-person clause told as a memory about the user: "I live in Shanghai" -> "Lives in Shanghai", "I'm a
    nurse" -> "Works as a nurse", "My sister is called Mia" -> "Their sister is called Mia", "我住在上海" -> "住在上海".
    Crude English and Chinese rules, deterministic; what they cannot place is kept with I/my turned into they/their."""
    clause = _OPENER.sub("", clause.strip()).strip()
    when = ""
    if opened := _TIME_OPENER.match(clause):
        when, clause = f" {opened[1].lower()}", clause[opened.end():]
    clause = clause.rstrip(" .!。！")
    if clause.startswith("我") and not clause.startswith("我的"):
        return _rest(clause[1:]) + when
    if job := _OCCUPATION.match(clause):
        return f"Works as {job[1].lower()} {job[2]}{_rest(clause[job.end():])}{when}"
    for rule, third in _AUXILIARY:
        if said := rule.match(clause):
            return _capital(said.expand(third) + _rest(clause[said.end():])) + when
    words = clause.split(" ")
    if len(words) > 1 and words[0].lower() == "i":
        at = 2 if words[1].lower() in _ADVERBS and len(words) > 2 else 1
        words[at] = _conjugate(words[at])
        return _capital(" ".join(words[1:at]) + (" " if at > 1 else "") + words[at] + _rest(
            " " + " ".join(words[at + 1:]) if len(words) > at + 1 else "")) + when
    return _capital(_rest(clause)) + when


_QUOTED = re.compile(r"^the user said:\s*", re.I)  # how this stand-in wrote memories before it told them


def _as_told(text: str) -> str:
    """A known memory as this stand-in tells one now: an earlier quote ("The user said: I like tea") in the third
    person, so that saying it again is the same statement, and a new home supersedes an old quoted one."""
    quoted = _QUOTED.match(text)
    return third_person(text[quoted.end():]) if quoted else text


def _user_statements(session: str) -> Iterator[tuple[date | None, str]]:
    """The first-person statements of the user's turns, one a clause, with the day its message was sent; questions and
    small talk left out."""
    day = None
    for line in session.splitlines():
        if opened := _DAY_LINE.match(line):
            day = date.fromisoformat(opened[1])
        if not line.startswith("user: "):
            continue
        for sentence in _SENTENCE.split(line[6:]):
            sentence = sentence.strip()
            if _QUESTION.search(sentence) or chatter(sentence):
                continue
            for clause in _clauses(sentence):
                if len(clause) >= (3 if clause[0] >= "\u3400" else 6) and _FIRST_PERSON.search(clause) \
                        and not chatter(clause):
                    yield day, clause


def offline_candidates(transcript: str) -> list[dict]:
    """A deterministic stand-in for the extraction model: each first-person statement of the user's new turns (a
    compound sentence split into its clauses; questions and small talk skipped), told in the third person ("Lives in
    Shanghai"), put in a category by keyword, with the event time of a few common time words, and consolidated
    against the known memories shown: the same statement is ``same_as``; a different statement about a one-value
    slot such as home or job ``supersedes`` what was known about that slot, and only that slot. Within the answer a
    later statement about a slot replaces an earlier one, and a repeated statement is given once. Rough, but it
    lets the whole pipeline run with no keys."""
    known = [(m[1], m[2], _as_told(m[3])) for line in transcript.split("</known_memories>", 1)[0].splitlines()
             if (m := _KNOWN_LINE.match(line))] if "<known_memories>" in transcript else []
    found: dict[str, dict] = {}  # by statement key, in the order said
    by_slot: dict[str, str] = {}  # slot -> key of the latest statement about it
    for day, clause in _user_statements(transcript.split("<session>", 1)[-1]):
        content = third_person(clause)
        key, slot = statement_key(content), topic_slot(content)
        if not key or key in found:
            continue
        category = next((c for c, rule in _RULES if re.search(rule, clause, re.I)), "fact")
        memory = {"content": content, "category": category,
                  "importance": 0.8 if category in ("relation", "emotion") else 0.5}
        when = resolve_when(clause, day) if day else None
        if when:
            memory["occurred_at"] = when.text()
        same = next((h for h, _, text in known if statement_key(text) == key), None)
        if same:
            memory["same_as"] = same
        elif slot:
            memory["supersedes"] = [h for h, _, text in known if topic_slot(text) == slot]
            found.pop(by_slot.get(slot, ""), None)
            by_slot[slot] = key
        found[key] = memory
    return list(found.values())[:_MOST]


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
    server (``eros.extraction.Episode.event_time``) for a rewritten one. None: the user said nothing but small talk."""
    persona = found[1] if (found := _PERSONA.search(transcript)) else "the persona"
    so_far = found[1] if (found := _SO_FAR.search(transcript)) else None
    session = transcript.split("<session>", 1)[-1]
    said = [line[6:] for line in session.splitlines() if line.startswith("user: ") and not chatter(line[6:])]
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
