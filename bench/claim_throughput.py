"""Claim throughput: concurrent sweepers claiming a backlog of idle sessions with the SPEC's single
``UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED) RETURNING`` statement.

    .venv/bin/python bench/claim_throughput.py                          # 1, 4, 16 claimers, batch 200
    .venv/bin/python bench/claim_throughput.py --batch 50,200,1000      # compare batch sizes
    .venv/bin/python bench/claim_throughput.py --sessions 10000 --repeat 1   # a quick check

Every claimer is a thread (``--mode process`` for processes) with its own database connection that
calls the real ``eros.store.dreaming.claim`` in a loop until a claim comes back empty. All claimers
start together (a barrier); the clock stops when the last one is done. Reported: sessions/s over the
whole backlog, claim statements, and the checks that matter more than speed: **duplicates** (a
session returned to two claims; must be 0) and **missing** (a session nobody claimed; must be 0).

Postgres 16 + pgvector is embedded, in its own folder (``/tmp/eros-bench-claim`` by default), and
left running for re-runs. The backlog (``--sessions`` idle sessions spread over 1,000 users) is
loaded once with INSERT … SELECT generate_series and reused; between runs the claims are reset
(``UPDATE … SET extraction_claimed_at = NULL``) and the table vacuumed, so each run starts from
the same state. Results go to stdout and to ``bench/results/claim_throughput.md``; anything below the
``<!-- notes -->`` line of that file is hand-written analysis and is kept across runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import statistics
import sys
import threading
import time
from typing import Any

from _common import (
    RESULTS,
    add_database_url_option,
    bench_environment,
    command_line,
    database,
    describe_machine,
    one,
    postgres_version,
    use_database,
    write_results,
)

RESULTS = RESULTS / "claim_throughput.md"
USER_PREFIX = "bench-claim-"
GOAL = 5000  # sessions/s at 16 claimers
IDLE = dt.timedelta(seconds=1800)
STALE = dt.timedelta(seconds=600)


# --- database ---------------------------------------------------------------------------------------

def load_backlog(url: str, sessions: int) -> None:
    """``sessions`` idle, unextracted bench sessions (reused when the count already matches)."""
    from eros.db import connect

    with connect(url, vector=False) as conn:
        have = one(conn.execute("SELECT count(*) AS n FROM engine.chat_sessions WHERE user_id LIKE %s",
                                (USER_PREFIX + "%",)))["n"]
        if have == sessions:
            return
        print(f"loading {sessions:,} idle sessions ...", flush=True)
        started = time.monotonic()
        conn.execute("DELETE FROM engine.chat_sessions WHERE user_id LIKE %s", (USER_PREFIX + "%",))
        conn.execute(
            "INSERT INTO engine.persona_instances (user_id, persona_id)"
            " SELECT %s || g, 'luna' FROM generate_series(0, 999) AS g ON CONFLICT DO NOTHING",
            (USER_PREFIX,))
        conn.execute(
            "INSERT INTO engine.chat_sessions (user_id, instance_id, created_at, last_active_at)"
            " SELECT i.user_id, i.id, now() - interval '3 hours', now() - interval '2 hours' - g * interval '10 ms'"
            " FROM generate_series(1, %(n)s) AS g"
            " JOIN engine.persona_instances i ON i.user_id = %(prefix)s || (g %% 1000) AND i.persona_id = 'luna'",
            {"n": sessions, "prefix": USER_PREFIX})
        conn.execute("VACUUM ANALYZE engine.chat_sessions")
        print(f"loaded in {time.monotonic() - started:.1f} s", flush=True)


def reset_claims(url: str) -> None:
    from eros.db import connect

    with connect(url, vector=False) as conn:
        conn.execute("UPDATE engine.chat_sessions SET extraction_claimed_at = NULL, extraction_attempts = 0,"
                     " extracted_at = NULL WHERE user_id LIKE %s"
                     " AND (extraction_claimed_at IS NOT NULL OR extracted_at IS NOT NULL)",
                     (USER_PREFIX + "%",))
        conn.execute("VACUUM ANALYZE engine.chat_sessions")


# --- claimers ---------------------------------------------------------------------------------------

def claimer(batch: int, now: dt.datetime, start, out) -> None:
    """Claim until a claim comes back empty; report (ids, statements, seconds in claim calls), or the
    error that stopped it (and break the start line, so that nobody waits for a claimer that is gone)."""
    from eros import db
    from eros.store import dreaming as store

    try:
        db.connection()  # connect before the start line
        ids: list[bytes] = []
        statements, busy = 0, 0.0
        start.wait()
        while True:
            t0 = time.perf_counter()
            rows = store.claim(idle_before=now - IDLE, stale_before=now - STALE, limit=batch)
            busy += time.perf_counter() - t0
            statements += 1
            if not rows:
                break
            ids.extend(r["id"].bytes for r in rows)
    except BaseException as exc:
        start.abort()
        out.put(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        db.reset()
    out.put((ids, statements, busy))


def run_once(url: str, claimers: int, batch: int, mode: str) -> dict:
    use_database(url)
    now = dt.datetime.now(dt.UTC)
    start: Any  # a barrier and a queue of threads or of processes
    out: Any
    workers: list[Any]
    if mode == "thread":
        import queue

        start, out = threading.Barrier(claimers + 1), queue.Queue()
        workers = [threading.Thread(target=claimer, args=(batch, now, start, out)) for _ in range(claimers)]
    else:
        ctx = multiprocessing.get_context("fork")
        start, out = ctx.Barrier(claimers + 1), ctx.Queue()
        workers = [ctx.Process(target=claimer, args=(batch, now, start, out)) for _ in range(claimers)]
    for w in workers:
        w.start()
    try:
        start.wait()
    except threading.BrokenBarrierError:
        pass  # a claimer failed before the start: its error is in the queue
    t0 = time.perf_counter()
    reports = [out.get() for _ in workers]  # drained before join: a full pipe would block a process
    elapsed = time.perf_counter() - t0
    for w in workers:
        w.join()
    errors = [r for r in reports if isinstance(r, str)]
    if errors:
        raise RuntimeError(f"{len(errors)} claimer(s) failed: {errors[0]}")
    claimed = [i for ids, _, _ in reports for i in ids]
    unique = set(claimed)
    statements = sum(s for _, s, _ in reports)
    return {"claimers": claimers, "batch": batch, "mode": mode, "elapsed": elapsed, "rate": len(claimed) / elapsed,
            "claimed": len(claimed), "duplicates": len(claimed) - len(unique), "statements": statements,
            "per_statement_ms": 1000 * sum(b for _, _, b in reports) / statements,
            "busy_workers": sum(1 for ids, _, _ in reports if ids)}


# --- report -----------------------------------------------------------------------------------------

def render(args, results: list[dict], mach: str, pg: str, command: str) -> str:
    rows = []
    keys = sorted({(r["mode"], r["claimers"], r["batch"]) for r in results}, key=lambda k: (k[0] != "process", k[1:]))
    for mode, claimers, batch in keys:
        runs = [r for r in results if (r["mode"], r["claimers"], r["batch"]) == (mode, claimers, batch)]
        rates = [r["rate"] for r in runs]
        rows.append({"mode": mode, "claimers": claimers, "batch": batch, "median": statistics.median(rates),
                     "best": max(rates), "runs": len(runs), "dups": sum(r["duplicates"] for r in runs),
                     "missing": sum(args.sessions - (r["claimed"] - r["duplicates"]) for r in runs),
                     "statements": statistics.median(r["statements"] for r in runs),
                     "ms": statistics.median(r["per_statement_ms"] for r in runs),
                     "busy": min(r["busy_workers"] for r in runs)})
    lines = [
        "# Claim throughput", "",
        f"* **Command:** `{command}`",
        f"* **Date:** {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"* **Machine:** {mach}",
        f"* **Database:** embedded PostgreSQL {pg} (pgserver, `{args.pgdata}`), one connection per claimer"
        if not args.database_url else f"* **Database:** PostgreSQL {pg} (`--database-url`), one connection per claimer",
        f"* **Backlog:** {args.sessions:,} idle unextracted sessions (1,000 users). Each claimer (a process, "
        "like a separate sweeper Lambda, or a thread) calls `eros.store.dreaming.claim` until a claim comes "
        f"back empty; claims are reset and the table vacuumed between runs; {args.repeat} run(s) per row.",
        f"* **Goal:** ≥ {GOAL:,} sessions/s at 16 claimers, 0 duplicates, 0 missing", "",
        "| claimers | batch (LIMIT) | sessions/s (median) | sessions/s (best) | runs | duplicates | missing |"
        " claim statements | ms per claim statement (mean; median of runs) | claimers that got work (min) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['claimers']} {r['mode']}{'es' if r['mode'] == 'process' else 's'} | {r['batch']} | "
                     f"{r['median']:,.0f} | {r['best']:,.0f} | {r['runs']} | {r['dups']} | {r['missing']} | "
                     f"{r['statements']:,.0f} | {r['ms']:.1f} | {r['busy']} |")
    lines.append("")
    at16 = [r for r in rows if r["claimers"] == 16 and r["mode"] == args.mode]
    if at16:
        best = max(at16, key=lambda r: r["median"])
        default = next((r for r in at16 if r["batch"] == 200), None)
        lines.append(f"**At 16 claimers ({args.mode}es):** best batch size {best['batch']} → "
                     f"{best['median']:,.0f} sessions/s (median)"
                     + (f"; the default batch 200 → {default['median']:,.0f} sessions/s" if default else "")
                     + f". Goal ≥ {GOAL:,}: {'met' if (default or best)['median'] >= GOAL else 'NOT met'}"
                     + (" at the default batch." if default else "."))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--claimers", default="1,4,16", help="comma-separated claimer counts")
    parser.add_argument("--batch", default="200", help="comma-separated batch sizes (the claim's LIMIT)")
    parser.add_argument("--grid", help="explicit claimers x batch [:mode] runs instead of the cross product,"
                                       " e.g. 1x200,4x200,16x200,16x1000,16x200:thread")
    parser.add_argument("--repeat", type=int, default=3, help="runs per (claimers, batch)")
    parser.add_argument("--mode", choices=("process", "thread"), default="process",
                        help="claimers as processes (like separate Lambda sweepers; default) or threads")
    parser.add_argument("--pgdata", default="/tmp/eros-bench-claim")
    add_database_url_option(parser)
    parser.add_argument("--out", default=str(RESULTS), help="markdown results file ('-' for none)")
    args = parser.parse_args(argv)
    with bench_environment(POWERTOOLS_LOG_LEVEL="WARNING"):
        return _main(args, command_line(__file__, argv))


def _main(args: argparse.Namespace, command: str) -> int:
    mach = describe_machine()
    url = database(args.pgdata, url=args.database_url)
    load_backlog(url, args.sessions)
    if args.grid:
        grid = []
        for item in args.grid.split(","):
            pair, _, mode = item.partition(":")
            claimers, batch = (int(x) for x in pair.split("x"))
            grid.append((claimers, batch, mode or args.mode))
    else:
        grid = [(int(c), int(b), args.mode) for c in args.claimers.split(",") for b in args.batch.split(",")]
    results = []
    for claimers, batch, mode in grid:
        for _ in range(args.repeat):
            reset_claims(url)
            r = run_once(url, claimers, batch, mode)
            results.append(r)
            label = f"{claimers:>2} {mode}{'es' if mode == 'process' else 's':<2}"
            print(f"{label} batch={batch:>5}: {r['rate']:>8,.0f} sessions/s  "
                  f"{r['elapsed']:6.2f} s  statements={r['statements']:>5}  "
                  f"{r['per_statement_ms']:6.1f} ms/statement  duplicates={r['duplicates']}  "
                  f"missing={args.sessions - (r['claimed'] - r['duplicates'])}", flush=True)
    reset_claims(url)
    report = render(args, results, mach, postgres_version(url)["postgres"], command)
    print()
    print(report)
    write_results(args.out, report)
    bad = any(r["duplicates"] or r["claimed"] - r["duplicates"] != args.sessions for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
