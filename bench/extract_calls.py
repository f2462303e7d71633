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
for all of its memories. A session with nothing worth remembering costs the LLM call only. A second
sweep must cost nothing. Results go to stdout and ``bench/results/extract_calls.md``.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import re
import shlex
import sys
import time
import warnings
from pathlib import Path

import machine  # bench/machine.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "extract_calls.md"
MARKER = re.compile(r"\[s(\d+)\]")
warnings.filterwarnings("ignore", message="No application metrics to publish")

for _name in ("OPENROUTER_API_KEY", "VOYAGE_API_KEY", "LLM_BASE_URL", "EMBED_BASE_URL", "PROVIDER_SECRET_ARN",
              "DATABASE_SECRET_ARN", "EXTRACT_FUNCTION_NAME", "DATABASE_URL"):
    os.environ.pop(_name, None)
os.environ.update({"POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_LOG_LEVEL": "ERROR",
                   "POWERTOOLS_METRICS_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"})

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


def extraction_answer(session_no: int, empty_every: int) -> str:
    """What the fake extraction model answers for session n: 1-5 memories, or none every `empty_every`."""
    if empty_every and session_no % empty_every == empty_every - 1:
        return json.dumps({"memories": []})
    count = 1 + session_no % len(MEMORIES)
    return json.dumps({"memories": [{"content": f"{text} [s{session_no}]", "category": category,
                                     "importance": importance}
                                    for text, category, importance in MEMORIES[:count]]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--turns", type=int, default=3, help="chat turns per session (1-5)")
    parser.add_argument("--empty-every", type=int, default=10,
                        help="every n-th session's extraction answers no memories (0: never)")
    parser.add_argument("--workers", type=int, default=4, help="in-process extract invocations at once")
    parser.add_argument("--pgdata", default="/tmp/eros-bench-extract")
    parser.add_argument("--out", default=str(RESULTS), help="markdown results file ('-' for none)")
    args = parser.parse_args(argv)
    command = ".venv/bin/python bench/extract_calls.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    args.turns = max(1, min(args.turns, len(TURNS)))

    sys.path.insert(0, str(ROOT / "tests"))
    import pgserver

    from eros import db as eros_db, dreaming, providers
    from eros.config import settings
    from eros.extraction import SYSTEM_PROMPT
    from eros.local import LambdaContext, http_api_event, load_function
    from eros.migrate import migrate
    from fakes import FakeOpenRouter, FakeVoyage

    url = pgserver.get_server(args.pgdata, cleanup_mode=None).get_uri()
    migrate(url)
    with eros_db.connect(url, vector=False) as conn:  # every run starts from an empty engine
        conn.execute("TRUNCATE engine.companion_memories, engine.chat_messages, engine.chat_sessions, engine.user_consolidation,"
                     " engine.persona_instances CASCADE")

    def respond(request: dict) -> str:
        system = str(request["messages"][0].get("content") or "")
        if system != SYSTEM_PROMPT:
            return "That sounds like a lot. I'm here."  # a chat turn's reply
        transcript = " ".join(str(m.get("content") or "") for m in request["messages"][1:])
        return extraction_answer(int(MARKER.search(transcript).group(1)), args.empty_every)

    llm, voyage = FakeOpenRouter(respond), FakeVoyage()
    os.environ.update({"DATABASE_URL": url, "LLM_BASE_URL": llm.url, "OPENROUTER_API_KEY": "bench",
                       "EMBED_BASE_URL": voyage.url, "VOYAGE_API_KEY": "bench", "DREAMING_IDLE_SECS": "1",
                       "DREAMING_BATCH_SIZE": "200"})
    settings.cache_clear()
    providers.reset()
    eros_db.reset()
    try:
        # 1. Chat: N sessions of a few turns each through the chat Lambda's handler.
        chat = load_function("chat")

        def call(method: str, path: str, body: dict, user: str) -> dict:
            event = http_api_event(method, path, {"content-type": "application/json"}, json.dumps(body).encode(),
                                   {"sub": user, "iss": "bench", "aud": "bench"})
            result = chat.lambda_handler(event, LambdaContext("chat"))
            assert result["statusCode"] in (200, 201), result
            return json.loads(result["body"])

        started = time.monotonic()
        for n in range(args.sessions):
            user = f"bench-user-{n % 10}"
            sid = call("POST", "/v1/sessions", {"persona_id": ("luna", "kai", "mei")[n % 3]}, user)["id"]
            for t in range(args.turns):
                call("POST", f"/v1/sessions/{sid}/turns", {"content": TURNS[t].format(m=f"[s{n}]")}, user)
        chat_calls = (llm.calls, voyage.calls)
        print(f"chatted {args.sessions} sessions x {args.turns} turns in {time.monotonic() - started:.1f} s "
              f"({chat_calls[0]} LLM, {chat_calls[1]} embedding calls: not counted)", flush=True)
        time.sleep(1.5)  # the sessions go idle (DREAMING_IDLE_SECS=1)
        llm.reset()
        voyage.reset()

        # 2. One sweep: claim, then the extract handler once per session, in process.
        cfg = settings()
        invoker = dreaming.InProcessInvoker(load_function("extract").lambda_handler, workers=args.workers)
        started = time.monotonic()
        sweep = dreaming.sweep(cfg, invoker)
        invoker.wait()
        sweep_secs = time.monotonic() - started

        # 3. Attribute every provider request to its session.
        per_session = collections.defaultdict(lambda: {"llm": 0, "embed": 0, "inputs": 0})
        unattributed = 0
        for r in llm.requests:
            found = MARKER.search(json.dumps(r["json"], ensure_ascii=False))
            if found:
                per_session[int(found.group(1))]["llm"] += 1
            else:
                unattributed += 1
        for r in voyage.requests:
            found = {int(m) for text in r["json"]["input"] for m in MARKER.findall(text)}
            if len(found) == 1:
                entry = per_session[found.pop()]
                entry["embed"] += 1
                entry["inputs"] += len(r["json"]["input"])
            else:
                unattributed += 1
        with eros_db.connect(url, vector=False) as conn:
            stored = {int(MARKER.search(r["content"]).group(1)): r["n"] for r in conn.execute(
                "SELECT min(content) AS content, count(*) AS n FROM engine.companion_memories"
                " WHERE instance_id IS NULL GROUP BY session_id").fetchall()}
            unstamped = conn.execute("SELECT count(*) AS n FROM engine.chat_sessions WHERE classified_at IS NULL"
                                     ).fetchone()["n"]

        # 4. A second sweep has nothing to do and must cost nothing.
        before = (llm.calls, voyage.calls)
        again = dreaming.sweep(cfg, dreaming.InProcessInvoker(load_function("extract").lambda_handler))
        second_sweep_calls = (llm.calls - before[0]) + (voyage.calls - before[1])
    finally:
        llm.close()
        voyage.close()
        eros_db.reset()

    with_memories = [n for n in range(args.sessions) if json.loads(extraction_answer(n, args.empty_every))["memories"]]
    empty = [n for n in range(args.sessions) if n not in with_memories]
    totals = lambda ns: [per_session[n]["llm"] + per_session[n]["embed"] for n in ns]  # noqa: E731
    calls_with = collections.Counter(totals(with_memories))
    calls_empty = collections.Counter(totals(empty))
    exact = all(per_session[n]["llm"] == 1 and per_session[n]["embed"] == 1 for n in with_memories)
    batched = all(per_session[n]["inputs"] == stored.get(n, 0) for n in with_memories)
    ok = (exact and batched and all(per_session[n]["llm"] == 1 and per_session[n]["embed"] == 0 for n in empty)
          and unattributed == 0 and unstamped == 0 and second_sweep_calls == 0 and sweep.claimed == args.sessions)
    total_llm = sum(e["llm"] for e in per_session.values())
    total_embed = sum(e["embed"] for e in per_session.values())
    memories = sum(stored.values())

    def dist(counter) -> str:
        return ", ".join(f"{calls} call{'s' if calls != 1 else ''}: {n} session{'s' if n != 1 else ''}"
                         for calls, n in sorted(counter.items())) or "—"

    report = "\n".join([
        "# Provider calls per extracted session", "",
        f"* **Command:** `{command.strip()}`",
        f"* **Date:** {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"* **Machine:** {machine.describe(with_load=False)}",
        f"* **Setup:** {args.sessions} sessions × {args.turns} turns chatted through the chat handler, idle, then one "
        f"sweep (`eros.dreaming.sweep`, in-process invoker, {args.workers} workers) running the extract handler per "
        "session; fake OpenRouter and Voyage from `tests/fakes.py` (real HTTP on loopback) count the calls. "
        f"Every {args.empty_every}th session's extraction answers no memories.", "",
        "| | sessions | LLM calls | embedding calls | calls per session | goal |",
        "| --- | ---: | ---: | ---: | --- | --- |",
        f"| sessions with memories | {len(with_memories)} | {sum(per_session[n]['llm'] for n in with_memories)} | "
        f"{sum(per_session[n]['embed'] for n in with_memories)} | {dist(calls_with)} | exactly 2 "
        f"({'met' if exact else 'NOT met'}) |",
        f"| sessions with nothing to remember | {len(empty)} | {sum(per_session[n]['llm'] for n in empty)} | "
        f"{sum(per_session[n]['embed'] for n in empty)} | {dist(calls_empty)} | 1 (the LLM call) |",
        f"| second sweep (nothing eligible) | 0 | — | — | {second_sweep_calls} calls in all | 0 |", "",
        f"* {memories} profile memories written, each session's memories embedded in one batch: "
        f"{'yes' if batched else 'NO'}; sessions left unstamped: {unstamped}; requests not attributable to one "
        f"session: {unattributed}.",
        f"* Sweep: claimed {sweep.claimed}, invoked {sweep.invoked}, {sweep.batches} batch(es), "
        f"{sweep_secs:.2f} s including the extractions; second sweep claimed {again.claimed}.",
        f"* Totals: {total_llm} LLM + {total_embed} embedding calls for {args.sessions} sessions = "
        f"{(total_llm + total_embed) / max(1, args.sessions):.2f} per session on average.",
        f"* **Result: {'PASS' if ok else 'FAIL'}**", ""])
    print()
    print(report)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
