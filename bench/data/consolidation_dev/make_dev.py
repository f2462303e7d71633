"""Writes users.jsonl: the scripted multi-session transcripts of bench/consolidation_eval.py.

    .venv/bin/python bench/data/consolidation_dev/make_dev.py      # deterministic (seeded)

Each line is one user: sessions (timestamps days to months apart, a few user turns each, and the
memories a careful extraction model would write for that session, each saying what it does to an
earlier fact: nothing, ``supersedes`` a version, or is ``same_as`` a version), the facts with their
versions and a regular expression that recognises each version in whatever words a model writes
it, and probe queries asked at the end. Fact kinds: ``chain`` (an update chain A -> B [-> C]: city,
job, partner, diet), ``stable`` (said once early, must stay), ``trap`` (related to a stable fact but
not contradicting it: "Mia started school" after "Has a daughter, Mia"), ``filler`` (stable
preferences that give a few "heavy" users more than the 30 known memories an extraction is shown).
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

OUT = Path(__file__).with_name("users.jsonl")

# --- what people say, per language --------------------------------------------------------------
# chain: values, content, variants (restatements), regex, turns: first / update naming the old value
# / update not naming it / repeat, and the probe.
CHAINS = {
    "en": {
        "city": dict(values=["Berlin", "Lisbon", "Tokyo", "Toronto", "Melbourne", "Austin", "Dublin"],
                     content="Lives in {v}", variants=["Is based in {v}", "Still lives in {v}"], match=r"{v}",
                     category="fact", importance=0.7,
                     first="I live in {v}, it's been home for a few years now.",
                     update_named="Big change: I moved from {old} to {v} last month.",
                     update_silent="I finally got the keys to my new flat in {v}, boxes everywhere.",
                     repeat="Walked around {v} tonight, I really love living here.",
                     probe="Where do I live now?"),
        "job": dict(values=["nurse", "software engineer", "teacher", "barista", "accountant", "architect"],
                    content="Works as a {v}", variants=["Has a job as a {v}", "Is still working as a {v}"],
                    match=r"{v}", category="fact", importance=0.7,
                    first="I work as a {v}, long days but I like it.",
                    update_named="I quit being a {old} and started working as a {v} this week.",
                    update_silent="First week in my new role as a {v}, so much to learn.",
                    repeat="Another long day at work as a {v}, I'm beat.",
                    probe="What do I do for work these days?"),
        "partner": dict(values=["Tom", "Priya", "Jonas", "Alex", "Maya", "Leo"],
                        content="Is dating {v}", variants=["Is in a relationship with {v}", "Is still dating {v}"],
                        match=r"\b{v}\b", category="relation", importance=0.8,
                        first="I'm seeing someone, {v}, we met at a friend's party.",
                        update_named="{old} and I broke up. I've started dating {v} though.",
                        update_silent="I met {v} at the climbing gym and we're dating now.",
                        repeat="{v} cooked dinner for me tonight, I'm lucky to be dating them.",
                        probe="Who am I dating at the moment?"),
        "diet": dict(values=["vegetarian", "vegan", "pescatarian", "keto"],
                     content="Follows a {v} diet", variants=["Eats a {v} diet", "Still follows a {v} diet"],
                     match=r"\b{v}\b", category="preference", importance=0.6,
                     first="I've been on a {v} diet for two years now.",
                     update_named="I dropped the {old} diet, I'm on a {v} diet since this month.",
                     update_silent="I switched to a {v} diet this month, feeling good about it.",
                     repeat="Cooked a nice {v} dinner tonight, the diet is going well.",
                     probe="What diet do I follow?"),
    },
    "zh": {
        "city": dict(values=["上海", "北京", "深圳", "成都", "杭州"], content="住在{v}",
                     variants=["目前在{v}生活", "还住在{v}"], match=r"{v}", category="fact", importance=0.7,
                     first="我住在{v}，已经好几年了。", update_named="我上个月从{old}搬到{v}了。",
                     update_silent="终于在{v}的新家安顿下来了，箱子还没拆完。",
                     repeat="今晚在{v}散步，真喜欢住在这里。", probe="我现在住在哪里？"),
        "job": dict(values=["护士", "程序员", "老师", "会计", "设计师"], content="职业是{v}",
                    variants=["工作是{v}", "还在当{v}"], match=r"{v}", category="fact", importance=0.7,
                    first="我是一名{v}，工作挺忙的。", update_named="我不做{old}了，这周开始当{v}。",
                    update_silent="新工作是{v}，要学的东西好多。", repeat="今天又是当{v}忙碌的一天。",
                    probe="我现在做什么工作？"),
        "partner": dict(values=["小王", "阿杰", "李明", "陈晨"], content="在和{v}交往",
                        variants=["和{v}在谈恋爱", "还在和{v}交往"], match=r"{v}", category="relation",
                        importance=0.8, first="我在和{v}谈恋爱，是朋友介绍认识的。",
                        update_named="我和{old}分手了，现在在和{v}交往。",
                        update_silent="我和{v}在一起了，是在健身房认识的。",
                        repeat="{v}今天给我做了晚饭，和他交往真好。", probe="我现在在和谁交往？"),
    },
}

# stable facts with an optional trap (related, not contradicting; regexes checked trap first)
STABLE = {
    "en": [
        dict(name="daughter", content="Has a daughter, Mia", match=r"daughter", category="relation", importance=0.9,
             turn="My daughter Mia turned six, she's obsessed with dinosaurs.",
             trap=dict(content="Mia started school", match=r"school", category="event", importance=0.6,
                       turn="Mia started school this week, she was so brave.")),
        dict(name="bank", content="Works at a bank", match=r"\bbank\b", category="fact", importance=0.6,
             turn="I work at a bank downtown, mostly mortgages.", excludes="job",
             trap=dict(content="Finds a bank colleague annoying", match=r"colleague", category="emotion",
                       importance=0.4, turn="My bank colleague keeps taking credit for my work, so annoying.")),
        dict(name="dog", content="Has a dog named Biscuit", match=r"\bdog\b", category="relation", importance=0.7,
             turn="I have a dog, Biscuit, a very lazy beagle.",
             trap=dict(content="Biscuit had surgery on his leg", match=r"surgery", category="event",
                       importance=0.5, turn="Biscuit had surgery on his leg yesterday, poor boy.")),
        dict(name="brother", content="Has an older brother, Sam", match=r"brother", category="relation",
             importance=0.6, turn="My older brother Sam is the funny one in the family.",
             trap=dict(content="Sam got married", match=r"married|wedding", category="event", importance=0.6,
                       turn="Sam got married on Saturday, I gave a speech at the wedding.")),
        dict(name="peanuts", content="Is allergic to peanuts", match=r"peanut", category="fact", importance=0.8,
             turn="I'm allergic to peanuts, so I always check labels."),
        dict(name="hometown", content="Grew up in Manchester", match=r"grew up|Manchester", category="fact",
             importance=0.5, turn="I grew up in Manchester, rainy but I miss it."),
        dict(name="piano", content="Plays the piano", match=r"piano(?!.*lesson)", category="preference",
             importance=0.5, turn="I play the piano most evenings to unwind.",
             trap=dict(content="Started jazz piano lessons", match=r"lesson", category="event", importance=0.4,
                       turn="I started jazz piano lessons, my teacher is great.")),
    ],
    "zh": [
        dict(name="daughter", content="有一个女儿叫朵朵", match=r"女儿", category="relation", importance=0.9,
             turn="我女儿朵朵六岁了，特别喜欢恐龙。",
             trap=dict(content="朵朵上小学了", match=r"小学|上学", category="event", importance=0.6,
                       turn="朵朵这周上小学了，她很勇敢。")),
        dict(name="bank", content="在银行工作", match=r"银行", category="fact", importance=0.6,
             turn="我在银行上班，主要做贷款。", excludes="job",
             trap=dict(content="觉得银行同事很烦人", match=r"同事", category="emotion", importance=0.4,
                       turn="银行里有个同事总抢我的功劳，太烦人了。")),
        dict(name="cat", content="养了一只猫叫年糕", match=r"猫", category="relation", importance=0.7,
             turn="我养了一只猫，叫年糕，很黏人。",
             trap=dict(content="年糕生病看了兽医", match=r"兽医|生病", category="event", importance=0.5,
                       turn="年糕昨天生病了，带它去看了兽医。")),
        dict(name="peanuts", content="对花生过敏", match=r"花生", category="fact", importance=0.8,
             turn="我对花生过敏，买东西都要看配料表。"),
    ],
}

FILLERS = {"en": ["sushi", "hiking", "jazz", "board games", "gardening", "sci-fi novels", "yoga", "chess",
                  "pottery", "cycling", "karaoke", "podcasts", "photography", "baking", "birdwatching", "tennis",
                  "crosswords", "museums", "camping", "knitting", "swimming", "anime", "poetry", "salsa dancing",
                  "vinyl records", "skiing", "origami", "surfing", "calligraphy", "rock climbing", "film noir",
                  "thai curry", "sourdough", "tea ceremonies", "stargazing", "bonsai"],
           "zh": ["火锅", "爬山", "爵士乐", "桌游", "养花", "科幻小说", "瑜伽", "象棋", "陶艺", "骑行", "唱歌",
                  "播客", "摄影", "烘焙", "观鸟", "网球", "填字游戏", "博物馆", "露营", "织毛衣", "游泳", "动漫",
                  "诗歌", "跳舞", "黑胶唱片", "滑雪", "折纸", "冲浪", "书法", "攀岩", "老电影", "奶茶"]}
SMALL_TALK = {"en": "Just saying hi, nothing much going on today.", "zh": "就是来打个招呼，今天没什么事。"}


def build_user(rng: random.Random, uid: str, lang: str, heavy: bool) -> dict:
    chains = CHAINS[lang]
    stable_pool = STABLE[lang]
    n_sessions = rng.randint(4, 6)
    start = datetime(2025, 1, 5, 19, 0, tzinfo=timezone.utc) + timedelta(days=rng.randint(0, 60))
    at, moments = start, []
    for _ in range(n_sessions):
        moments.append(at)
        at += timedelta(days=rng.choice([2, 5, 9, 16, 30, 45, 70, 100]), hours=rng.randint(0, 5))
    stables = rng.sample(stable_pool, k=min(len(stable_pool), rng.randint(2, 3)))
    excluded = {s.get("excludes") for s in stables}
    chain_names = rng.sample([c for c in chains if c not in excluded], k=2)
    facts: dict[str, dict] = {}
    events: list[list[dict]] = [[] for _ in range(n_sessions)]  # per session: (fact, version, does, turn)

    # Update chains: version 0 in session 0, each next version in a strictly later session.
    for name in chain_names:
        spec = chains[name]
        n_versions = rng.choice([2, 3]) if n_sessions >= 4 else 2
        values = rng.sample(spec["values"], k=n_versions)
        facts[name] = {"kind": "chain", "category": spec["category"], "versions": [
            {"value": v, "content": spec["content"].format(v=v), "variants": [x.format(v=v) for x in spec["variants"]],
             "match": spec["match"].format(v=v)} for v in values]}
        at_sessions = sorted(rng.sample(range(1, n_sessions), k=n_versions - 1))
        events[0].append(dict(fact=name, version=0, does="new", turn=spec["first"].format(v=values[0])))
        for k, s in enumerate(at_sessions, 1):
            template = spec["update_named"] if rng.random() < 0.5 else spec["update_silent"]
            events[s].append(dict(fact=name, version=k, does="supersedes",
                                  turn=template.format(v=values[k], old=values[k - 1])))
        facts[name]["_at"] = [0] + at_sessions
    # Stable facts (said once, early) and their traps (later).
    for spec in stables:
        facts[spec["name"]] = {"kind": "stable", "category": spec["category"], "versions": [
            {"value": spec["name"], "content": spec["content"], "variants": [], "match": spec["match"]}]}
        first = rng.choice([0, 0, 1]) if n_sessions > 2 else 0
        events[first].append(dict(fact=spec["name"], version=0, does="new", turn=spec["turn"]))
        if "trap" in spec and first + 1 < n_sessions:
            trap = spec["trap"]
            name = spec["name"] + "_trap"
            facts[name] = {"kind": "trap", "of": spec["name"], "category": trap["category"], "versions": [
                {"value": name, "content": trap["content"], "variants": [], "match": trap["match"]}]}
            events[rng.randint(first + 1, n_sessions - 1)].append(
                dict(fact=name, version=0, does="new", turn=trap["turn"]))
    # Repeats: one or two chain facts restated (same version) in 1-4 later sessions while current.
    for name in rng.sample(chain_names, k=rng.choice([1, 2])):
        spec, at_sessions = chains[name], facts[name]["_at"]
        for k, s0 in enumerate(at_sessions):
            s1 = at_sessions[k + 1] if k + 1 < len(at_sessions) else n_sessions
            later = [s for s in range(s0 + 1, s1)]
            for n, s in enumerate(rng.sample(later, k=min(len(later), rng.randint(1, 4)))):
                events[s].append(dict(fact=name, version=k, does="same_as", variant=n % 2,
                                      turn=spec["repeat"].format(v=facts[name]["versions"][k]["value"])))
    # Heavy users: 32 fillers in extra early sessions, so the known set (30) has to be chosen.
    if heavy:
        filler_sessions = 4
        for i, item in enumerate(FILLERS[lang][:32]):
            name = f"likes_{i:02d}"
            content = f"Likes {item}" if lang == "en" else f"喜欢{item}"
            facts[name] = {"kind": "filler", "category": "preference", "versions": [
                {"value": item, "content": content, "variants": [], "match": rf"(?i)\b{item}\b" if lang == "en"
                 else item}]}
        fill = [[dict(fact=f"likes_{i:02d}", version=0, does="new",
                      turn=(f"I really like {item}." if lang == "en" else f"我很喜欢{item}。"))
                 for i, item in enumerate(FILLERS[lang][:32]) if i % filler_sessions == j]
                for j in range(filler_sessions)]
        # fillers go into sessions inserted right after session 0, a few days apart
        gap = (moments[1] - moments[0]) / (filler_sessions + 1)
        events = events[:1] + fill + events[1:]
        moments = moments[:1] + [moments[0] + gap * (j + 1) for j in range(filler_sessions)] + moments[1:]
    # A session with nothing to remember, now and then.
    if rng.random() < 0.3:
        i = rng.randint(1, len(events))
        events.insert(i, [dict(fact=None, turn=SMALL_TALK[lang])])
        moments.insert(i, moments[i - 1] + (moments[i] - moments[i - 1]) / 2 if i < len(moments)
                       else moments[-1] + timedelta(days=3))
    sessions = []
    for when, evs in zip(moments, events):
        rng.shuffle(evs)
        memories = []
        for e in evs:
            if e["fact"] is None:
                continue
            f = facts[e["fact"]]
            version = f["versions"][e["version"]]
            content = version["variants"][e["variant"]] if e["does"] == "same_as" and version["variants"] \
                else version["content"]
            memory = {"fact": e["fact"], "version": e["version"], "content": content, "category": f["category"],
                      "importance": _importance(lang, e["fact"], f)}
            if e["does"] == "supersedes":
                memory["supersedes"] = {"fact": e["fact"], "version": e["version"] - 1}
            elif e["does"] == "same_as":
                memory["same_as"] = {"fact": e["fact"], "version": e["version"]}
            memories.append(memory)
        sessions.append({"at": when.isoformat(), "turns": [e["turn"] for e in evs], "memories": memories})
    for f in facts.values():
        f.pop("_at", None)
    probes = [{"query": chains[name]["probe"], "fact": name} for name in chain_names]
    return {"user": uid, "lang": lang, "heavy": heavy, "facts": facts, "sessions": sessions, "probes": probes}


def _importance(lang: str, fact: str, spec: dict) -> float:
    if spec["kind"] == "chain":
        return CHAINS[lang][fact]["importance"]
    if spec["kind"] == "filler":
        return 0.3
    for s in STABLE[lang]:
        if s["name"] == fact:
            return s["importance"]
        if s["name"] + "_trap" == fact:
            return s["trap"]["importance"]
    return 0.5


def main() -> None:
    rng = random.Random(20261201)
    users = [build_user(rng, f"en-{i:02d}", "en", heavy=i in (3, 11)) for i in range(1, 19)]
    users += [build_user(rng, f"zh-{i:02d}", "zh", heavy=i == 2) for i in range(1, 7)]
    OUT.write_text("".join(json.dumps(u, ensure_ascii=False) + "\n" for u in users))
    sessions = sum(len(u["sessions"]) for u in users)
    print(f"wrote {OUT}: {len(users)} users, {sessions} sessions, {sum(len(u['probes']) for u in users)} probes")


if __name__ == "__main__":
    main()
