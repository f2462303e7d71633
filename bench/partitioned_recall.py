"""Recall and the claim on the user tables hash-partitioned by user_id, against the same rows in one table
(issue 13, "Past one database": partitioning by hash of the user key, "with recall and claims still correct
and no slower").

    .venv/bin/python bench/partitioned_recall.py                  # 2,000 users x 100 memories, ~3-5 min on 2 cores
    .venv/bin/python bench/partitioned_recall.py --users 200 --queries 100 --sessions 2000 --out -   # a quick look

Two databases on one embedded Postgres 16 + pgvector (``--dir``, left running): ``one_table``, migrated by
``eros.migrate`` as production is, and ``partitioned``, migrated the same way and then converted by
tests/partitioning.py (the user tables PARTITION BY HASH (user_id), ``--partitions`` each, user_id in their keys:
docs/CAPACITY.md). Both are made afresh and dropped at the end. The rows are generated once, in one_table, by
bench/recall_latency.py's generator (100 rows per user: 60 profile, 40 relationship, clustered 512-d embeddings),
plus ``--sessions`` idle sessions spread over the same users, and copied to partitioned (binary COPY, ids
included): both hold the same rows.

Timed, interleaved so that the shared machine's load falls on both alike (each step runs on both databases back
to back; which goes first alternates):

* recall: ``eros.store.recall.candidates``, the turn's statement (both layers, the near-duplicates), as a turn
  calls it (2 x top_k, the default RecallKnobs), for random users, an embedding near one of their topics and a
  message with a word of their rows (the lexical part runs). Every pair of answers must be equal: ids, order,
  scores. A warm-up pass over every query's user first (warm-cache figures, as bench/recall_latency.py).
* the claim: ``eros.store.dreaming.claim`` with the sweeper's batch (``--batch``), one claimer, alternating
  between the databases until both backlogs are empty, ``--rounds`` times (the claims reset and the tables
  vacuumed between rounds). Every session must be claimed exactly once per round.

Plus EXPLAIN of the store's own recall and claim on the partitioned database: which partitions each reads.
Results go to stdout and to bench/results/partitioned_recall.md; text below its ``<!-- notes -->`` line is kept.
Exit status 1 if an answer differed or a claim missed or repeated a session.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import sys
import time
from typing import Any

import recall_latency
from _common import (
    RESULTS,
    bench_environment,
    command_line,
    describe_machine,
    git_commit,
    patched,
    postgres_version,
    start_postgres,
    summary,
    test_helpers_on_path,
    write_results,
)

RESULTS = RESULTS / "partitioned_recall.md"
NAMES = ("one_table", "partitioned")
COPIED = ("persona_instances", "chat_sessions", "companion_memories")  # in the order their keys need
IDLE = dt.timedelta(seconds=1800)
STALE = dt.timedelta(seconds=600)


def log(msg: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {msg}", flush=True)


# --- the databases ----------------------------------------------------------------------------------

def make_databases(server_url: str, prefix: str, partitions: int) -> dict[str, Any]:
    """The two databases' URLs on the server of ``server_url``, and what the conversion changed."""
    test_helpers_on_path()
    import partitioning

    plain, _ = partitioning.create_database(server_url, f"{prefix}_one_table", partitioned=False)
    hashed, conversion = partitioning.create_database(server_url, f"{prefix}_partitioned", partitions=partitions)
    return {"urls": {"one_table": plain, "partitioned": hashed}, "conversion": conversion}


def load(conns: dict[str, Any], users: int, sessions: int, noise: int) -> float:
    """The rows, generated in one_table and copied to partitioned; seconds it took."""
    started = time.perf_counter()
    source, target = conns["one_table"], conns["partitioned"]
    log(f"generating {users * recall_latency.ROWS_PER_USER:,} memories over {users:,} users")
    recall_latency.generate(source, users, noise)
    source.execute(
        "INSERT INTO engine.chat_sessions (user_id, instance_id, created_at, last_active_at)"
        " SELECT i.user_id, i.id, now() - interval '3 hours', now() - interval '2 hours' - g * interval '10 ms'"
        " FROM generate_series(1, %(n)s) AS g JOIN engine.persona_instances i ON i.user_id = 'u' || (g %% %(users)s)",
        {"n": sessions, "users": users})
    for table in COPIED:
        columns = ", ".join(r["attname"] for r in source.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped"
            " AND attgenerated = '' ORDER BY attnum", (f"engine.{table}",)))
        log(f"copying engine.{table} to partitioned")
        with source.cursor().copy(f"COPY engine.{table} ({columns}) TO STDOUT (FORMAT BINARY)") as out, \
                target.cursor().copy(f"COPY engine.{table} ({columns}) FROM STDIN (FORMAT BINARY)") as into:
            for block in out:
                into.write(block)
    for conn in conns.values():
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


def reset_claims(conns: dict[str, Any]) -> None:
    for conn in conns.values():
        conn.execute("UPDATE engine.chat_sessions SET extraction_claimed_at = NULL, extraction_attempts = 0,"
                     " extraction_retries = 0 WHERE extraction_claimed_at IS NOT NULL")
        conn.execute("VACUUM ANALYZE engine.chat_sessions")


# --- timing -----------------------------------------------------------------------------------------

class Switch:
    """Which database the store's ``connection()`` returns: the store modules' name for it is patched to
    this, so that one process can alternate statement by statement without reconnecting."""

    def __init__(self, conns: dict[str, Any]):
        self.conns = conns
        self.name = NAMES[0]

    def __call__(self) -> Any:
        return self.conns[self.name]


def order(step: int) -> tuple[str, ...]:
    return NAMES if step % 2 == 0 else NAMES[::-1]


def recall(q: dict, now: dt.datetime) -> list:
    """The turn's recall statement (``eros.recall`` asks for twice the prompt's rows, for hygiene), at ``now``."""
    from eros.config import RecallKnobs
    from eros.store import recall as recall_store

    p = RecallKnobs()
    return recall_store.candidates(p, q["user"], q["q"].to_list(), k=2 * p.top_k, cap=None,
                                   relationship_k=2 * p.relationship_top_k, instance_id=q["instance"],
                                   dedupe=p.dedupe_similarity, message=q["message"], now=now)


def time_recall(switch: Switch, queries: list[dict]) -> dict[str, Any]:
    # One "now" for every statement: the answers of the two databases are compared, and the recency decay
    # would otherwise move between the two calls.
    now = dt.datetime.now(dt.UTC)
    for name in NAMES:  # warm-up: every query's user read once on both
        switch.name = name
        for q in queries:
            recall(q, now)
    times: dict[str, list[float]] = {name: [] for name in NAMES}
    same = 0
    for step, q in enumerate(queries):
        answers = {}
        for name in order(step):
            switch.name = name
            t0 = time.perf_counter()
            answers[name] = recall(q, now)
            times[name].append(time.perf_counter() - t0)
        same += answers["one_table"] == answers["partitioned"] and bool(answers["one_table"])
    return {"times": times, "same": same}


def analyse(switch: Switch, queries: list[dict]) -> dict[str, dict[str, float]]:
    """Median planning and execution time (ms, EXPLAIN ANALYZE) of the recall statement on each database."""
    import partitioning

    now = dt.datetime.now(dt.UTC)
    found: dict[str, dict[str, list[float]]] = {name: {"planning": [], "execution": []} for name in NAMES}
    for step, q in enumerate(queries):
        for name in order(step):
            switch.name = name
            with partitioning.explaining(switch(), analyse=True):
                for part, ms in partitioning.timings(recall(q, now)).items():
                    found[name][part].append(ms)
    return {name: {part: statistics.median(values) for part, values in parts.items()} for name, parts in found.items()}


def time_claims(switch: Switch, batch: int, rounds: int) -> dict[str, Any]:
    from eros.store import dreaming as dreaming_store

    times: dict[str, list[float]] = {name: [] for name in NAMES}
    claimed: dict[str, list[int]] = {name: [] for name in NAMES}
    duplicates = {name: 0 for name in NAMES}
    for _ in range(rounds):
        reset_claims(switch.conns)
        now = dt.datetime.now(dt.UTC)
        seen: dict[str, set] = {name: set() for name in NAMES}
        done: set[str] = set()
        step = 0
        while len(done) < len(NAMES):
            for name in order(step):
                if name in done:
                    continue
                switch.name = name
                t0 = time.perf_counter()
                rows = dreaming_store.claim(idle_before=now - IDLE, stale_before=now - STALE, limit=batch, now=now)
                elapsed = time.perf_counter() - t0
                if not rows:
                    done.add(name)
                    continue
                times[name].append(elapsed)
                ids = {r["id"] for r in rows}
                duplicates[name] += len(rows) - len(ids - seen[name])
                seen[name] |= ids
            step += 1
        for name in NAMES:
            claimed[name].append(len(seen[name]))
    reset_claims(switch.conns)
    return {"times": times, "claimed": claimed, "duplicates": duplicates}


def explain(conn: Any, query: dict) -> dict[str, set[str]]:
    """The partitions the store's recall and claim statements read on the partitioned database."""
    import partitioning

    from eros.store import dreaming as dreaming_store

    now = dt.datetime.now(dt.UTC)
    with partitioning.explaining(conn):
        plan = recall(query, now)
        claim = dreaming_store.claim(idle_before=now - IDLE, stale_before=now - STALE, limit=200, now=now)
    return {"recall": partitioning.partitions_in(plan, "companion_memories"),
            "claim": partitioning.partitions_in(claim, "chat_sessions")}


# --- report -----------------------------------------------------------------------------------------

def _row(label: str, times: dict[str, list[float]]) -> str:
    a, b = summary(times["one_table"]), summary(times["partitioned"])
    return (f"| {label} | {a['p50']:.2f} | {a['p95']:.2f} | {b['p50']:.2f} | {b['p95']:.2f} | "
            f"**{b['p50'] / a['p50']:.2f}** | **{b['p95'] / a['p95']:.2f}** | {len(times['one_table']):,} |")


def render(args: argparse.Namespace, run: dict[str, Any], command: str) -> str:
    recall, claims, plans, analysed = run["recall"], run["claims"], run["plans"], run["analysed"]
    rate = {name: sum(claims["claimed"][name]) / sum(claims["times"][name]) for name in NAMES}
    changes = run["conversion"].changes
    lines = [
        "# Recall and the claim: hash partitions by user against one table", "",
        f"* **Command:** `{command}`",
        f"* **Date:** {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; code {git_commit()}",
        f"* **Machine:** {run['machine']}",
        f"* **Database:** PostgreSQL {run['versions']['postgres']} + pgvector {run['versions']['pgvector']}"
        + (f" (embedded, pgserver, `{args.dir}`)" if not args.database_url else " (`--database-url`'s server)")
        + f", two databases on one server: `one_table` (the migrations as they are) and `partitioned` (the same "
        f"migrations, then {', '.join(run['conversion'].tables)} PARTITION BY HASH (user_id), {args.partitions} "
        "partitions each: tests/partitioning.py). One connection to each, a Unix socket.",
        f"* **Data:** {args.users:,} users x {recall_latency.ROWS_PER_USER} memories = "
        f"{args.users * recall_latency.ROWS_PER_USER:,} rows ({recall_latency.PROFILE_PER_USER} profile, "
        f"{recall_latency.ROWS_PER_USER - recall_latency.PROFILE_PER_USER} relationship; bench/recall_latency.py's "
        f"generator) and {args.sessions:,} idle sessions, made in one_table and copied to partitioned: the same "
        f"rows, ids included. Loaded in {run['load_secs']:.0f} s.",
        f"* **Method:** {args.queries:,} recalls (`eros.store.recall.candidates` as a turn calls it: both layers, "
        "the default RecallKnobs, a message with a word of the user's rows) for random users, after a warm-up "
        f"pass; the claim (`eros.store.dreaming.claim`, batch {args.batch}, one claimer) until the backlog is "
        f"empty, {args.rounds} round(s). Each step runs on both databases back to back, which goes first "
        "alternating, so that the shared machine's load falls on both alike.", "",
        "| operation | one table p50 ms | one table p95 ms | partitioned p50 ms | partitioned p95 ms |"
        " p50 ratio (partitioned / one table) | p95 ratio | statements per database |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        _row("recall (`candidates`, both layers)", recall["times"]),
        _row(f"claim (batch {args.batch})", claims["times"]), "",
        f"* **Where a recall's time goes** (EXPLAIN ANALYZE of the same statement, median of {args.analysed}): "
        f"planning {analysed['one_table']['planning']:.2f} ms on one table, "
        f"{analysed['partitioned']['planning']:.2f} ms partitioned; execution "
        f"{analysed['one_table']['execution']:.2f} ms and {analysed['partitioned']['execution']:.2f} ms.",
        f"* **Same answers:** {recall['same']:,} of {args.queries:,} recalls returned the same rows in the same "
        "order with the same scores on both databases.",
        f"* **Claims:** {rate['one_table']:,.0f} sessions/s on one table, {rate['partitioned']:,.0f} partitioned "
        f"(one claimer); every round claimed {', '.join(f'{n:,}' for n in claims['claimed']['partitioned'])} of "
        f"{args.sessions:,} sessions partitioned and {', '.join(f'{n:,}' for n in claims['claimed']['one_table'])}"
        f" on one table; duplicates {claims['duplicates']['partitioned']} and {claims['duplicates']['one_table']}.",
        f"* **Partitions read** (EXPLAIN of the store's statements on `partitioned`): a recall statement reads "
        f"{len(plans['recall'])} of {args.partitions} partitions ({', '.join(sorted(plans['recall']))}, its "
        f"user's); the claim {len(plans['claim'])} of {args.partitions} (cross-user by design).",
        "* **What the conversion changed** (tests/partitioning.py):", "",
    ]
    lines += [f"  * {change}" for change in changes]
    return "\n".join(lines) + "\n"


def ok(args: argparse.Namespace, run: dict[str, Any]) -> bool:
    claims = run["claims"]
    return (run["recall"]["same"] == args.queries and len(run["plans"]["recall"]) == 1
            and all(n == args.sessions for name in NAMES for n in claims["claimed"][name])
            and not any(claims["duplicates"].values()))


# --- main -------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--sessions", type=int, default=20_000, help="idle sessions for the claim's backlog")
    parser.add_argument("--batch", type=int, default=200, help="the claim's LIMIT (the sweeper's default batch)")
    parser.add_argument("--rounds", type=int, default=3, help="times the backlog is claimed empty")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--analysed", type=int, default=50,
                        help="recalls run under EXPLAIN ANALYZE on both for the planning / execution split")
    parser.add_argument("--noise-vectors", type=int, default=recall_latency.NOISE,
                        help="noise vectors the rows are made from")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", default="/tmp/eros-bench-partitioned", help="the embedded Postgres's folder")
    parser.add_argument("--database-url", default="",
                        help="make the two databases on this server instead (the URL's own database is not touched;"
                             " the role must be allowed to create databases)")
    parser.add_argument("--out", default=str(RESULTS), help="markdown results file ('-' for none)")
    args = parser.parse_args(argv)
    with bench_environment(POWERTOOLS_LOG_LEVEL="WARNING"):
        return _main(args, command_line(__file__, argv))


def _main(args: argparse.Namespace, command: str) -> int:
    from eros.db import connect

    test_helpers_on_path()
    import partitioning

    server = args.database_url or start_postgres(args.dir).get_uri()
    made = make_databases(server, "partitioned_recall", args.partitions)
    run: dict[str, Any] = {"machine": describe_machine(), "conversion": made["conversion"],
                           "versions": postgres_version(made["urls"]["partitioned"])}
    try:
        conns = {name: connect(url) for name, url in made["urls"].items()}
        try:
            run["load_secs"] = load(conns, args.users, args.sessions, args.noise_vectors)
            queries = recall_latency.make_queries(conns["one_table"], args.users, args.queries, args.seed)
            rng = random.Random(args.seed)
            for q in queries:
                q["message"] = f"do you remember memory {q['user'][1:]}-{rng.randrange(recall_latency.ROWS_PER_USER)}?"
            switch = Switch(conns)
            from eros.store import claims
            from eros.store import recall as recall_store

            with patched((recall_store, "connection", switch), (claims, "connection", switch)):
                log(f"timing {args.queries:,} recalls on both databases, interleaved")
                run["recall"] = time_recall(switch, queries)
                log(f"timing the claim of {args.sessions:,} sessions, {args.rounds} round(s), interleaved")
                run["claims"] = time_claims(switch, args.batch, args.rounds)
                run["analysed"] = analyse(switch, queries[:args.analysed])
                switch.name = "partitioned"
                run["plans"] = explain(conns["partitioned"], queries[0])
        finally:
            for conn in conns.values():
                conn.close()
    finally:
        for name in NAMES:
            partitioning.drop_database(server, f"partitioned_recall_{name}")
    report = render(args, run, command)
    print()
    print(report)
    write_results(args.out, report)
    return 0 if ok(args, run) else 1


if __name__ == "__main__":
    sys.exit(main())
