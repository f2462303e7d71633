"""Provider calls per extracted session, counted on the fake OpenRouter and Voyage servers.

    .venv/bin/python bench/extract_calls.py                 # 50 sessions x 3 turns
    .venv/bin/python bench/extract_calls.py --sessions 10   # a quick check

The whole pipeline is the real code: sessions are chatted through the chat Lambda's handler (API
Gateway events, as in tests/apiclient.py), then left idle; one sweep (``eros.dreaming.sweep`` with
the in-process invoker, as ``eros sweep`` and the local stack run it) claims them and runs the extract
Lambda's handler once per session. The providers are the fake servers of ``tests/fakes.py`` — real
HTTP on loopback — so every request the engine makes is seen and attributed to its session (the
transcript and the memory texts carry a session marker). The chat turns' own calls are not counted.

Goal: exactly 2 calls per extracted session — 1 LLM call for the whole session and 1 embedding batch
for all of its memories and its episode (an episode is a row: a session that writes only its episode pays the
batch too). A session with nothing worth remembering and no episode costs the LLM call only. A second
sweep must cost nothing. In round 1 the fake model answers an episode for every session but the empty ones, and
every 10th session (offset 5) an episode without memories.

Round 2 exercises write-time consolidation: for the same users, three more sweeps of one session per
user each, whose extraction (answering from the ``<known_memories>`` block of the actual request)
repeats a known memory only (``same_as``: confirmed, no new row, and no episode -- 1 call, the LLM), changes one
(``supersedes``: a new row replaces it -- 2 calls), or repeats one and adds a new memory and an episode (2 calls).
The known memories are found by SQL from the turns' stored embeddings: consolidation adds no call.
Results go to stdout and ``bench/results/extract_calls.md``.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import re
import sys
import time
import warnings

from _common import (
    EMPTY_ENGINE,
    RESULTS,
    add_database_url_option,
    bench_environment,
    command_line,
    database,
    describe_machine,
    one,
    reset_process_state,
    test_helpers_on_path,
    write_results,
)

RESULTS = RESULTS / "extract_calls.md"
MARKER = re.compile(r"\[s(\d+)\]")

TURNS = ["I worked till ten again, my boss keeps piling on new demands {m}.",
         "My sister Lin is visiting next weekend {m}, I should clean the flat.",
         "Honestly I just want a mocha and a quiet evening with my cat Miso {m}.",
         "I started learning the guitar last month {m}.",
         "Mum keeps asking when I will get married {m}, it stresses me out."]
MEMORIES = [("Is under heavy work pressure; the boss is the source", "emotion", 0.8),
            ("Sister Lin visits next weekend", "event", 0.5),
            ("Likes mocha and quiet evenings", "preference", 0.3),
            ("Has a cat named Miso", "relation", 0.4),
            ("Family pressure to marry", "relation", 0.9)]


ROUND2 = ("repeat", "change", "mixed")  # round 2's three sweeps, one session per user each
KNOWN = re.compile(r"^- (m\d+) \((\w+), noted [0-9-]+(?:; when: [^)]*)?\): (.*)$", re.M)


def session_marker(request: dict) -> int | None:
    """The session an extraction request is about: the marker inside its <session> block (the known
    memories shown above it carry the markers of earlier sessions)."""
    text = str(request["messages"][-1].get("content") or "")
    found = MARKER.search(text.split("<session>", 1)[-1])
    return int(found.group(1)) if found else None


def responder(kinds: dict[int, str], empty_every: int, system_prompt: str):
    """What the fake OpenRouter answers: a chat reply, or the extraction of the session the request is about."""
    def respond(request: dict) -> str:
        system = str(request["messages"][0].get("content") or "")
        if system != system_prompt:
            return "That sounds like a lot. I'm here."  # a chat turn's reply
        n = session_marker(request)
        if n is None:  # not attributable to a session (counted as such): nothing to remember
            return json.dumps({"memories": []})
        if n in kinds:
            text = str(request["messages"][-1].get("content") or "")
            block = text.split("</known_memories>", 1)[0] if "<known_memories>" in text else ""
            return consolidating_answer(n, kinds[n], block)
        return extraction_answer(n, empty_every)

    return respond


def attribute(llm_requests: list[dict], voyage_requests: list[dict], per_session: dict[int, dict[str, int]]) -> int:
    """Count each provider request against the session it is about; returns the requests about no one session."""
    unattributed = 0
    for r in llm_requests:
        n = session_marker(r["json"])
        if n is None:
            unattributed += 1
        else:
            per_session[n]["llm"] += 1
    for r in voyage_requests:
        found = {int(m) for text in r["json"]["input"] for m in MARKER.findall(text)}
        if len(found) == 1:
            entry = per_session[found.pop()]
            entry["embed"] += 1
            entry["inputs"] += len(r["json"]["input"])
        else:
            unattributed += 1
    return unattributed


def marker_of(content: str) -> int:
    """The session a stored memory came from (-1: none; such a row is counted against no session)."""
    found = MARKER.search(content)
    return int(found.group(1)) if found else -1


def consolidating_answer(session_no: int, kind: str, known_block: str) -> str:
    """Round 2: repeat the nearest known memory, change it, or repeat it and add a new one."""
    handles = [h for h, _, _ in KNOWN.findall(known_block)]
    if not handles:  # nothing known about this user: nothing to repeat or change
        return json.dumps({"memories": [] if kind == "repeat" else [
            {"content": f"Moved to a new flat in Lisbon [s{session_no}]", "category": "fact", "importance": 0.7}]})
    memories = {
        "repeat": [{"content": f"Restates a known memory [s{session_no}]", "category": "fact", "same_as": handles[0]}],
        "change": [{"content": f"Moved to a new flat in Lisbon [s{session_no}]", "category": "fact",
                    "importance": 0.7, "supersedes": [handles[0]]}],
        "mixed": [{"content": f"Restates a known memory [s{session_no}]", "category": "fact", "same_as": handles[0]},
                  {"content": f"Started running on Sundays [s{session_no}]", "category": "event", "importance": 0.4}],
    }[kind]
    return json.dumps({"memories": memories, "episode": None if kind == "repeat" else episode(session_no)})


def episode(session_no: int) -> dict:
    """The session's episode (it carries the session's marker, as its memories do, for attribution)."""
    return {"content": f"The user told Luna about work and her sister Lin [s{session_no}]", "occurred_at": None}


def extraction_answer(session_no: int, empty_every: int) -> str:
    """What the fake extraction model answers for session n: 1-5 memories and an episode; nothing every
    `empty_every`; an episode alone every `empty_every` offset by half."""
    if empty_every and session_no % empty_every == empty_every - 1:
        return json.dumps({"memories": [], "episode": None})
    if empty_every and session_no % empty_every == empty_every // 2 - 1:
        return json.dumps({"memories": [], "episode": episode(session_no)})
    count = 1 + session_no % len(MEMORIES)
    return json.dumps({"memories": [{"content": f"{text} [s{session_no}]", "category": category,
                                     "importance": importance}
                                    for text, category, importance in MEMORIES[:count]],
                       "episode": episode(session_no)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--turns", type=int, default=3, help="chat turns per session (1-5)")
    parser.add_argument("--users", type=int, default=10, help="users the sessions belong to (round 2: one each)")
    parser.add_argument("--empty-every", type=int, default=10,
                        help="every n-th session's extraction answers no memories (0: never)")
    parser.add_argument("--workers", type=int, default=4, help="in-process extract invocations at once")
    parser.add_argument("--pgdata", default="/tmp/eros-bench-extract")
    add_database_url_option(parser)
    parser.add_argument("--out", default=str(RESULTS), help="markdown results file ('-' for none)")
    args = parser.parse_args(argv)
    args.turns = max(1, min(args.turns, len(TURNS)))
    args.users = max(1, min(args.users, args.sessions))
    with bench_environment(POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true"), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        return _main(args, command_line(__file__, argv))


def _main(args: argparse.Namespace, command: str) -> int:
    test_helpers_on_path()
    from apiclient import Api
    from fakes import FakeOpenRouter, FakeVoyage

    from eros import db as eros_db
    from eros import dreaming
    from eros.config import settings
    from eros.extraction import SYSTEM_PROMPT
    from eros_dev.dreaming import InProcessInvoker

    # The bench's own database is migrated from scratch every run, so an edited migration cannot go stale.
    url = database(args.pgdata, url=args.database_url, from_scratch=True)
    with eros_db.connect(url, vector=False) as conn:  # every run starts from an empty engine
        conn.execute(EMPTY_ENGINE)

    kinds: dict[int, str] = {}  # round 2's sessions: number -> repeat | change | mixed
    llm, voyage = FakeOpenRouter(responder(kinds, args.empty_every, SYSTEM_PROMPT)), FakeVoyage()
    os.environ.update({"DATABASE_URL": url, "LLM_BASE_URL": llm.url, "OPENROUTER_API_KEY": "bench",
                       "EMBED_BASE_URL": voyage.url, "VOYAGE_API_KEY": "bench", "DREAMING_IDLE_SECS": "1",
                       "DREAMING_BATCH_SIZE": "200"})
    reset_process_state()
    cfg = settings()

    api = Api()  # tests/apiclient.py: the chat handler with API Gateway events, as the tests call it

    def call(method: str, path: str, body: dict, user: str) -> dict:
        status, answer = api.call(method, path, body, user=user)
        assert status in (200, 201), answer
        return answer

    def chat_sessions(numbers: list[int]) -> None:
        started = time.monotonic()
        for n in numbers:
            user = f"bench-user-{n % args.users}"
            sid = call("POST", "/v1/sessions", {"persona_id": ("luna", "kai", "mei")[n % 3]}, user)["id"]
            for t in range(args.turns):
                call("POST", f"/v1/sessions/{sid}/turns", {"content": TURNS[(t + n) % len(TURNS)].format(m=f"[s{n}]")},
                     user)
        print(f"chatted {len(numbers)} sessions x {args.turns} turns in {time.monotonic() - started:.1f} s "
              f"({llm.calls} LLM, {voyage.calls} embedding calls: not counted)", flush=True)
        with eros_db.connect(url, vector=False) as conn:  # the sessions went idle a minute ago (DREAMING_IDLE_SECS=1)
            conn.execute("UPDATE engine.chat_sessions SET last_active_at = last_active_at - interval '1 minute'"
                         " WHERE extracted_at IS NULL")
        llm.reset()
        voyage.reset()

    def sweep_and_count(per_session: dict) -> tuple:
        """One sweep, the extract handler once per claimed session, in process; every provider request
        attributed to its session. Returns (sweep result, seconds, unattributed requests)."""
        invoker = InProcessInvoker(workers=args.workers)
        started = time.monotonic()
        result = dreaming.sweep(cfg, invoker)
        invoker.wait()
        seconds = time.monotonic() - started
        unattributed = attribute(llm.requests, voyage.requests, per_session)
        llm.reset()
        voyage.reset()
        return result, seconds, unattributed

    per_session: collections.defaultdict[int, dict[str, int]] = collections.defaultdict(
        lambda: {"llm": 0, "embed": 0, "inputs": 0})
    sweeps: list[tuple] = []
    try:
        # Round 1: N sessions of a few turns each through the chat Lambda's handler, then one sweep.
        round1 = list(range(args.sessions))
        chat_sessions(round1)
        sweeps.append(("round 1",) + sweep_and_count(per_session))
        # Round 2: per kind, one session per user (so no two extractions of a user race), then a sweep.
        round2: dict[str, list[int]] = {}
        for r, kind in enumerate(ROUND2):
            numbers = [args.sessions + r * args.users + u for u in range(args.users)]
            round2[kind] = numbers
            kinds.update({n: kind for n in numbers})
            chat_sessions(numbers)
            sweeps.append((f"round 2: {kind}",) + sweep_and_count(per_session))
        with eros_db.connect(url, vector=False) as conn:
            stored = {marker_of(r["content"]): r["n"] for r in conn.execute(
                "SELECT min(content) AS content, count(*) AS n FROM engine.companion_memories"
                " WHERE instance_id IS NULL GROUP BY session_id").fetchall()}
            episodes = {marker_of(r["content"]): 1 for r in conn.execute(
                "SELECT content FROM engine.companion_memories WHERE source = 'episode'").fetchall()}
            unstamped = one(conn.execute("SELECT count(*) AS n FROM engine.chat_sessions WHERE extracted_at IS NULL"
                                         ))["n"]
            consolidated = one(conn.execute(
                "SELECT count(*) FILTER (WHERE superseded_at IS NOT NULL) AS superseded,"
                " coalesce(sum(mention_count - 1), 0) AS confirmations, count(*) AS rows"
                " FROM engine.companion_memories WHERE instance_id IS NULL"))

        # A last sweep has nothing to do and must cost nothing.
        before = (llm.calls, voyage.calls)
        again = dreaming.sweep(cfg, InProcessInvoker())
        last_sweep_calls = (llm.calls - before[0]) + (voyage.calls - before[1])
    finally:
        llm.close()
        voyage.close()
        eros_db.reset()

    report, ok = render(args, command, per_session, round1, round2, stored, episodes, unstamped, consolidated,
                        sweeps, last_sweep_calls, again)
    print()
    print(report)
    write_results(args.out, report, notes=False)
    return 0 if ok else 1


def render(args: argparse.Namespace, command: str, per_session: dict[int, dict[str, int]], round1: list[int],
           round2: dict[str, list[int]], stored: dict[int, int], episodes: dict[int, int], unstamped: int,
           consolidated: dict, sweeps: list[tuple], last_sweep_calls: int, again) -> tuple[str, bool]:
    """The report and whether every goal was met."""
    total = lambda n: per_session[n]["llm"] + per_session[n]["embed"]  # noqa: E731
    everything = round1 + [n for ns in round2.values() for n in ns]
    # What each session should cost follows from what it wrote: new rows -> LLM + one embedding batch;
    # no new row (nothing to remember, or only repeats of known memories, and no episode) -> the LLM call alone.
    written = {n: stored.get(n, 0) + episodes.get(n, 0) for n in everything}  # profile rows and the episode
    exact = all((per_session[n]["llm"], per_session[n]["embed"]) == ((1, 1) if written[n] else (1, 0))
                for n in everything)
    batched = all(per_session[n]["inputs"] == written[n] for n in everything)
    with_known = [u for u in range(args.users) if any(stored.get(n) for n in round1 if n % args.users == u)]
    # Round 2 did consolidate: each user with known memories had the nearest confirmed in "repeat" and
    # one superseded in "change"; in "mixed" every user has known memories (at least the change's row).
    expected = {"superseded": len(with_known), "confirmations": len(with_known) + args.users}
    consolidation_ok = (consolidated["superseded"] == expected["superseded"]
                        and consolidated["confirmations"] == expected["confirmations"]
                        and not any(stored.get(n) for n in round2["repeat"] if n % args.users in with_known))
    unattributed = sum(s[3] for s in sweeps)
    ok = (exact and batched and consolidation_ok and unattributed == 0 and unstamped == 0 and last_sweep_calls == 0
          and all(s[1].claimed == len(ns) for s, ns in zip(sweeps, [round1, *round2.values()], strict=True)))

    def dist(ns: list[int]) -> str:
        counter = collections.Counter(total(n) for n in ns)
        return ", ".join(f"{calls} call{'s' if calls != 1 else ''}: {k} session{'s' if k != 1 else ''}"
                         for calls, k in sorted(counter.items())) or "—"

    def line(title: str, ns: list[int], goal: str) -> str:
        return (f"| {title} | {len(ns)} | {sum(per_session[n]['llm'] for n in ns)} | "
                f"{sum(per_session[n]['embed'] for n in ns)} | {dist(ns)} | {goal} |")

    new_rows = [n for n in everything if written[n]]
    no_rows = [n for n in everything if not written[n]]
    r1_with = [n for n in round1 if stored.get(n)]
    r1_episode_only = [n for n in round1 if episodes.get(n) and not stored.get(n)]
    r1_empty = [n for n in round1 if not written[n]]
    total_llm = sum(per_session[n]["llm"] for n in everything)
    total_embed = sum(per_session[n]["embed"] for n in everything)
    report = "\n".join([
        "# Provider calls per extracted session", "",
        f"* **Command:** `{command}`",
        f"* **Date:** {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"* **Machine:** {describe_machine(with_load=False)}",
        f"* **Setup:** round 1: {args.sessions} sessions × {args.turns} turns of {args.users} users chatted through "
        "the "
        f"chat handler, idle, then one sweep (`eros.dreaming.sweep`, in-process invoker, {args.workers} workers) "
        "running the extract handler per session; every "
        f"{args.empty_every}th session's extraction answers no memories and no episode, every "
        f"{args.empty_every}th (offset {args.empty_every // 2}) an episode alone, the others memories and an "
        "episode. Round 2 (consolidation): three more sweeps "
        f"of one session per user each, whose extraction answers from the `<known_memories>` block of the actual "
        "request: repeat the nearest known memory only (`same_as`), change it (`supersedes`), or repeat it and add "
        "a new memory. Fake OpenRouter and Voyage from `tests/fakes.py` (real HTTP on loopback) count the calls.", "",
        "| | sessions | LLM calls | embedding calls | calls per session | goal |",
        "| --- | ---: | ---: | ---: | --- | --- |",
        line("round 1: sessions with memories and an episode", r1_with, "exactly 2"),
        line("round 1: sessions with an episode alone (a row: it is embedded)", r1_episode_only, "exactly 2"),
        line("round 1: sessions with nothing to remember and no episode", r1_empty, "1 (the LLM call)"),
        line("round 2: repeat only (`same_as`, no new row, no episode)", round2["repeat"],
             "1 (the LLM call)" + ("" if len(with_known) == args.users else
                                   f"; {args.users - len(with_known)} user(s) with nothing known answer nothing")),
        line("round 2: changed fact (`supersedes`) and an episode", round2["change"], "exactly 2"),
        line("round 2: repeat + a new memory and an episode", round2["mixed"], "exactly 2"),
        f"| **all sessions that wrote new rows** | {len(new_rows)} | {sum(per_session[n]['llm'] for n in new_rows)} | "
        f"{sum(per_session[n]['embed'] for n in new_rows)} | {dist(new_rows)} | exactly 2 "
        f"({'met' if all(total(n) == 2 for n in new_rows) else 'NOT met'}) |",
        f"| **all sessions that wrote no row** | {len(no_rows)} | {sum(per_session[n]['llm'] for n in no_rows)} | "
        f"{sum(per_session[n]['embed'] for n in no_rows)} | {dist(no_rows)} | 1 "
        f"({'met' if all(total(n) == 1 for n in no_rows) else 'NOT met'}) |",
        f"| last sweep (nothing eligible) | 0 | — | — | {last_sweep_calls} calls in all | 0 |", "",
        f"* {sum(stored.values())} profile memories and {sum(episodes.values())} episodes written, each session's "
        "memories and episode embedded in one batch: "
        f"{'yes' if batched else 'NO'}; sessions left unstamped: {unstamped}; requests not attributable to one "
        f"session: {unattributed}.",
        f"* Consolidation applied in round 2: {consolidated['superseded']} rows superseded and "
        f"{consolidated['confirmations']} confirmations (mention count) for {len(with_known)} users with known "
        f"memories before round 2 (expected {expected['superseded']} and {expected['confirmations']}: one "
        "confirmation per repeat-only session of those users, one per mixed session): "
        f"{'yes' if consolidation_ok else 'NO'}.",
        *[f"* Sweep {name}: claimed {res.claimed}, invoked {res.invoked}, {res.batches} batch(es), {secs:.2f} s "
          "including the extractions." for name, res, secs, _ in sweeps],
        f"* Last sweep claimed {again.claimed}.",
        f"* Totals: {total_llm} LLM + {total_embed} embedding calls for {len(everything)} sessions = "
        f"{(total_llm + total_embed) / max(1, len(everything)):.2f} per session on average.",
        f"* **Result: {'PASS' if ok else 'FAIL'}**", ""])
    return report, ok


if __name__ == "__main__":
    sys.exit(main())
