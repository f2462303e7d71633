"""Chat-turn overhead: the memory part of a turn (everything but the model calls), p50/p95/p99.

    .venv/bin/python bench/turn_overhead.py                  # 10,000 users x 100 profile memories (1M rows)
    .venv/bin/python bench/turn_overhead.py --users 100      # a quick check

It calls the real use-case, ``eros.chat.take_turn``, with zero-latency fake providers installed in
place of ``eros.chat.chat_client`` / ``eros.chat.embedder``: opening the turn (session, replay check,
the user's message, history), the recall SQL, the prompt building and the persisting statement are the
real code against a real Postgres 16 + pgvector (embedded, in its own folder, ``/tmp/eros-bench-turn``
by default).

Beside the latency it reports the database round trips of a turn, of a turn with the spend limits on and
of the replay of an answered turn, counted on the wire by ``_wire.RoundTrips`` (a proxy that reads the
protocol messages the client sends and counts those that make it wait: every simple Query, every Sync,
every Flush that is not the tail of a Sync; so a pipeline up to its sync is one, and a BEGIN or COMMIT
sent on its own is one). Those turns go through the proxy; the timed turns do not.

The data set lives in a database named after its shape (``bench_u10000_m100_r20_h20``) and is reused
on re-runs when its row counts match, so only the first run pays for the load (a few minutes on 2
cores for 1.2 million 512-d vectors, generated inside Postgres with INSERT ... SELECT). Rows are
inserted in ``created_at`` order, as production appends them, so one user's memories are spread over
the heap as they would be after a year of use. The rows a run's turns add are deleted when it ends
(and, should a run die half-way, when the next one starts), so every run sees the same data.

The result table goes to stdout and to ``bench/results/turn_overhead.md`` (with the command, date,
machine and row counts); anything below the ``<!-- notes -->`` line of that file is hand-written
analysis and is kept across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import os
import random
import re
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import (
    EMPTY_ENGINE,
    RESULTS,
    add_database_url_option,
    bench_environment,
    command_line,
    database,
    git_commit,
    machine,
    one,
    patched,
    summary,
    use_database,
    write_results,
)
from _stages import Stages, capture_statements
from _wire import RoundTrips

RESULTS = RESULTS / "turn_overhead.md"
GOAL_P95_MS = 15.0
USER_PREFIX = "bench-u"
TURN_PREFIX = "bench-turn-"

UTTERANCES = [
    "I worked till ten again today, my boss keeps piling on new demands.",
    "Guess what, I finally booked the flight to Tokyo for next month!",
    "My mother called again and asked when I'm getting married. I'm so tired of it.",
    "Do you remember the song you promised to send me?",
    "I had a mocha with oat milk this morning, it was perfect.",
    "Can't sleep. Thinking about whether I should quit.",
    "My cat knocked my phone into the sink lol",
    "We went hiking on the weekend, first time in months.",
    "I think I'm getting a cold.",
    "Tell me something nice, it's been a long day.",
    "My sister is visiting from Shanghai next week and I need to clean everything.",
    "I started learning the guitar! My fingers hurt.",
    "what do you think about moving to a new city alone?",
    "今天加班到十点，老板又提了新要求。",
    "ok good night",
]
REPLY = ("That sounds like a lot to carry after such a long day. I'm glad you told me about it. What would help "
         "most right now: talking it through, or something to take your mind off it for a while? Either way, "
         "I'm here, and I remember how hard you've been working lately.")


# --- command line ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--users", type=int, default=10_000, help="users, each with one persona instance and session")
    p.add_argument("--memories-per-user", type=int, default=100, help="profile memories per user")
    p.add_argument("--relationship-per-user", type=int, default=20, help="relationship-layer rows per user")
    p.add_argument("--history-per-user", type=int, default=20, help="chat messages already in each session")
    p.add_argument("--turns", type=int, default=2_000, help="timed turns")
    p.add_argument("--warmup", type=int, default=200, help="untimed turns first")
    p.add_argument("--seed", type=int, default=1, help="seed of the turn sampler and the fake embedder")
    p.add_argument("--pgdata", default="/tmp/eros-bench-turn", help="the embedded Postgres folder")
    add_database_url_option(p)
    p.add_argument("--load-workers", type=int, default=2, help="parallel connections for the initial load")
    p.add_argument("--fresh", action="store_true", help="drop and reload the data set even if it is there")
    p.add_argument("--synchronous-commit", choices=("on", "off"), default="on",
                   help="off: commits do not wait for the WAL flush (shows the cost of the disk, not a setting "
                        "to deploy)")
    p.add_argument("--toast-tuple-target", type=int, default=None, metavar="BYTES",
                   help="experiment: load into a separate database whose companion_memories has this "
                        "toast_tuple_target (e.g. 8160 keeps the 2 KB vectors inline instead of in TOAST)")
    p.add_argument("--no-explain", action="store_true", help="skip EXPLAIN ANALYZE of the turn's SELECTs")
    p.add_argument("--long-history", default="", metavar="N,N,...",
                   help="instead of the headline run: users whose persona conversation holds N utterances each (and "
                        "--long-profile profile memories), added to the data set, their turns interleaved")
    p.add_argument("--long-profile", type=int, default=2_000, help="active profile memories of each long user")
    p.add_argument("--unbounded-turns", type=int, default=0,
                   help="long history: also this many turns per user with RECALL_UTTERANCE_WINDOW=0 (the exact scan)")
    p.add_argument("--context", action="store_true",
                   help="instead of the headline run: an app's turn behind its own chat (POST .../context with "
                        "store, then its reply appended) and the context alone, alternated with take_turn")
    p.add_argument("--output", type=Path, default=RESULTS, help="markdown results file ('-' for none)")
    args = p.parse_args(argv)
    if min(args.users, args.memories_per_user, args.turns) < 1 or min(args.relationship_per_user,
                                                                       args.history_per_user, args.warmup) < 0:
        p.error("--users, --memories-per-user and --turns must be positive; the others not negative")
    return args


# --- database ----------------------------------------------------------------------------------------
def database_name(args: argparse.Namespace) -> str:
    name = (f"bench_u{args.users}_m{args.memories_per_user}_r{args.relationship_per_user}"
            f"_h{args.history_per_user}")
    return name + (f"_ttt{args.toast_tuple_target}" if args.toast_tuple_target else "")


def expected_counts(args: argparse.Namespace) -> dict[str, int]:
    return {"users": args.users, "sessions": args.users, "profile": args.users * args.memories_per_user,
            "relationship": args.users * args.relationship_per_user,
            "messages": args.users * args.history_per_user}


def seeded_counts(conn) -> dict[str, int]:
    """What is in the bench database now (only the seeded rows; turns of earlier runs are not counted)."""
    if conn.execute("SELECT to_regclass('bench.loaded') IS NULL AS missing").fetchone()["missing"]:
        return {}
    if conn.execute("SELECT count(*) AS n FROM bench.loaded").fetchone()["n"] == 0:
        return {}
    return conn.execute(
        "SELECT (SELECT count(*) FROM engine.persona_instances WHERE user_id LIKE 'bench-u%') AS users,"
        " (SELECT count(*) FROM engine.chat_sessions WHERE user_id LIKE 'bench-u%') AS sessions,"
        " (SELECT count(*) FROM engine.companion_memories WHERE instance_id IS NULL AND user_id LIKE 'bench-u%')"
        "   AS profile,"
        " (SELECT count(*) FROM engine.companion_memories WHERE instance_id IS NOT NULL AND user_id LIKE 'bench-u%'"
        "   AND metadata->>'source' = 'bench-seed') AS relationship,"
        " (SELECT count(*) FROM engine.chat_messages WHERE client_turn_id LIKE 'seed-%' AND user_id LIKE 'bench-u%')"
        "   AS messages"
    ).fetchone()


_SKELETON = """
CREATE UNLOGGED TABLE bench.skeleton AS
SELECT row_number() OVER (ORDER BY created_at) AS seq, * FROM (
    SELECT u.user_id, NULL::uuid AS instance_id, u.session_id, p.category, p.importance, p.created_at,
           format('%%s: %%s (memory %%s of %%s)', p.category,
                  (ARRAY['lives in Shanghai, moved there for work', 'likes mocha with oat milk',
                         'her mother pushes her to marry', 'is under heavy work pressure, the boss is the source',
                         'has a cat called Miso', 'is learning the guitar', 'felt lonely after the breakup',
                         'is planning a trip to Tokyo', 'her sister studies in Beijing',
                         'prefers short replies late at night'])[1 + floor(random() * 10)::int],
                  p.k, u.user_id) AS content
    FROM users u
    CROSS JOIN LATERAL (
        SELECT k, (ARRAY['fact', 'fact', 'fact', 'preference', 'preference', 'event', 'event', 'emotion',
                         'relation', 'relation'])[1 + floor(random() * 10)::int] AS category,
               round((0.05 + 0.95 * power(random(), 1.5))::numeric, 3)::real AS importance,
               now() - random() * interval '365 days' AS created_at
        FROM generate_series(1, %(profile)s + 0 * u.n) k
    ) p
    UNION ALL
    SELECT u.user_id, u.instance_id, u.session_id, NULL, NULL, r.created_at,
           format('(said to the persona) %%s [%%s of %%s]',
                  (ARRAY['I worked till ten today', 'my boss added new demands again', 'you promised me a song',
                         'I miss home', 'we watched the rain together', 'good morning!', 'I passed the exam',
                         'my mother called again'])[1 + floor(random() * 8)::int], r.k, u.user_id)
    FROM users u
    CROSS JOIN LATERAL (
        SELECT k, now() - random() * interval '90 days' AS created_at
        FROM generate_series(1, %(relationship)s + 0 * u.n) k
    ) r
) rows
"""

# A random unit vector per row: 512 standard normals (isotropic), scaled by 1/|v| with pgvector's
# element-wise product. The correlated `+ 0 * seq` makes Postgres draw a new vector for every row.
_LOAD_CHUNK = """
INSERT INTO engine.companion_memories (session_id, user_id, instance_id, content, embedding, category,
                                       importance, metadata, created_at)
SELECT session_id, user_id, instance_id, content,
       raw * array_fill((1 / vector_norm(raw))::real, ARRAY[%(dim)s])::vector,
       category, importance, '{"source": "bench-seed"}', created_at
FROM (
    SELECT sk.*, (SELECT array_agg(random_normal()::real)::vector
                  FROM generate_series(1, %(dim)s + 0 * sk.seq)) AS raw
    FROM bench.skeleton sk
    WHERE sk.seq > %(lo)s AND sk.seq <= %(hi)s
    ORDER BY sk.seq
) v
"""


# The data set is loaded, not lived: no memory events for its rows (sql/functions/events.sql, engine.events_on; the
# parallel chunks, each many users' rows, would also take the users' event counters in opposite orders).
NO_EVENTS = "SET eros.events = 'off'"


def load(url: str, args: argparse.Namespace) -> float:
    """Seed users, instances, sessions, history and both memory layers; returns the seconds it took."""
    from eros.config import EMBED_DIM
    from eros.db import connect

    started = time.perf_counter()
    with connect(url) as conn:
        conn.execute(NO_EVENTS)
        conn.execute(EMPTY_ENGINE)
        conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
        conn.execute("DROP TABLE IF EXISTS bench.loaded, bench.skeleton")
        conn.execute("CREATE TABLE bench.loaded (shape jsonb NOT NULL, loaded_at timestamptz NOT NULL DEFAULT now())")
        with conn.transaction():
            conn.execute(
                "INSERT INTO engine.persona_instances (user_id, persona_id, created_at)"
                " SELECT format('%%s%%s', %(prefix)s::text, lpad(u::text, 6, '0')),"
                "        p.ids[1 + u %% array_length(p.ids, 1)], now() - interval '400 days'"
                " FROM generate_series(1, %(users)s) u,"
                "      (SELECT array_agg(id ORDER BY id) AS ids FROM engine.personas) p",
                {"prefix": USER_PREFIX, "users": args.users})
            conn.execute(
                "INSERT INTO engine.chat_sessions (user_id, instance_id, created_at, last_active_at, extracted_at)"
                " SELECT user_id, id, now() - interval '3 hours', now() - interval '2 hours', now() - interval '1 hour'"
                " FROM engine.persona_instances WHERE user_id LIKE 'bench-u%'")
            conn.execute(
                "INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, sent_at)"
                " SELECT s.id, s.user_id, CASE WHEN m %% 2 = 0 THEN 'user' ELSE 'assistant' END,"
                "        CASE WHEN m %% 2 = 0 THEN format('earlier message %%s: how was your day? mine was long', m)"
                "             ELSE format('earlier reply %%s: it sounds like a long one, tell me more', m) END,"
                "        format('seed-%%s', m / 2), s.created_at + m * interval '1 minute'"
                " FROM generate_series(0, %(history)s - 1) m, engine.chat_sessions s"
                " WHERE s.user_id LIKE 'bench-u%%' ORDER BY m, s.id",
                {"history": args.history_per_user})
        print(f"  users, sessions, {args.users * args.history_per_user:,} messages: "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        conn.execute("CREATE TEMP TABLE users AS SELECT i.user_id, i.id AS instance_id, s.id AS session_id,"
                     " row_number() OVER (ORDER BY i.user_id) AS n"
                     " FROM engine.persona_instances i JOIN engine.chat_sessions s ON s.instance_id = i.id"
                     " WHERE i.user_id LIKE 'bench-u%'")
        conn.execute(_SKELETON, {"profile": args.memories_per_user, "relationship": args.relationship_per_user})
        total = one(conn.execute("SELECT count(*) AS n FROM bench.skeleton"))["n"]

    chunk = 25_000
    bounds = [(lo, min(lo + chunk, total)) for lo in range(0, total, chunk)]
    done = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker():
        try:
            with connect(url) as conn:
                conn.execute(NO_EVENTS)
                while True:
                    with lock:
                        if not bounds or errors:
                            return
                        lo, hi = bounds.pop(0)
                    conn.execute(_LOAD_CHUNK, {"lo": lo, "hi": hi, "dim": EMBED_DIM})
                    with lock:
                        done[0] += hi - lo
                        elapsed = time.perf_counter() - started
                        print(f"\r  memories: {done[0]:,} / {total:,} rows ({elapsed:.0f} s)", end="", flush=True)
        except BaseException as exc:  # surfaced after join
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(max(1, args.load_workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print()
    if errors:
        raise errors[0]
    with connect(url) as conn:
        conn.execute("DROP TABLE bench.skeleton")
        bad = one(conn.execute("SELECT count(*) AS n FROM (SELECT embedding FROM engine.companion_memories LIMIT 1000)"
                               " s WHERE abs(vector_norm(embedding) - 1) > 1e-4"))["n"]
        if bad:
            raise RuntimeError(f"{bad} of the first 1000 vectors are not unit vectors")
        print("  VACUUM ANALYZE ...", flush=True)
        conn.execute("VACUUM ANALYZE")
        conn.execute("INSERT INTO bench.loaded (shape) VALUES (%s)",
                     (json.dumps(expected_counts(args)),))
    return time.perf_counter() - started


def forget_earlier_runs(url: str) -> int:
    """Delete what earlier runs' turns added, so every run starts from the same data."""
    from eros.db import connect

    with connect(url) as conn:
        n = conn.execute("DELETE FROM engine.chat_messages WHERE client_turn_id LIKE 'bench-turn-%'").rowcount
        m = conn.execute("DELETE FROM engine.companion_memories WHERE instance_id IS NOT NULL"
                         " AND metadata->>'source' IS DISTINCT FROM 'bench-seed'").rowcount
        conn.execute("DELETE FROM engine.user_usage WHERE user_id LIKE 'bench-u%'")  # the round-trip turns'
        if n or m:
            conn.execute("VACUUM ANALYZE engine.chat_messages")
            conn.execute("VACUUM ANALYZE engine.companion_memories")
            conn.execute("VACUUM ANALYZE engine.chat_sessions")
    return n + m


def data_facts(url: str) -> dict[str, str]:
    from eros.db import connect

    with connect(url) as conn:
        row = one(conn.execute(
            "SELECT current_setting('server_version') AS pg,"
            " (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS pgvector,"
            " current_setting('shared_buffers') AS shared_buffers, current_setting('work_mem') AS work_mem,"
            " pg_size_pretty(pg_total_relation_size('engine.companion_memories')) AS memories_total,"
            " pg_size_pretty(pg_relation_size('engine.companion_memories')) AS memories_heap,"
            " pg_size_pretty(pg_total_relation_size(c.reltoastrelid)) AS memories_toast,"
            " pg_size_pretty(pg_indexes_size('engine.companion_memories')) AS memories_indexes,"
            " pg_size_pretty(pg_database_size(current_database())) AS database,"
            " coalesce(array_to_string(c.reloptions, ', '), 'none') AS reloptions"
            " FROM pg_class c WHERE c.oid = 'engine.companion_memories'::regclass"))
        row["migrations"] = ", ".join(r["name"] for r in conn.execute(
            "SELECT name FROM engine.schema_migrations ORDER BY name"))
    return {k: str(v) for k, v in row.items()}


# --- long histories (issue 27: recall's cost bounded by design) --------------------------------------------
LONG_PREFIX = "bench-long-"
LONG_RESULTS = RESULTS.parent / "turn_overhead_long_history.md"
SESSION_TURNS = 20  # utterances per session of a long user: one episode each
RARE_EVERY = 500  # one utterance in this many names Mehmet and flat 4711 (what the lexical path finds)
LONG_MESSAGES = [*UTTERANCES, "Did Mehmet ever call back about flat 4711?"]

_LONG_ROWS = """
INSERT INTO engine.companion_memories (session_id, user_id, instance_id, content, embedding, category, importance,
                                       source, metadata, created_at)
SELECT session_id, %(user)s, instance_id, content,
       raw * array_fill((1 / vector_norm(raw))::real, ARRAY[%(dim)s])::vector,
       category, importance, source, '{"source": "bench-seed"}', created_at
FROM (
    SELECT r.*, (SELECT array_agg(random_normal()::real)::vector FROM generate_series(1, %(dim)s + 0 * r.k)) AS raw
    FROM (
        SELECT k, NULL::uuid AS session_id, NULL::uuid AS instance_id,
               format('%%s (profile memory %%s)', (ARRAY['lives in Shanghai', 'likes mocha with oat milk',
                      'is learning the guitar', 'has a cat called Miso', 'her sister studies in Beijing'])
                      [1 + k %% 5], k) AS content,
               (ARRAY['fact', 'preference', 'event', 'emotion', 'relation'])[1 + k %% 5] AS category,
               0.5::real AS importance, 'dreaming' AS source,
               now() - interval '730 days' + k * interval '730 days' / %(profile)s AS created_at
        FROM generate_series(1, %(profile)s) k
        UNION ALL
        SELECT k, s.ids[1 + (k - 1) / %(per_session)s], %(instance)s,
               CASE WHEN k %% %(rare)s = 0 THEN format('Mehmet called about flat 4711 (%%s)', k)
                    ELSE format('%%s [%%s]', (%(lines)s::text[])[1 + k %% %(line_count)s], k) END,
               NULL, NULL, 'utterance',
               now() - interval '730 days' + k * interval '730 days' / %(utterances)s
        FROM generate_series(1, %(utterances)s) k, (SELECT %(sessions)s::uuid[] AS ids) s
        UNION ALL
        SELECT k * %(per_session)s, s.ids[k], %(instance)s,
               format('We talked about her day, session %%s.', k), NULL, NULL, 'episode',
               now() - interval '730 days' + (k * %(per_session)s + 0.5) * interval '730 days' / %(utterances)s
        FROM generate_series(1, %(utterances)s / %(per_session)s) k, (SELECT %(sessions)s::uuid[] AS ids) s
    ) r
    ORDER BY r.created_at
) v
"""


def long_users(sizes: list[int]) -> dict[int, str]:
    return {n: f"{LONG_PREFIX}{n}" for n in sizes}


def load_long_history(url: str, sizes: list[int], profile: int) -> None:
    """One user per size (``bench-long-<N>``) with one persona instance, N utterances in sessions of
    SESSION_TURNS, one episode per session, ``profile`` active profile memories and 20 messages in the newest
    session (the one the turns go to): loaded once, kept with the data set (tagged bench-seed)."""
    from eros.config import EMBED_DIM
    from eros.db import connect

    with connect(url) as conn:
        for n, user in long_users(sizes).items():
            have = one(conn.execute(
                "SELECT count(*) FILTER (WHERE instance_id IS NOT NULL AND source = 'utterance') AS u,"
                " count(*) FILTER (WHERE instance_id IS NULL) AS p FROM engine.companion_memories"
                " WHERE user_id = %s AND metadata->>'source' = 'bench-seed'", (user,)))
            if (have["u"], have["p"]) == (n, profile):
                continue
            print(f"  loading {user}: {n:,} utterances, {n // SESSION_TURNS:,} episodes, {profile:,} profile rows",
                  flush=True)
            started = time.perf_counter()
            conn.execute("DELETE FROM engine.persona_instances WHERE user_id = %s", (user,))
            conn.execute("DELETE FROM engine.companion_memories WHERE user_id = %s", (user,))
            instance = one(conn.execute(
                "INSERT INTO engine.persona_instances (user_id, persona_id, created_at)"
                " SELECT %s, min(id), now() - interval '800 days' FROM engine.personas RETURNING id", (user,)))["id"]
            sessions = [r["id"] for r in conn.execute(
                "INSERT INTO engine.chat_sessions (user_id, instance_id, created_at, last_active_at, extracted_at)"
                " SELECT %s, %s, now() - interval '730 days' + k * interval '730 days' / %s,"
                "        now() - interval '730 days' + k * interval '730 days' / %s, now()"
                " FROM generate_series(1, %s) k ORDER BY k RETURNING id",
                (user, instance, n // SESSION_TURNS + 1, n // SESSION_TURNS + 1, n // SESSION_TURNS + 1))]
            conn.execute(
                "INSERT INTO engine.chat_messages (session_id, user_id, role, content, client_turn_id, sent_at)"
                " SELECT %s, %s, CASE WHEN m %% 2 = 0 THEN 'user' ELSE 'assistant' END,"
                "        format('earlier message %%s: how was your day? mine was long', m), format('seed-%%s', m / 2),"
                "        now() - interval '2 hours' + m * interval '1 minute'"
                " FROM generate_series(0, 19) m", (sessions[-1], user))
            conn.execute(_LONG_ROWS, {
                "user": user, "instance": instance, "dim": EMBED_DIM, "profile": profile, "utterances": n,
                "per_session": SESSION_TURNS, "sessions": sessions[:-1], "rare": RARE_EVERY,
                "lines": UTTERANCES, "line_count": len(UTTERANCES)})
            print(f"    {time.perf_counter() - started:.0f} s", flush=True)
        conn.execute("VACUUM ANALYZE engine.companion_memories")


def long_history(url: str, args: argparse.Namespace, command: str) -> int:
    """Turns of the long users, interleaved (one of each size in turn, so that every size sees the same load on
    these shared cores), with the configured recall; then, with --unbounded-turns, the exact scan for comparison."""
    import eros.chat
    import eros.recall
    from eros import db
    from eros.config import EMBED_DIM, settings
    from eros.observability import metrics

    sizes = [int(x) for x in args.long_history.split(",")]
    load_long_history(url, sizes, args.long_profile)
    forget_earlier_runs(url)
    use_database(url)
    rng = random.Random(args.seed)
    with db.connect(url) as conn:
        table_rows = one(conn.execute("SELECT count(*) AS n FROM engine.companion_memories"))["n"]
        sessions = {n: one(conn.execute(
            "SELECT user_id, id FROM engine.chat_sessions WHERE user_id = %s ORDER BY created_at DESC LIMIT 1",
            (user,))) for n, user in long_users(sizes).items()}
    embedder = FakeEmbedder(random_unit_vectors(rng, 2_000, EMBED_DIM))
    chat = FakeChat()
    run_tag = uuid.uuid4().hex[:8]
    loads = [f"start {machine()['loadavg']}"]
    timings: dict[str, dict[int, list[float]]] = {mode: {n: [] for n in sizes} for mode in ("bounded", "unbounded")}
    stages = {n: Stages() for n in sizes}  # a pass of its own: where each size's bounded turn goes
    configured = settings()
    unbounded = configured.model_copy(update={"recall": configured.recall.model_copy(update={"utterance_window": 0})})
    with fakes_installed(embedder, chat), logging_to_nowhere():
        connect_to(url)
        try:
            passes = (("bounded", args.turns, configured), ("breakdown", min(args.turns, 100), configured),
                      ("unbounded", args.unbounded_turns, unbounded))
            for mode, turns, chosen in passes:
                eros.recall.settings = lambda chosen=chosen: chosen  # type: ignore[assignment]  # bench only
                warmup = min(args.warmup, turns)
                for i in range(warmup + turns):
                    for n in sizes:
                        user, session_id = sessions[n]["user_id"], sessions[n]["id"]
                        timer = stages[n] if mode == "breakdown" else None
                        with timer.installed() if timer else contextlib.nullcontext():
                            if timer:
                                timer.begin()
                            t0 = time.perf_counter()
                            eros.chat.take_turn(user, session_id, rng.choice(LONG_MESSAGES),
                                                f"{TURN_PREFIX}{run_tag}-{mode}-{n}-{i}")
                            elapsed = time.perf_counter() - t0
                        metrics.clear_metrics()
                        if i >= warmup and timer:
                            timer.keep(elapsed)
                        elif i >= warmup:
                            timings[mode][n].append(elapsed)
                loads.append(f"after {mode} {machine()['loadavg']}")
        finally:
            eros.recall.settings = settings
            db.reset()
    forget_earlier_runs(url)
    report = render_long(args, command, sizes, table_rows, timings, loads, stages)
    print(report)
    write_results(LONG_RESULTS if args.output == RESULTS else args.output, report)
    return 0


CONTEXT_RESULTS = RESULTS.with_name("context_overhead.md")
CONTEXT_KINDS = (("turn", "a chat turn (`take_turn`, the engine's own model call)"),
                 ("context", "the context alone (`context_for`, nothing stored)"),
                 ("context+store", "the context with the message stored (`store: true`)"),
                 ("app turn", "an app's whole turn: the context with the message stored, then its reply "
                              "appended (`append`): two requests"))


def context_turns(url: str, args: argparse.Namespace, command: str) -> int:
    """An app's turn behind its own chat pipeline against the engine's own turn, on the headline data set:
    random users, the kinds alternated turn by turn so that each sees the same load on these shared cores."""
    import eros.chat
    import eros.context
    import eros.ingest
    from eros import db
    from eros.config import EMBED_DIM
    from eros.observability import metrics

    use_database(url)
    rng = random.Random(args.seed)
    with db.connect(url) as conn:
        sessions = [(r["user_id"], r["id"]) for r in conn.execute(
            "SELECT user_id, id FROM engine.chat_sessions WHERE user_id LIKE 'bench-u%' ORDER BY user_id")]
    embedder = FakeEmbedder(random_unit_vectors(rng, 2_000, EMBED_DIM))
    run_tag = uuid.uuid4().hex[:8]
    timings: dict[str, list[float]] = {kind: [] for kind, _ in CONTEXT_KINDS}
    load_before = machine()["loadavg"]

    def app_turn(user: str, session_id: Any, content: str, turn_id: str, store: bool, reply: bool) -> None:
        eros.context.context_for(user, session_id, content, store=store, client_message_id=turn_id if store else None)
        if reply:
            eros.ingest.append(user, session_id, [eros.ingest.Incoming("assistant", REPLY, turn_id)])

    with fakes_installed(embedder, FakeChat()), logging_to_nowhere():
        connect_to(url)
        try:
            for i in range(args.warmup + args.turns):
                for kind, _ in CONTEXT_KINDS:
                    (user, session_id), content = rng.choice(sessions), rng.choice(UTTERANCES)
                    turn_id = f"{TURN_PREFIX}{run_tag}-{kind.replace(' ', '-').replace('+', '-')}-{i}"
                    t0 = time.perf_counter()
                    if kind == "turn":
                        eros.chat.take_turn(user, session_id, content, turn_id)
                    else:
                        app_turn(user, session_id, content, turn_id, kind != "context", kind == "app turn")
                    elapsed = time.perf_counter() - t0
                    metrics.clear_metrics()
                    if i >= args.warmup:
                        timings[kind].append(elapsed)
        finally:
            db.reset()
    forget_earlier_runs(url)
    report = render_context(args, command, timings, load_before, machine()["loadavg"])
    print(report)
    write_results(CONTEXT_RESULTS if args.output == RESULTS else args.output, report)
    return 0


def render_context(args, command: str, timings: dict[str, list[float]], load_before: str, load_after: str) -> str:
    turn = summary(timings["turn"])
    lines = [f"`{command}`", "",
             f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {git_commit()}, {os.cpu_count()} cores shared; "
             f"load average (1 / 5 / 15 min): before {load_before}, after {load_after}", "",
             f"The memory part (instant fake providers) of each kind of request, on the headline data set "
             f"({args.users:,} users x {args.memories_per_user} profile memories), random users, the kinds "
             f"alternated turn by turn; ratios to the chat turn of the same run. Goal: the context within the "
             f"turn's memory budget (p95 <= {GOAL_P95_MS:g} ms).", "",
             "| request | timed | p50 ms | p95 ms | p99 ms | p50 / turn's | p95 / turn's |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind, label in CONTEXT_KINDS:
        s = summary(timings[kind])
        lines.append(f"| {label} | {len(timings[kind])} | {s['p50']:.2f} | {s['p95']:.2f} | {s['p99']:.2f} | "
                     f"x{s['p50'] / turn['p50']:.2f} | x{s['p95'] / turn['p95']:.2f} |")
    return "\n".join(lines) + "\n"


def render_long(args, command: str, sizes: list[int], table_rows: int, timings: dict, loads: list[str],
                stages: dict[int, Stages]) -> str:
    knobs = __import__("eros.config", fromlist=["settings"]).settings().recall
    lines = [f"`{command}`", "", f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {git_commit()}, "
             f"{machine()['nproc']} cores shared; load average (1 / 5 / 15 min): {'; '.join(loads)}", "",
             f"One user per row below, each with one persona conversation of N utterances (sessions of "
             f"{SESSION_TURNS}, one episode each: N / {SESSION_TURNS}; one utterance in {RARE_EVERY} names Mehmet "
             f"and flat 4711, as one of the {len(LONG_MESSAGES)} messages asks) and {args.long_profile:,} active "
             f"profile memories, in a table of {table_rows:,} rows. The memory part of a chat turn "
             "(`eros.chat.take_turn` with instant fake providers: open the turn, recall, prompt, persist), the "
             "sizes interleaved turn by turn. Recall bound: "
             f"RECALL_UTTERANCE_WINDOW={knobs.utterance_window}, RECALL_POOL={knobs.pool}, "
             f"RECALL_LEXICAL_POOL={knobs.lexical_pool}; `unbounded` is RECALL_UTTERANCE_WINDOW=0 (the exact "
             "scan of every row, the previous release's recall).", "",
             f"| utterances | turns | p50 ms | p95 ms | p99 ms | max ms | goal p95 <= {GOAL_P95_MS:.0f} ms |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for mode in ("bounded", "unbounded"):
        for n in sizes:
            if not timings[mode][n]:
                continue
            s = summary(timings[mode][n])
            goal = ("met" if s["p95"] <= GOAL_P95_MS else "**missed**") if mode == "bounded" else "(comparison)"
            label = f"{n:,}" + ("" if mode == "bounded" else " unbounded")
            lines.append(f"| {label} | {len(timings[mode][n])} | {s['p50']:.2f} | {s['p95']:.2f} | {s['p99']:.2f} | "
                         f"{s['max']:.2f} | {goal} |")
    parts = (("open", "open the turn"), ("recall", "recall (both layers)"), ("prompt", "prompt"),
             ("persist", "persist"), ("other", "other (Python in take_turn)"))
    lines += ["", "Where a bounded turn goes, by size (a pass of its own, the sizes interleaved, with a timer around "
              "each function take_turn reaches, as in `turn_overhead.md`): p50 / p95 ms.", "",
              "| utterances (breakdown) | turns | " + " | ".join(label for _, label in parts) + " |",
              "| ---: | ---: |" + " ---: |" * len(parts)]
    for n in sizes:
        samples = stages[n].samples
        if not samples:
            continue
        cells = []
        for key, _ in parts:
            s = summary(samples.get(f"stage:{key}", [0.0]))
            cells.append(f"{s['p50']:.2f} / {s['p95']:.2f}")
        lines.append(f"| {n:,} | {len(samples['stage:other'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- the fakes ---------------------------------------------------------------------------------------
class FakeEmbedder:
    """Zero latency: hands out pre-drawn random unit vectors (drawn before the clock starts)."""

    model = "bench/fake-embedder"

    def __init__(self, vectors: list[list[float]]):
        self._vectors = vectors
        self._next = 0

    def describe(self) -> str:
        return "bench fake embedder (random unit vectors)"

    def embed(self, texts, input_type, *, deadline=None):
        from eros.providers.embed import Embeddings

        out = []
        for _ in texts:
            out.append(self._vectors[self._next % len(self._vectors)])
            self._next += 1
        return Embeddings(vectors=out, model=self.model, usage={"total_tokens": 0})


class FakeChat:
    """Zero latency: the same reply every time."""

    model = "bench/fake-chat"

    def describe(self) -> str:
        return "bench fake chat model (instant reply)"

    def complete(self, model, messages, *, max_tokens=600, temperature=0.7, deadline=None, json_mode=False):
        from eros.providers.llm import Completion

        self.last_messages = messages
        return Completion(text=REPLY, model=self.model, usage={"prompt_tokens": 0, "completion_tokens": 0})


def random_unit_vectors(rng: random.Random, count: int, dim: int) -> list[list[float]]:
    vectors = []
    for _ in range(count):
        v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
        norm = math.sqrt(sum(x * x for x in v))
        vectors.append([x / norm for x in v])
    return vectors


def fakes_installed(embedder: FakeEmbedder, chat: FakeChat):
    """Replace the provider factories wherever take_turn, the context and the append can reach them (by name, in
    eros.chat, eros.context, eros.ingest and eros.providers), for the block."""
    import eros.chat
    import eros.context
    import eros.ingest
    import eros.providers

    changes = [(module, name, lambda fake=fake: fake)
               for module in (eros.chat, eros.context, eros.ingest, eros.providers)
               for name, fake in (("chat_client", chat), ("embedder", embedder)) if hasattr(module, name)]
    found = {f"{module.__name__}.{name}" for module, name, _ in changes}
    if not {"eros.chat.chat_client", "eros.providers.embedder"} <= found:
        raise SystemExit(f"eros.chat or eros.providers no longer has chat_client/embedder (found {sorted(found)}):"
                         " update fakes_installed()")
    return patched(*changes)


@contextlib.contextmanager
def logging_to_nowhere():
    """Logging stays on (formatting the JSON line is part of a real turn's cost) but writes nowhere."""
    from eros.observability import logger

    with open(os.devnull, "w") as devnull:
        handlers = [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]
        streams = [h.stream for h in handlers]
        for handler in handlers:
            handler.setStream(devnull)
        try:
            yield
        finally:
            for handler, stream in zip(handlers, streams, strict=True):
                handler.setStream(stream)


# --- the run -----------------------------------------------------------------------------------------
def run_turns(url: str, args: argparse.Namespace) -> dict:
    """Two passes over random users: the headline pass runs take_turn untouched (wall and CPU time per
    turn); the breakdown pass runs it again for other random users with the stage timers installed."""
    from eros import db
    from eros.config import EMBED_DIM

    use_database(url)
    rng = random.Random(args.seed)
    with db.connect(url) as conn:
        sessions = [(r["user_id"], r["id"]) for r in conn.execute(
            "SELECT user_id, id FROM engine.chat_sessions WHERE user_id LIKE 'bench-u%' ORDER BY user_id")]
    per_pass = args.warmup + args.turns
    embedder = FakeEmbedder(random_unit_vectors(rng, min(2 * per_pass + 1, 5_000), EMBED_DIM))
    chat = FakeChat()
    with fakes_installed(embedder, chat), logging_to_nowhere():
        try:
            trips = round_trips(url, rng.choice(sessions))
            connect_to(url)
            return _run_turns(args, rng, sessions, chat, per_pass) | {"round_trips": trips}
        finally:
            db.reset()


def connect_to(url: str) -> None:
    """The package's connection to ``url`` from now on, and its settings read again (``use_database`` would
    also forget the providers, which the fakes replace)."""
    from eros import db
    from eros.config import settings

    os.environ["DATABASE_URL"] = url
    settings.cache_clear()
    db.reset()


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """These environment variables for the block (read when ``connect_to`` forgets the settings)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# Spend limits high enough never to refuse a bench turn, but on: the turn's admission is counted.
SPEND_LIMITS = {"TURNS_PER_MINUTE": "1000000", "DAILY_TOKEN_BUDGET": "1000000000000"}


def round_trips(url: str, session: tuple[str, Any]) -> dict[str, int]:
    """The round trips of one user's turns, counted on the wire (``_wire.RoundTrips``): a turn, its replay
    (the same client_turn_id and message again), and both again with the spend limits on."""
    import eros.chat
    from eros.observability import metrics

    user, session_id = session
    tag = f"{TURN_PREFIX}{uuid.uuid4().hex[:8]}-trips"
    counts = {}
    with RoundTrips(url) as wire:
        for limits in (False, True):
            with environment(SPEND_LIMITS if limits else {}):
                connect_to(wire.url)
                eros.chat.take_turn(user, session_id, UTTERANCES[1], f"{tag}-open-{limits}")  # not counted:
                # that turn opens the connection (and learns the vector type), as a container's first does
                for path, turn_id in (("turn", f"{tag}-{limits}"), ("replay", f"{tag}-{limits}")):
                    wire.reset()
                    result = eros.chat.take_turn(user, session_id, UTTERANCES[0], turn_id)
                    if result.replayed != (path == "replay"):
                        raise RuntimeError(f"the round-trip {path} was {'' if result.replayed else 'not '}replayed")
                    counts[f"{path} with spend limits" if limits else path] = wire.count
                metrics.clear_metrics()
    return counts


def _run_turns(args: argparse.Namespace, rng: random.Random, sessions: list, chat: FakeChat, per_pass: int) -> dict:
    import eros.chat
    from eros import db
    from eros.observability import metrics

    run_tag = uuid.uuid4().hex[:8]

    # The floor under every statement: one round trip of `SELECT 1` on the turn's own connection.
    conn = db.connection()
    rtt = []
    for _ in range(300):
        t0 = time.perf_counter()
        conn.execute("SELECT 1").fetchone()
        rtt.append(time.perf_counter() - t0)

    # And under every commit: a one-row UPDATE in autocommit (the WAL flush the turn's transaction waits for).
    commits = []
    for _ in range(100):
        t0 = time.perf_counter()
        conn.execute("UPDATE engine.chat_sessions SET last_active_at = last_active_at WHERE id = %s",
                     (sessions[0][1],))
        commits.append(time.perf_counter() - t0)

    # One turn with every statement recorded (how many statements a turn sends, and what to EXPLAIN).
    (user, session_id), content = rng.choice(sessions), UTTERANCES[0]
    with capture_statements() as statements:
        eros.chat.take_turn(user, session_id, content, f"{TURN_PREFIX}{run_tag}-probe")
    metrics.clear_metrics()
    explains = [] if args.no_explain else explain(statements)

    def one_pass(name: str, stages: Stages | None, before_turn=lambda i: None) -> dict:
        plan = [(rng.choice(sessions), rng.choice(UTTERANCES)) for _ in range(per_pass)]
        out: dict[str, list[float]] = {"wall": [], "cpu": [], "recalled": [], "prompt_chars": []}
        print(f"  {name}: {args.warmup} warm-up + {args.turns} timed turns over {len(sessions):,} users ...",
              flush=True)
        for i, ((user, session_id), content) in enumerate(plan):
            if stages:
                stages.begin()
            before_turn(i)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            result = eros.chat.take_turn(user, session_id, content, f"{TURN_PREFIX}{run_tag}-{name}-{i}")
            elapsed = time.perf_counter() - t0
            cpu = time.thread_time() - c0
            metrics.clear_metrics()  # the handler's log_metrics would flush these once per invocation
            if result.replayed:
                raise RuntimeError("a bench turn was replayed: client_turn_ids collided")
            if i >= args.warmup:
                out["wall"].append(elapsed)
                out["cpu"].append(cpu)
                out["recalled"].append(len(result.recalled))
                out["prompt_chars"].append(sum(len(m["content"]) for m in chat.last_messages))
                if stages:
                    stages.keep(elapsed)
            if (i + 1) % 1000 == 0:
                print(f"    {i + 1} / {per_pass}", flush=True)
        return out

    headline = one_pass("headline", None)
    with Stages().installed() as stages:
        breakdown = one_pass("breakdown", stages)
    lexical = lexical_pass(one_pass, args.warmup)
    return {"headline": headline, "breakdown": breakdown, "stages": stages.samples, "statements": statements,
            "rtt": rtt, "commits": commits, "explains": explains, "lexical": lexical}


def lexical_pass(one_pass, warmup: int) -> dict[str, list[float]]:
    """What recall's lexical part (issue 14) costs a turn: one more pass in which turns alternate between the
    configured settings and the same with RECALL_LEXICAL_WEIGHT=0, so that both halves see the same load on
    these shared cores; the turn's wall time of each half."""
    import eros.recall
    from eros.config import settings

    configured = settings()
    off = configured.model_copy(update={"recall": configured.recall.model_copy(update={"lexical_weight": 0.0,
                                                                                  "lexical_year_weight": 0.0})})
    choice = {"on": configured}
    eros.recall.settings = lambda: choice["on"]  # type: ignore[assignment]  # recall's own reference, bench only
    try:
        result = one_pass("lexical on/off", None,
                          lambda i: choice.update(on=off if (i - warmup) % 2 else configured))
    finally:
        eros.recall.settings = settings
    # one_pass keeps the turns after the warm-up: the first kept one is "on", then they alternate
    return {"on": result["wall"][0::2], "off": result["wall"][1::2]}


_VECTOR_LITERAL = re.compile(r"'\[[-0-9.e,]{200,}\]'")


def explain(statements: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """EXPLAIN (ANALYZE, BUFFERS) of the statements of the probe turn, same parameters, right after it (so the
    user's pages are as warm as the turn left them), on the turn's own connection, in a transaction that is
    rolled back: the turn is stored by then, so its writing statements find it there and write nothing."""
    from eros.db import connection
    from eros.store import recall as recall_store

    out = []
    conn = connection()
    for sql, params in statements:
        if not str(sql).lstrip().upper().startswith(("SELECT", "WITH")):
            continue
        # EXPLAIN cannot see into PL/pgSQL: the turn's recall is shown as the call the turn makes (what it costs
        # with its plan kept) and then as the SQL function that call runs, which the planner inlines (its plan).
        for each in (sql, recall_store.CANDIDATES) if sql == recall_store.TURN_RECALL else (sql,):
            with conn.transaction(force_rollback=True):
                rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + str(each), params).fetchall()
            plan = _VECTOR_LITERAL.sub("'[...]'", "\n".join(r["QUERY PLAN"] for r in rows))
            out.append((" ".join(str(each).split()), plan))
    return out


# --- report ------------------------------------------------------------------------------------------
def render(args, command: str, mach: dict, facts: dict, counts: dict, load_secs: float | None, res: dict) -> str:
    head = res["headline"]
    total = summary(head["wall"])
    ok = total["p95"] <= GOAL_P95_MS
    rtt = summary(res["rtt"])
    commit = summary(res["commits"])
    n_statements = len(res["statements"])
    trips = res["round_trips"]
    lines = [
        "# Chat-turn overhead: the memory part of a turn",
        "",
        "`eros.chat.take_turn` with zero-latency fake providers (embedder and chat model answer instantly), so the",
        "time is opening the turn (session, replay check, the user's message, history), the recall SQL, the prompt",
        "building and the persisting statement against a real Postgres + pgvector. Written by",
        "`bench/turn_overhead.py`; re-running overwrites everything above the notes marker.",
        "",
        f"* **Command:** `{command}`",
        f"* **Date:** {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}; code at {git_commit()}",
        f"* **Machine:** nproc={mach['nproc']}, {mach['cpu']}, {mach['memory']} RAM, Linux {mach['kernel']}, "
        f"Python {mach['python']}. Load average (1/5/15 min) {mach['load_before']} before the turns and "
        f"{mach['loadavg']} after: the cores are shared with other work, and the database server runs on them too.",
        f"* **Database:** embedded PostgreSQL {facts['pg']} + pgvector {facts['pgvector']} over a Unix socket "
        f"(shared_buffers={facts['shared_buffers']}, work_mem={facts['work_mem']}, "
        f"synchronous_commit={args.synchronous_commit}, defaults otherwise); migrations {facts['migrations']}. "
        f"Floors measured on the turn's connection: one `SELECT 1` round trip p50 {rtt['p50']:.3f} / "
        f"p95 {rtt['p95']:.3f} ms; one autocommit single-row UPDATE (a commit, i.e. a WAL flush) p50 "
        f"{commit['p50']:.2f} / p95 {commit['p95']:.2f} ms.",
        f"* **Data:** {counts['users']:,} users, each with one persona instance and session; "
        f"{counts['profile']:,} profile memories ({args.memories_per_user} per user, random unit 512-d vectors, "
        "categories fact 30% / preference 20% / event 20% / emotion 10% / relation 20%, importance 0.05-1, "
        f"created_at over the past year, inserted in time order); {counts['relationship']:,} relationship rows "
        f"({args.relationship_per_user} per user, past 90 days); {counts['messages']:,} chat messages "
        f"({args.history_per_user} per session). companion_memories: {facts['memories_total']} "
        f"(heap {facts['memories_heap']}, TOAST {facts['memories_toast']}, indexes {facts['memories_indexes']}; "
        f"storage options: {facts['reloptions']}); "
        f"database {facts['database']}."
        + (f" Loaded in {load_secs:.0f} s this run." if load_secs is not None else " Reused from an earlier run."),
        f"* **Turns:** {args.turns:,} timed after {args.warmup:,} warm-up turns, each for a random user "
        f"(seed {args.seed}); {statistics.fmean(head['recalled']):.1f} memories recalled and "
        f"{statistics.fmean(head['prompt_chars']):,.0f} prompt characters per turn on average; "
        f"{n_statements} SQL statements per turn.",
        "",
        f"**p95 = {total['p95']:.2f} ms at {trips['turn']} database round trips per turn — goal ≤ "
        f"{GOAL_P95_MS:.0f} ms: {'met' if ok else 'MISSED'}.**",
        "",
        "| | p50 ms | p95 ms | p99 ms | mean ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        _row("**whole turn (take_turn), wall clock**", total, bold=True),
        _row("&nbsp;&nbsp;of which CPU time of the Python process", summary(head["cpu"])),
        "",
        "Database round trips per turn, counted on the wire (`bench/_wire.py`: a proxy that counts the client's",
        "Query, Sync and lone Flush messages, the ones it waits on; a pipeline up to its sync is one):",
        "",
        "| turn | round trips |",
        "| --- | ---: |",
        f"| a turn (the timed one) | {trips['turn']} |",
        f"| the replay of an answered turn (its client_turn_id and message again) | {trips['replay']} |",
        "| a turn with the spend limits on (TURNS_PER_MINUTE, DAILY_TOKEN_BUDGET) | "
        f"{trips['turn with spend limits']} |",
        f"| its replay | {trips['replay with spend limits']} |",
        "",
        "The rest of the wall clock is the database (and waiting for a core). Where the time goes, from a second",
        f"pass of {args.turns:,} turns (other random users) with a timer around each function take_turn reaches:",
        "",
        "| part of the turn | p50 ms | p95 ms | p99 ms | mean ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        _row("whole turn (this pass)", summary(res["breakdown"]["wall"])),
    ]
    names = {"open": "open the turn (session, replay check, spend limits, the message, history)",
             "recall": "recall (profile + relationship)", "prompt": "prompt building",
             "persist": "persist (the reply, the session, the utterance)",
             "other": "other (Python in take_turn: logging, metadata, ...)"}
    for stage in ("open", "recall", "prompt", "persist", "other"):
        values = res["stages"].get(f"stage:{stage}")
        if values:
            lines.append(_row(names[stage], summary(values)))
    for key in sorted(k for k in res["stages"] if not k.startswith("stage:")):
        lines.append(_row(f"&nbsp;&nbsp;`{key}`", summary(res["stages"][key])))
    lines += ["", "Indented rows: each function's time summed per turn, nested calls included in their caller's. "
              "Every row's percentiles are of that row on its own, so they do not add up to the whole turn's.", ""]
    on, off = summary(res["lexical"]["on"]), summary(res["lexical"]["off"])
    lines += ["What recall's lexical part costs (issue 14): a third pass whose turns alternate between the "
              f"configured settings (RECALL_LEXICAL_WEIGHT={settings_weight()}) and the same with the weight 0, "
              f"{len(res['lexical']['on']):,} turns each, interleaved so both see the same load:", "",
              "| turns | p50 ms | p95 ms | p99 ms | mean ms | max ms |", "| --- | ---: | ---: | ---: | ---: | ---: |",
              _row("lexical part on", on), _row("lexical part off", off), "",
              f"Ratio on/off: p50 {on['p50'] / off['p50']:.2f}, p95 {on['p95'] / off['p95']:.2f}.", ""]
    if res["explains"]:
        lines += ["<details><summary>EXPLAIN (ANALYZE, BUFFERS) of the statements of one turn (same parameters, "
                  "right after the turn, rolled back: its writes find the turn stored)</summary>", ""]
        for sql, plan in res["explains"]:
            lines += ["```sql", sql, "```", "```", plan, "```", ""]
        lines += ["</details>", ""]
    return "\n".join(lines)


def settings_weight() -> float:
    from eros.config import settings

    return settings().recall.lexical_weight


def _row(label: str, s: dict[str, float], bold: bool = False) -> str:
    cells = [f"{s[k]:.2f}" for k in ("p50", "p95", "p99", "mean", "max")]
    if bold:
        cells = [f"**{c}**" for c in cells]
    return f"| {label} | " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with bench_environment():
        return _main(args, command_line(__file__, argv))


def _main(args: argparse.Namespace, command: str) -> int:
    from psycopg.conninfo import make_conninfo

    from eros.db import connect

    if not args.database_url:
        print(f"embedded Postgres in {args.pgdata} ...", flush=True)
    url = database(args.pgdata, url=args.database_url, name=database_name(args), fresh=args.fresh)
    if args.toast_tuple_target:  # before the load: it applies to rows written from now on
        with connect(url) as conn:
            target = int(args.toast_tuple_target)
            conn.execute(f"ALTER TABLE engine.companion_memories SET (toast_tuple_target = {target})")
    expected = expected_counts(args)
    with connect(url) as conn:
        have = seeded_counts(conn)
    load_secs = None
    if have != expected:
        print(f"loading {database_name(args)} (found {have or 'nothing'}) ...", flush=True)
        load_secs = load(url, args)
        with connect(url) as conn:
            have = seeded_counts(conn)
        if have != expected:
            raise SystemExit(f"load produced {have}, expected {expected}")
    else:
        print(f"reusing {database_name(args)}: {have}", flush=True)
        removed = forget_earlier_runs(url)
        if removed:
            print(f"  removed {removed:,} rows left by earlier runs", flush=True)

    if args.long_history:
        return long_history(url, args, command)
    if args.context:
        return context_turns(url, args, command)
    load_before = machine()["loadavg"]
    turn_url = url if args.synchronous_commit == "on" else make_conninfo(url, options="-c synchronous_commit=off")
    res = run_turns(turn_url, args)
    facts = data_facts(url)
    report = render(args, command, machine() | {"load_before": load_before}, facts, have, load_secs, res)
    print()
    print(report.split("<details>")[0])
    if write_results(args.output, report):
        print(f"written to {args.output}")
    forget_earlier_runs(url)  # leave the data set as loaded for the next run
    return 0


if __name__ == "__main__":
    sys.exit(main())
