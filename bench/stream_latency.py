"""Time to the first word of a streamed turn on the local stack, and the streamed reply against the JSON route's.

    .venv/bin/python bench/stream_latency.py                     # 200 timed turns after 10 warm-up turns
    .venv/bin/python bench/stream_latency.py --turns 50 --first-token-ms 50 --token-ms 20

The local stack (`eros serve`'s server, in-process, on a loopback port) with a fake OpenAI-compatible model that
streams (``tests/fakes.py``'s ``FakeOpenRouter``: its first token after ``--first-token-ms``, then one word piece
every ``--token-ms``) and the offline embedder. Each timed turn is ``POST /v1/sessions/{id}/turns/stream`` through a
real socket: the clock starts just before the request is sent and stops at the first ``delta`` event the client
reads (and again at ``done``). The fake records when the model request reached it, so the time to the first delta
splits into the engine's part before the model call, the model's own wait for its first token (the fake's delay)
and the way back from the model's first token to the client.

Then the check: for each utterance, the same scripted model answers a streamed turn and a JSON turn
(``POST .../turns``) in two fresh sessions; the deltas joined, the ``done`` event's ``reply`` and the JSON route's
``reply`` must be the same bytes (the script's replies hold Chinese, an emoji, a newline and runs of spaces).

Postgres 16 + pgvector is embedded in /tmp/eros-bench-stream (left running for re-runs); the bench's users
(``bench-stream-*``) are removed before it runs. The report goes to stdout and to
``bench/results/stream_latency.md`` (``--out``); text below its ``<!-- notes -->`` line is kept across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from _common import (
    RESULTS,
    add_database_url_option,
    bench_environment,
    command_line,
    database,
    describe_machine,
    git_commit,
    summary,
    test_helpers_on_path,
    use_database,
    write_results,
)

RESULTS = RESULTS / "stream_latency.md"
GOAL_P95_MS = 100.0
USER = "bench-stream"
UTTERANCES = [
    "I worked till ten again today, my boss keeps piling on new demands.",
    "Guess what, I finally booked the flight to Tokyo for next month!",
    "今天加班到十点，老板又提了新要求。",
    "Tell me something nice, it's been a long day.",
    "My sister is visiting from Shanghai next week and I need to clean everything.",
]


def scripted_reply(request: dict) -> str:
    """The fake model's answer to a chat request: the same for the same last user message, whichever route
    asked; with what a careless join would change (multi-byte characters, a newline, runs of spaces)."""
    said = str(request["messages"][-1].get("content") or "")
    return (f"You said {len(said)} characters, and I heard every one of them.\n\n"
            f"That sounds like a lot  to carry — 辛苦了 🌙. What would help most right now: "
            f"talking it through, or something else for a while?  I'm here ({said[:12]}…).")


# --- command line ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--turns", type=int, default=200, help="timed streamed turns")
    p.add_argument("--warmup", type=int, default=10, help="untimed streamed turns first")
    p.add_argument("--turns-per-session", type=int, default=10, help="a fresh session after this many turns")
    p.add_argument("--first-token-ms", type=float, default=50.0, help="the fake model's wait for its first token")
    p.add_argument("--token-ms", type=float, default=20.0, help="the fake model's wait between word pieces")
    p.add_argument("--memories", type=int, default=50, help="profile memories of the bench's user (recalled)")
    p.add_argument("--containers", type=int, default=4, help="chat containers of the local stack")
    p.add_argument("--pg", default="/tmp/eros-bench-stream", help="the embedded Postgres folder")
    add_database_url_option(p)
    p.add_argument("--out", type=Path, default=RESULTS, help="markdown results file ('-' for none)")
    args = p.parse_args(argv)
    if args.turns < 1 or args.warmup < 0 or args.turns_per_session < 1 or args.memories < 0:
        p.error("--turns and --turns-per-session must be positive; --warmup and --memories not negative")
    if args.first_token_ms < 0 or args.token_ms < 0:
        p.error("--first-token-ms and --token-ms must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with bench_environment(POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true",
                           LOCAL_JWT_SECRET=os.environ.get("LOCAL_JWT_SECRET",
                                                           "bench-only-signing-key-0123456789abcdef")):
        return _main(args, command_line(__file__, argv))


# --- one streamed turn, read as it arrives -------------------------------------------------------------
@dataclass
class Streamed:
    """What the client saw of one streamed turn, in seconds from just before the request was sent."""
    status: int
    events: list[str] = field(default_factory=list)
    deltas: list[str] = field(default_factory=list)
    done: dict | None = None
    error: dict | None = None
    first_delta: float | None = None
    finished: float | None = None
    sent_at: float = 0.0  # time.monotonic() when the request was sent (the fake's clock)


def stream_turn(http, session_id: str, content: str) -> Streamed:
    """``POST .../turns/stream``, each event taken as soon as its bytes are in (``eros.streaming.events`` reads
    each whole event)."""
    from eros.streaming import events

    body = {"content": content, "client_turn_id": f"bench-{uuid.uuid4()}"}
    sent_at = time.monotonic()
    start = time.perf_counter()
    with http.stream("POST", f"/v1/sessions/{session_id}/turns/stream", json=body,
                     headers={"Accept": "text/event-stream"}) as response:
        seen = Streamed(response.status_code, sent_at=sent_at)
        if response.status_code != 200:
            seen.error = json.loads(response.read() or b"null")
            return seen
        buffer = b""
        for chunk in response.iter_bytes():
            buffer += chunk
            while (end := buffer.find(b"\n\n")) >= 0:
                block, buffer = buffer[:end + 2], buffer[end + 2:]
                for name, data in events(block):
                    seen.events.append(name)
                    if name == "delta":
                        if seen.first_delta is None:
                            seen.first_delta = time.perf_counter() - start
                        seen.deltas.append(data["delta"])
                    elif name == "done":
                        seen.done = data
                    elif name == "error":
                        seen.error = data
        seen.finished = time.perf_counter() - start
    return seen


# --- the run -------------------------------------------------------------------------------------------
def _main(args: argparse.Namespace, command: str) -> int:
    import httpx

    from eros.config import settings
    from eros_dev.server import make_server
    from eros_dev.tokens import issue_token, local_jwt_key

    test_helpers_on_path()
    from fakes import FakeOpenRouter

    url = database(args.pg, url=args.database_url)
    use_database(url)
    seed(url, args.memories)
    llm = FakeOpenRouter(scripted_reply)
    llm.first_token_delay = args.first_token_ms / 1000
    llm.token_interval = args.token_ms / 1000
    os.environ.update({"LLM_BASE_URL": llm.url, "OPENROUTER_API_KEY": "bench", "PROVIDER_MAX_RETRIES": "0"})
    os.environ.pop("EMBED_BASE_URL", None)  # the offline embedder: no time of its own
    use_database(url)  # the settings again, with the model's URL
    cfg = settings()
    machine_before = describe_machine()
    server = make_server(cfg, "127.0.0.1", 0, concurrency=args.containers)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    headers = {"Authorization": f"Bearer {issue_token(USER, cfg, local_jwt_key())}"}
    try:
        with (open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull),  # the access log
              httpx.Client(base_url=base, headers=headers, timeout=60) as http):
            timed, problems = timed_turns(http, llm, args)
            checks = identity_checks(http)
    finally:
        server.shutdown()
        server.server_close()
        llm.close()
    report = render(args, command, machine_before, timed, problems, checks)
    print(report)
    write_results(args.out, report)
    return 0 if not problems and all(c["identical"] for c in checks) else 1


def seed(url: str, memories: int) -> None:
    """The bench's user with ``memories`` profile memories (offline vectors), and nothing else of an earlier run."""
    import psycopg
    from pgvector import Vector
    from pgvector.psycopg import register_vector

    from eros.providers.offline import hash_embed

    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        conn.execute("DELETE FROM engine.companion_memories WHERE user_id = %s", (USER,))
        conn.execute("DELETE FROM engine.chat_sessions WHERE user_id = %s", (USER,))
        facts = [f"Fact number {i}: likes {thing}" for i, thing in
                 enumerate(["tea", "hiking", "Tokyo", "the guitar", "cats", "night shifts", "Shanghai"] * 50)]
        for text in facts[:memories]:
            conn.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance,"
                         " source) VALUES (%s, %s, %s, 'fact', 0.5, 'dreaming')",
                         (USER, text, Vector(hash_embed(text))))


def new_session(http) -> str:
    created = http.post("/v1/sessions", json={"persona_id": "luna"})
    created.raise_for_status()
    return created.json()["id"]


@dataclass
class Timed:
    first_delta: float  # seconds from the request to the first delta
    before_model: float  # from the request to the model request reaching the fake
    after_first_token: float  # from the fake's first token (its arrival + its delay) to the first delta
    done: float  # from the request to the done event
    deltas: int


def timed_turns(http, llm, args: argparse.Namespace) -> tuple[list[Timed], list[str]]:
    timed, problems = [], []
    session = ""
    for i in range(args.warmup + args.turns):
        if i % args.turns_per_session == 0:
            session = new_session(http)
        calls = llm.calls
        seen = stream_turn(http, session, UTTERANCES[i % len(UTTERANCES)])
        if seen.status != 200 or seen.done is None or seen.first_delta is None or seen.finished is None:
            problems.append(f"turn {i + 1}: status {seen.status}, events {seen.events}, error {seen.error}")
            continue
        if i < args.warmup:
            continue
        model_request = [r for r in llm.requests[calls:] if r["json"].get("stream")]
        if not model_request:
            problems.append(f"turn {i + 1}: the model was not asked to stream")
            continue
        reached = model_request[0]["at"] - seen.sent_at
        timed.append(Timed(seen.first_delta, reached,
                           seen.first_delta - reached - args.first_token_ms / 1000, seen.finished,
                           len(seen.deltas)))
    return timed, problems


def identity_checks(http) -> list[dict]:
    """Each utterance in two fresh sessions: streamed, then through the JSON route."""
    checks = []
    for content in UTTERANCES:
        seen = stream_turn(http, new_session(http), content)
        answer = http.post(f"/v1/sessions/{new_session(http)}/turns", json={"content": content})
        reply = answer.json().get("reply") if answer.status_code == 200 else None
        joined = "".join(seen.deltas)
        done = (seen.done or {}).get("reply")
        identical = reply is not None and joined.encode() == reply.encode() == (done or "").encode()
        checks.append({"content": content, "deltas": len(seen.deltas), "bytes": len(joined.encode()),
                       "json_bytes": len(reply.encode()) if reply is not None else None,
                       "identical": identical, "status": (seen.status, answer.status_code)})
    return checks


# --- the report ----------------------------------------------------------------------------------------
def render(args, command: str, machine_line: str, timed: list[Timed], problems: list[str],
           checks: list[dict]) -> str:
    first = summary([t.first_delta for t in timed])
    rows = [("**request → first delta**", first, True),
            ("engine: request → the model asked", summary([t.before_model for t in timed]), False),
            ("model's first token (the fake's delay)", summary([args.first_token_ms / 1000] * len(timed)), False),
            ("model's first token → first delta at the client", summary([t.after_first_token for t in timed]), False),
            ("request → done (the whole reply)", summary([t.done for t in timed]), False)]
    verdict = "met" if timed and first["p95"] <= GOAL_P95_MS else "MISSED"
    same = sum(c["identical"] for c in checks)
    pieces = sorted(t.deltas for t in timed)
    lines = [
        "# Streamed turns: time to the first word on the local stack", "",
        "`POST /v1/sessions/{id}/turns/stream` against the local stack's server on loopback, with a fake model that "
        f"streams (first token after {args.first_token_ms:g} ms, then a word piece every {args.token_ms:g} ms) and "
        "the offline embedder. Written by `bench/stream_latency.py`; re-running overwrites everything above the "
        "notes marker.", "",
        f"* **Command:** `{command}`",
        f"* **Date:** {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; code at {git_commit()}",
        f"* **Machine:** {machine_line}",
        f"* **Turns:** {len(timed)} timed after {args.warmup} warm-up turns, one client, a fresh session every "
        f"{args.turns_per_session} turns; {args.memories} profile memories recalled from; "
        f"{args.containers} chat containers; "
        + (f"{pieces[len(pieces) // 2]} delta events per reply (median)." if pieces else "no turn timed."), "",
        f"**p95 = {first['p95']:.1f} ms from request to first delta — goal ≤ {GOAL_P95_MS:g} ms: {verdict}.**", "",
        "| | p50 ms | p95 ms | max ms |", "| --- | ---: | ---: | ---: |",
        *[f"| {name} | {_cell(s['p50'], bold)} | {_cell(s['p95'], bold)} | {_cell(s['max'], bold)} |"
          for name, s, bold in rows], "",
        "The three middle rows split the first: the engine's work before it calls the model (the session, the "
        "user's message stored, recall, the prompt), the model's own wait, and the way back (the fake's first "
        "piece through the provider client, the handler, the local server and the socket). Each row's "
        "percentiles are its own, so they do not add up.", "",
        f"**Streamed = JSON route, byte for byte: {same} of {len(checks)} utterances "
        f"({'PASS' if checks and same == len(checks) else 'FAIL'}).**", "",
        "| utterance | delta events | bytes streamed | bytes of the JSON route's reply | identical |",
        "| --- | ---: | ---: | ---: | --- |",
        *[f"| {c['content'][:40]} | {c['deltas']} | {c['bytes']} | {c['json_bytes']} | "
          f"{'yes' if c['identical'] else 'NO ' + str(c['status'])} |" for c in checks], "",
    ]
    if problems:
        lines += ["**Turns that failed:**", "", *[f"* {p}" for p in problems[:20]], ""]
    return "\n".join(lines)


def _cell(value: float, bold: bool) -> str:
    return f"**{value:.1f}**" if bold else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
