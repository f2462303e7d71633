"""Recall latency at scale: 1,000,000 memory rows over 10,000 users.

Measures, in one run against its own embedded Postgres 16 + pgvector (no Docker, no network):

1. The real recall use-case (``eros.recall.recall``: profile + relationship layer, one SQL
   round trip each, plus hygiene) for every strategy: p50 / p95 / max.
2. The exact per-user nearest-neighbour query (what recall does: the user's rows through the
   per-user index, distances computed for all of them) side by side with the approximate-index
   query that vector stores commonly run -- an IVFFlat or HNSW index over all users' rows, the
   user filter applied to what the index returns -- for latency and quality: how often the index
   query returns fewer than K rows, and how many of its rows are not in the true top-K.

Data: each user has 100 rows (60 profile in the five categories, 40 relationship rows with one
persona instance). Embeddings are clustered, not uniform noise, so that nearest neighbours mean
something: 256 topic vectors; each user talks about 8 topics; a row is its topic plus two noise
vectors (cosine ~0.6 to rows of the same topic, ~0 to others). Generated in SQL with
``INSERT ... SELECT`` from small tables of random vectors (pgvector's vector + vector), no
client-side data. Queries: a random user, one of their topics, fresh noise.

The database folder is kept (``cleanup_mode=None``): a second run with the same size reuses the
data; ``--fresh`` regenerates. The HNSW build over 512-d rows is slow on 2 cores: it is
time-boxed (``--hnsw-timeout``), and falls back to ``--hnsw-fallback-users`` users' rows in a
separate table when the full build does not finish in time (the results say which ran).

Run (about 30-60 min on 2 cores, most of it index builds):

    .venv/bin/python bench/recall_latency.py --out bench/results/recall_latency.md

At 10,000,000 rows (100,000 users; ~29 GB, more than this machine's page cache), recall and the exact query
only, since the index builds would take hours here:

    .venv/bin/python bench/recall_latency.py --users 100000 --exact-only --large-user-rows 100000 \
        --dir /tmp/eros-bench-recall-10m --out bench/results/recall_latency_10m.md

``--large-user-rows 100000`` adds one user with a very large memory beside the others and times recall for
them: what the exact per-user scan costs where an approximate index would start to pay.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import UTC, datetime

import psycopg
from _common import (
    EMPTY_ENGINE,
    add_database_url_option,
    bench_environment,
    command_line,
    database,
    percentile,
    use_database,
    write_results,
)
from pgvector import Vector

DIM = 512
TOPICS = 256
NOISE = 4096
TOPICS_PER_USER = 8
PROFILE_PER_USER = 60
ROWS_PER_USER = 100
LARGE_USER = "u-large"  # --large-user-rows: one user with a very large memory, beside the others
NOISE_SCALE = 0.6


def log(msg: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {msg}", flush=True)


def ms(values: list[float]) -> str:
    """p50 | p95 | max in milliseconds."""
    s = sorted(values)
    return f"{percentile(s, 0.50) * 1000:.2f} | {percentile(s, 0.95) * 1000:.2f} | {s[-1] * 1000:.2f}"


# --- data ---------------------------------------------------------------------------------------

def generate(conn, users: int, noise: int = NOISE, batch_users: int = 500) -> None:
    conn.execute(EMPTY_ENGINE)
    conn.execute("DROP TABLE IF EXISTS bench_topics, bench_noise")
    # Random vectors, one aggregate per vector id (GROUP BY keeps random() per element).
    conn.execute("CREATE UNLOGGED TABLE bench_topics AS SELECT i AS id,"
                 f" array_agg((random() - 0.5)::real ORDER BY d)::vector({DIM}) AS v"
                 f" FROM generate_series(0, {TOPICS - 1}) i, generate_series(1, {DIM}) d GROUP BY i")
    conn.execute("CREATE UNLOGGED TABLE bench_noise AS SELECT i AS id,"
                 f" array_agg(((random() - 0.5) * {NOISE_SCALE})::real ORDER BY d)::vector({DIM}) AS v"
                 f" FROM generate_series(0, {noise - 1}) i, generate_series(1, {DIM}) d GROUP BY i")
    conn.execute("ALTER TABLE bench_topics ADD PRIMARY KEY (id)")
    conn.execute("ALTER TABLE bench_noise ADD PRIMARY KEY (id)")
    conn.execute("INSERT INTO engine.persona_instances (user_id, persona_id)"
                 " SELECT 'u' || u, (SELECT id FROM engine.personas ORDER BY id LIMIT 1)"
                 " FROM generate_series(0, %s) u", (users - 1,))
    started = time.perf_counter()
    for first in range(0, users, batch_users):
        last = min(users, first + batch_users) - 1
        conn.execute(
            # Keys are drawn in a subquery (volatile random() keeps it from being flattened),
            # then joined to the vector tables: one row = topic + two noise vectors.
            "INSERT INTO engine.companion_memories"
            " (user_id, instance_id, content, embedding, category, importance, created_at)"
            " SELECT 'u' || k.u, CASE WHEN k.j >= %(profile)s THEN i.id END, 'memory ' || k.u || '-' || k.j,"
            "        t.v + a.v + b.v,"
            "        CASE WHEN k.j < %(profile)s THEN"
            "             (ARRAY['fact','preference','event','emotion','relation'])[1 + k.j %% 5] END,"
            "        CASE WHEN k.r < 0.1 THEN NULL ELSE k.imp END, now() - k.age * interval '365 days'"
            " FROM (SELECT u, j, (u * 7 + (j %% %(tpu)s) * 37) %% %(topics)s AS topic,"
            "              floor(random() * %(noise)s)::int AS na, floor(random() * %(noise)s)::int AS nb,"
            "              random() AS r, random()::real AS imp, random() AS age"
            "       FROM generate_series(%(first)s::int, %(last)s::int) u,"
            "            generate_series(0, %(per_user)s::int - 1) j) k"
            " JOIN engine.persona_instances i ON i.user_id = 'u' || k.u"
            " JOIN bench_topics t ON t.id = k.topic"
            " JOIN bench_noise a ON a.id = k.na JOIN bench_noise b ON b.id = k.nb",
            {"profile": PROFILE_PER_USER, "tpu": TOPICS_PER_USER, "topics": TOPICS, "noise": noise,
             "first": first, "last": last, "per_user": ROWS_PER_USER})
        if (last + 1) % (batch_users * 4) == 0 or last == users - 1:
            rate = (last + 1) * ROWS_PER_USER / (time.perf_counter() - started)
            log(f"  {(last + 1) * ROWS_PER_USER:,} rows ({rate:,.0f} rows/s)")
    conn.execute("VACUUM ANALYZE engine.companion_memories")


def large_user(conn, rows: int) -> None:
    """LARGE_USER with ``rows`` profile rows made like every user's (8 topics, two noise vectors each), and a
    persona instance; rewritten when the count differs."""
    have = conn.execute("SELECT count(*) AS n FROM engine.companion_memories WHERE user_id = %s",
                        (LARGE_USER,)).fetchone()["n"]
    if have == rows:
        return
    log(f"adding {LARGE_USER} with {rows:,} profile rows")
    conn.execute("DELETE FROM engine.companion_memories WHERE user_id = %s", (LARGE_USER,))
    conn.execute("DELETE FROM engine.persona_instances WHERE user_id = %s", (LARGE_USER,))
    conn.execute("INSERT INTO engine.persona_instances (user_id, persona_id)"
                 " SELECT %s, (SELECT id FROM engine.personas ORDER BY id LIMIT 1)", (LARGE_USER,))
    noise = conn.execute("SELECT count(*) AS n FROM bench_noise").fetchone()["n"]
    conn.execute(
        "INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance, created_at)"
        " SELECT %(user)s, 'memory large-' || k.j, t.v + a.v + b.v,"
        "        (ARRAY['fact','preference','event','emotion','relation'])[1 + k.j %% 5], k.imp,"
        "        now() - k.age * interval '365 days'"
        " FROM (SELECT j, ((j %% %(tpu)s) * 37) %% %(topics)s AS topic, floor(random() * %(noise)s)::int AS na,"
        "              floor(random() * %(noise)s)::int AS nb, random()::real AS imp, random() AS age"
        "       FROM generate_series(0, %(rows)s - 1) j) k"
        " JOIN bench_topics t ON t.id = k.topic JOIN bench_noise a ON a.id = k.na JOIN bench_noise b ON b.id = k.nb",
        {"user": LARGE_USER, "tpu": TOPICS_PER_USER, "topics": TOPICS, "noise": noise, "rows": rows})
    conn.execute("ANALYZE engine.companion_memories")  # not VACUUM: at 10M rows it would rescan 27 GB


def large_user_queries(conn, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    noise = conn.execute("SELECT count(*) AS n FROM bench_noise").fetchone()["n"]
    instance = conn.execute("SELECT id FROM engine.persona_instances WHERE user_id = %s", (LARGE_USER,)).fetchone()
    return [query(conn, rng, noise, LARGE_USER, instance["id"], 0) for _ in range(n)]


def time_large_user(conn, rows: int, n: int, seed: int, k: int) -> dict[str, list[float]]:
    """Recall (each strategy) and the exact top-K for LARGE_USER, warm: what one very large memory costs."""
    from eros import recall

    queries = large_user_queries(conn, n, seed)
    out: dict[str, list[float]] = {}
    for strategy in ("grouped", "recency", "composite"):
        params = recall.RecallKnobs(strategy=strategy, top_k=k)
        timed_recalls(queries[:1], params)  # warm
        out[f"recall, {strategy}"] = times = timed_recalls(queries, params)
        log(f"  {LARGE_USER} {strategy}: {ms(times)} ms")
    _, exact = exact_truth(conn, queries, k, "engine.companion_memories")
    out["exact per-user top-K (profile layer)"] = exact
    log(f"  {LARGE_USER} exact: {ms(exact)} ms")
    return out


def make_queries(conn, users: int, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    noise = conn.execute("SELECT count(*) AS n FROM bench_noise").fetchone()["n"]
    queries = []
    for _ in range(n):
        u = rng.randrange(users)
        instance = conn.execute("SELECT id FROM engine.persona_instances WHERE user_id = %s",
                                (f"u{u}",)).fetchone()
        queries.append(query(conn, rng, noise, f"u{u}", instance["id"], u))
    return queries


def query(conn, rng: random.Random, noise: int, user: str, instance, u: int) -> dict:
    """A query for user number ``u``: one of their topics (as ``generate`` assigns them) plus fresh noise."""
    topic = (u * 7 + rng.randrange(TOPICS_PER_USER) * 37) % TOPICS
    row = conn.execute("SELECT (t.v + a.v + b.v)::text AS v FROM bench_topics t, bench_noise a, bench_noise b"
                       " WHERE t.id = %s AND a.id = %s AND b.id = %s",
                       (topic, rng.randrange(noise), rng.randrange(noise))).fetchone()
    return {"user": user, "instance": instance, "q": Vector.from_text(row["v"])}


# --- measurements -------------------------------------------------------------------------------

def timed_recalls(queries: list[dict], params) -> list[float]:
    """Seconds of ``eros.recall.recall`` for each query, in order."""
    from eros import recall

    times = []
    for q in queries:
        t0 = time.perf_counter()
        recall.recall(q["user"], q["instance"], q["q"].to_list(), knobs=params)
        times.append(time.perf_counter() - t0)
    return times


def time_strategies(queries: list[dict], k: int) -> dict[str, list[float]]:
    from eros import recall

    out: dict[str, list[float]] = {}
    # Warm-up: one pass over every query's user, so that no strategy pays for reading the users'
    # rows into the cache first (warm-cache figures; a cold user costs a few ms of I/O more).
    first = timed_recalls(queries, recall.RecallKnobs(strategy="grouped"))
    out["grouped, each user's first read (rows not yet in the cache, or some of them)"] = first
    log(f"  first reads: p50/p95/max {ms(first)} ms")
    for strategy in ("grouped", "recency", "composite"):
        params = recall.RecallKnobs(strategy=strategy, top_k=k)
        timed_recalls(queries[:20], params)
        out[strategy] = times = timed_recalls(queries, params)
        log(f"  {strategy}: p50/p95/max {ms(times)} ms")
    return out


EXACT = ("SELECT id FROM {table} WHERE user_id = %s AND instance_id IS NULL"
         " ORDER BY embedding <=> %s, id LIMIT %s")
# `user_id || ''` hides the filter from the per-user btree index: the planner must take the ANN
# index (seq scans are disabled) and apply the user filter to the rows the index returns -- the
# plan of a vector store with one ANN index over every user's rows.
APPROX = ("SELECT id FROM {table} WHERE user_id || '' = %s AND instance_id IS NULL"
          " ORDER BY embedding <=> %s LIMIT %s")


def exact_truth(conn, queries, k, table) -> tuple[list[list], list[float]]:
    truth, times = [], []
    for q in queries:
        t0 = time.perf_counter()
        rows = conn.execute(EXACT.format(table=table), (q["user"], q["q"], k)).fetchall()
        times.append(time.perf_counter() - t0)
        truth.append([r["id"] for r in rows])
    return truth, times


def approx(conn, queries, k, table, truth) -> dict:
    times, short, wrong_rows, total_missing = [], 0, 0, 0
    conn.execute("SET enable_seqscan = off")
    for q, true_ids in zip(queries, truth, strict=True):
        t0 = time.perf_counter()
        rows = conn.execute(APPROX.format(table=table), (q["user"], q["q"], k)).fetchall()
        times.append(time.perf_counter() - t0)
        got = [r["id"] for r in rows]
        short += len(got) < min(k, len(true_ids))
        wrong_rows += len(set(got) - set(true_ids))
        total_missing += len(set(true_ids) - set(got))
    conn.execute("RESET enable_seqscan")
    n = len(queries)
    return {"times": times, "short": short / n, "missing_per_query": total_missing / n,
            "wrong_per_query": wrong_rows / n,
            "recall": 1 - total_missing / max(1, sum(len(t) for t in truth))}


def plan_uses(conn, table: str, query: dict, k: int, index: str) -> bool:
    conn.execute("SET enable_seqscan = off")
    plan = "\n".join(r["QUERY PLAN"] for r in conn.execute(
        "EXPLAIN " + APPROX.format(table=table), (query["user"], query["q"], k)).fetchall())
    conn.execute("RESET enable_seqscan")
    return index in plan


def build_index(conn, sql: str, timeout_s: int) -> float | None:
    conn.execute(f"SET statement_timeout = '{timeout_s}s'")
    t0 = time.perf_counter()
    try:
        conn.execute(sql)
    except psycopg.errors.QueryCanceled:
        return None
    finally:
        conn.execute("RESET statement_timeout")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--dir", default="/tmp/eros-bench-recall")
    ap.add_argument("--fresh", action="store_true", help="regenerate the data even if it is there")
    ap.add_argument("--maintenance-work-mem", default="6GB")
    ap.add_argument("--ivf-probes", default="1,10,40")
    ap.add_argument("--hnsw-ef", default="40,200,1000")
    ap.add_argument("--hnsw-timeout", type=int, default=2400, help="seconds for the full HNSW build")
    ap.add_argument("--hnsw-fallback-users", type=int, default=1000)
    ap.add_argument("--skip-hnsw", action="store_true")
    ap.add_argument("--large-user-rows", type=int, default=0,
                    help="add one more user with this many profile rows (e.g. 100000) and time recall for them")
    ap.add_argument("--exact-only", action="store_true",
                    help="no approximate indexes (IVFFlat, HNSW): recall and the exact query only, for sizes whose "
                         "index builds would take hours here")
    ap.add_argument("--out", default=None, help="write the markdown results here")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--noise-vectors", type=int, default=NOISE, help="noise vectors the rows are made from")
    add_database_url_option(ap)
    args = ap.parse_args(argv)
    with bench_environment():
        _main(args, command_line(__file__, argv))
    return 0


def _main(args: argparse.Namespace, command: str) -> None:
    from eros.db import connect

    dsn = database(args.dir, url=args.database_url, name="recall_bench")
    use_database(dsn)
    with connect(dsn) as conn:
        _measure(args, command, conn)


def _measure(args: argparse.Namespace, command: str, conn) -> None:
    rows_wanted = args.users * ROWS_PER_USER
    have = conn.execute("SELECT count(*) AS n FROM engine.companion_memories WHERE user_id <> %s",
                        (LARGE_USER,)).fetchone()["n"]
    t_gen = None
    if args.fresh or have != rows_wanted:
        log(f"generating {rows_wanted:,} rows over {args.users:,} users")
        t0 = time.perf_counter()
        generate(conn, args.users, args.noise_vectors)
        t_gen = time.perf_counter() - t0
        log(f"generated in {t_gen:.0f} s")
    else:
        log(f"reusing {have:,} rows")
    for name in ("bench_ivfflat", "bench_hnsw"):
        conn.execute(f"DROP INDEX IF EXISTS engine.{name}")
    if args.large_user_rows:
        large_user(conn, args.large_user_rows)
    size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('engine.companion_memories')) AS s"
                        ).fetchone()["s"]
    queries = make_queries(conn, args.users, args.queries, args.seed)
    k = args.k

    log("recall use-case per strategy (exact per-user SQL)")
    strategies = time_strategies(queries, k)

    log("exact per-user top-K (profile layer)")
    exact_truth(conn, queries[:20], k, "engine.companion_memories")  # warm
    truth, exact_times = exact_truth(conn, queries, k, "engine.companion_memories")
    log(f"  exact: {ms(exact_times)} ms")
    large = time_large_user(conn, args.large_user_rows, 50, args.seed + 2, k) if args.large_user_rows else {}

    conn.execute(f"SET maintenance_work_mem = '{args.maintenance_work_mem}'")
    conn.execute("SET max_parallel_maintenance_workers = 1")  # 2 cores: leader + 1 worker
    approx_rows: list[tuple[str, str, dict]] = []
    builds: list[str] = []

    profile_rows = args.users * PROFILE_PER_USER
    hnsw_note = ""
    if not args.exact_only:
        hnsw_note = _approximate(args, conn, queries, truth, k, profile_rows, approx_rows, builds)
    _report(args, command, conn, rows_wanted, size, t_gen, k, strategies, exact_times, profile_rows, approx_rows,
            builds, hnsw_note, large)


def _approximate(args, conn, queries, truth, k, profile_rows, approx_rows, builds) -> str:
    """IVFFlat and HNSW over every user's profile rows, with the user filter: their latency and what they miss."""
    lists = max(10, int(profile_rows ** 0.5))
    log(f"building IVFFlat (lists={lists}) over {profile_rows:,} profile rows")
    t_ivf = build_index(conn, "CREATE INDEX bench_ivfflat ON engine.companion_memories"
                        f" USING ivfflat (embedding vector_cosine_ops) WITH (lists = {lists})"
                        " WHERE instance_id IS NULL", 7200)
    builds.append(f"IVFFlat, lists={lists}, {profile_rows:,} rows: {t_ivf:.0f} s")
    log(f"  built in {t_ivf:.0f} s")
    assert plan_uses(conn, "engine.companion_memories", queries[0], k, "bench_ivfflat"), "IVFFlat not used"
    for probes in [int(p) for p in args.ivf_probes.split(",")]:
        conn.execute(f"SET ivfflat.probes = {probes}")
        approx(conn, queries[:10], k, "engine.companion_memories", truth[:10])
        r = approx(conn, queries, k, "engine.companion_memories", truth)
        approx_rows.append((f"IVFFlat probes={probes}", f"{profile_rows:,}", r))
        log(f"  probes={probes}: {ms(r['times'])} ms, short {r['short']:.0%}, recall {r['recall']:.1%}")
    conn.execute("RESET ivfflat.probes")
    conn.execute("DROP INDEX engine.bench_ivfflat")

    hnsw_note = ""
    if not args.skip_hnsw:
        log(f"building HNSW (m=16, ef_construction=64) over {profile_rows:,} rows, time box {args.hnsw_timeout} s")
        t_hnsw = build_index(conn, "CREATE INDEX bench_hnsw ON engine.companion_memories"
                             " USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
                             " WHERE instance_id IS NULL", args.hnsw_timeout)
        table, hnsw_q, hnsw_truth, hnsw_rows = "engine.companion_memories", queries, truth, profile_rows
        if t_hnsw is None:
            # The full build did not finish: the same measurement over a smaller copy.
            hnsw_note = (f"The HNSW build over {profile_rows:,} rows did not finish within {args.hnsw_timeout} s "
                         f"on this 2-core machine; the HNSW column ran on the first {args.hnsw_fallback_users:,} "
                         f"users' profile rows in a separate table instead.")
            log("  " + hnsw_note)
            builds.append(f"HNSW over {profile_rows:,} rows: not finished in {args.hnsw_timeout} s (cancelled)")
            conn.execute("DROP TABLE IF EXISTS bench_small")
            conn.execute("CREATE TABLE bench_small AS SELECT * FROM engine.companion_memories"
                         " WHERE instance_id IS NULL AND substr(user_id, 2)::int < %s", (args.hnsw_fallback_users,))
            conn.execute("CREATE INDEX ON bench_small (user_id) WHERE instance_id IS NULL")
            conn.execute("ANALYZE bench_small")
            table = "bench_small"
            hnsw_rows = args.hnsw_fallback_users * PROFILE_PER_USER
            hnsw_q = make_queries(conn, args.hnsw_fallback_users, args.queries, args.seed + 1)
            hnsw_truth, _ = exact_truth(conn, hnsw_q, k, table)
            t_hnsw = build_index(conn, "CREATE INDEX bench_hnsw ON bench_small USING hnsw"
                                 " (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)", 7200)
        builds.append(f"HNSW m=16 ef_construction=64, {hnsw_rows:,} rows: {t_hnsw:.0f} s")
        log(f"  built in {t_hnsw:.0f} s")
        assert plan_uses(conn, table, hnsw_q[0], k, "bench_hnsw"), "HNSW not used"
        for ef in [int(e) for e in args.hnsw_ef.split(",")]:
            conn.execute(f"SET hnsw.ef_search = {ef}")
            approx(conn, hnsw_q[:10], k, table, hnsw_truth[:10])
            r = approx(conn, hnsw_q, k, table, hnsw_truth)
            approx_rows.append((f"HNSW ef_search={ef}", f"{hnsw_rows:,}", r))
            log(f"  ef_search={ef}: {ms(r['times'])} ms, short {r['short']:.0%}, recall {r['recall']:.1%}")
        conn.execute("RESET hnsw.ef_search")
        conn.execute("DROP INDEX IF EXISTS engine.bench_hnsw")  # the table as recall sees it, for whatever runs next
    return hnsw_note


def _report(args, command, conn, rows_wanted, size, t_gen, k, strategies, exact_times, profile_rows, approx_rows,
            builds, hnsw_note, large) -> None:
    lines: list[str] = []
    pg_version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()["extversion"]
    lines += [
        "# Recall latency: 1,000,000 memory rows over 10,000 users" if rows_wanted == 1_000_000
        else f"# Recall latency: {rows_wanted:,} memory rows over {args.users:,} users",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on this project's 2-core machine (shared with other "
        f"work), embedded PostgreSQL 16 + pgvector {pg_version} (pgserver, default settings), client over a Unix "
        f"socket. {rows_wanted:,} rows ({args.users:,} users x {ROWS_PER_USER}: {PROFILE_PER_USER} profile + "
        f"{ROWS_PER_USER - PROFILE_PER_USER} relationship), 512-d clustered embeddings, table + indexes "
        f"{size}. {args.queries} queries (random users), K = {k}."
        + (f" Data generated in {t_gen:.0f} s." if t_gen else ""),
        "",
        "Command:",
        "",
        "    " + command,
        "",
        "## Recall use-case per strategy",
        "",
        "`eros.recall.recall()`: profile + relationship layer (one exact per-user SQL statement each) and hygiene;"
        " warm cache (every query's user read once before timing).",
        "",
        "| strategy | p50 ms | p95 ms | max ms |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {name} | {ms(times)} |" for name, times in strategies.items()]
    lines += [
        "",
        "## Exact per-user query vs approximate ANN index with the user filter",
        "",
        f"Profile layer, top {k} by cosine distance for one user. *short*: share of queries that got fewer than "
        f"{k} rows; *missing*: true top-{k} rows absent, per query; *wrong*: returned rows not in the true "
        f"top-{k}, per query; *recall*: share of the true top-{k} returned.",
        "",
        "| query | rows indexed | p50 ms | p95 ms | max ms | short | missing / query | wrong / query | recall |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| exact per-user (btree on user_id, all the user's rows) | {profile_rows:,} | {ms(exact_times)} "
        f"| 0% | 0 | 0 | 100% |",
    ]
    for name, n_rows, r in approx_rows:
        lines.append(f"| {name} | {n_rows} | {ms(r['times'])} | {r['short']:.0%} | {r['missing_per_query']:.2f} "
                     f"| {r['wrong_per_query']:.2f} | {r['recall']:.1%} |")
    if large:
        lines += ["", f"## One user with a very large memory: {args.large_user_rows:,} profile rows", "",
                  f"`{LARGE_USER}`, beside the other users, made like them; 50 queries on their topics, warm. The "
                  "exact per-user scan reads every one of the user's rows.", "",
                  "| query | p50 ms | p95 ms | max ms |", "| --- | --- | --- | --- |"]
        lines += [f"| {name} | {ms(times)} |" for name, times in large.items()]
    if builds:
        lines += ["", "Index builds (maintenance_work_mem "
                  f"{args.maintenance_work_mem}, 1 parallel maintenance worker):", ""]
        lines += [f"- {b}" for b in builds]
    else:
        lines += ["", "No approximate index was built (`--exact-only`)."]
    if hnsw_note:
        lines += ["", hnsw_note]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_results(args.out, text, notes=False)
        log(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
