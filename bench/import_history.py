"""Importing an existing history (``eros import``): wall time, peak memory, a re-run, and the backfill's order.

    .venv/bin/python bench/import_history.py                      # 1,000 conversations of 10 users
    .venv/bin/python bench/import_history.py --conversations 100  # a quick check

A JSONL file of generated conversations (each of one user and one persona, 6-20 messages over a day, the users'
conversations spread over 2024-2025, one of each user's saying where they live and a later one that they moved)
is imported with ``eros.importing.import_conversations`` into the embedded Postgres, with the offline providers
(no keys: the embedder is the offline stand-in, so the time is the engine's and the database's). Then the same
file again (it must store nothing and embed nothing), then dreaming until every session is extracted (local
sweeps, the offline extraction stand-in), recording the order in which each user's sessions were extracted.
Peak memory is Python's own (tracemalloc) during the import: it must not grow with the file.
Results go to stdout and ``bench/results/import_history.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import (
    EMPTY_ENGINE,
    RESULTS,
    add_database_url_option,
    bench_environment,
    command_line,
    database,
    describe_machine,
    one,
    use_database,
    write_results,
)

RESULTS = RESULTS / "import_history.md"
SAID = ["I worked late again today", "my sister is visiting next week", "I had a mocha with oat milk",
        "we went hiking on the weekend", "I think I'm getting a cold", "I started learning the guitar",
        "my cat knocked my phone into the sink", "work was calm for once", "I finally booked the flight",
        "I can't sleep, thinking about quitting"]
REPLIES = ["That sounds like a lot.", "Tell me more!", "I'm glad you told me.", "How did that feel?"]


def generate(path: Path, conversations: int, users: int, seed: int) -> int:
    """Write the file; returns its size in bytes."""
    rng = random.Random(seed)
    start = datetime(2024, 1, 1, 8, 0, tzinfo=UTC)
    per_user = max(1, conversations // users)
    with path.open("w", encoding="utf-8") as out:
        for n in range(conversations):
            user, k = f"import-user-{n % users}", n // users
            day = start + timedelta(days=k * 700 // per_user, hours=rng.randrange(10))
            messages = []
            for i in range(rng.randrange(3, 11)):
                said = rng.choice(SAID)
                if i == 0 and k == per_user // 4:
                    said = "I live in Berlin now"
                if i == 0 and k == 3 * per_user // 4:
                    said = "I moved to Lisbon last week"
                messages.append({"role": "user", "content": f"{said} ({k}.{i})",
                                 "created_at": (day + timedelta(minutes=4 * i)).isoformat()})
                messages.append({"role": "assistant", "content": rng.choice(REPLIES),
                                 "created_at": (day + timedelta(minutes=4 * i + 1)).isoformat()})
            out.write(json.dumps({"conversation_id": f"conv-{n}", "user_id": user, "persona_id": "luna",
                                  "messages": messages}) + "\n")
    return path.stat().st_size


def timed_import(path: Path) -> tuple[float, int, object]:
    from eros.importing import import_conversations

    tracemalloc.start()
    t0 = time.perf_counter()
    with path.open("rb") as stream:
        done = import_conversations(stream)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak, done


def backfill(url: str) -> tuple[float, int, dict[str, bool]]:
    """Sweep until every session is extracted; whether each user's sessions were extracted in their order."""
    from eros import db
    from eros_dev.dreaming import sweep_locally

    t0 = time.perf_counter()
    sweeps = 0
    with db.connect(url) as conn:
        while one(conn.execute("SELECT count(*) AS n FROM engine.chat_sessions WHERE extracted_at IS NULL"))["n"] \
                and sweeps < 500:
            with contextlib.redirect_stdout(io.StringIO()):  # the functions' metric lines (CloudWatch's EMF)
                sweep_locally()
            sweeps += 1
        rows = conn.execute("SELECT user_id, last_active_at, extracted_at FROM engine.chat_sessions"
                            " ORDER BY user_id, last_active_at").fetchall()
    in_order: dict[str, bool] = {}
    for row, after in zip(rows, rows[1:], strict=False):
        if row["user_id"] == after["user_id"]:
            in_order[row["user_id"]] = in_order.get(row["user_id"], True) and (
                after["extracted_at"] >= row["extracted_at"])
    return time.perf_counter() - t0, sweeps, in_order


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=1_000)
    p.add_argument("--users", type=int, default=10)
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--pgdata", default="/tmp/eros-bench-import")
    add_database_url_option(p)
    p.add_argument("--output", type=Path, default=RESULTS, help="markdown results file ('-' for none)")
    args = p.parse_args(argv)
    command = command_line(__file__, argv)
    from eros import db
    with bench_environment(DREAMING_IDLE_SECS="1800"), tempfile.TemporaryDirectory() as folder:
        url = database(args.pgdata, url=args.database_url, name=None if args.database_url else "bench_import",
                       fresh=not args.database_url)
        with db.connect(url) as conn:
            conn.execute(EMPTY_ENGINE)
        use_database(url)
        path = Path(folder) / "history.jsonl"
        size = generate(path, args.conversations, args.users, args.seed)
        first_s, first_peak, first = timed_import(path)
        again_s, again_peak, again = timed_import(path)
        backfill_s, sweeps, in_order = backfill(url)
    rows = [
        ("first import", first_s, first_peak, first.conversations, first.stored),  # type: ignore[attr-defined]
        ("the same file again", again_s, again_peak, again.conversations, again.stored),  # type: ignore[attr-defined]
    ]
    lines = [f"`{command}`", "", describe_machine(), "",
             f"A file of {args.conversations:,} conversations of {args.users} users ({size / 1e6:.1f} MB), offline "
             "providers.", "",
             "| run | wall s | conversations / s | peak Python memory MB | conversations | messages stored |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, seconds, peak, conversations, stored in rows:
        lines.append(f"| {name} | {seconds:.1f} | {conversations / seconds:,.0f} | {peak / 1e6:.1f} | "
                     f"{conversations:,} | {stored:,} |")
    lines += ["", f"Backfill: every session extracted in {backfill_s:.1f} s over {sweeps} local sweep(s); each user's "
              f"sessions extracted in the order they went quiet: {sum(in_order.values())} of {len(in_order)} users."]
    report = "\n".join(lines) + "\n"
    print(report)
    write_results(args.output, report)
    return 0 if all(in_order.values()) and again.stored == 0 else 1  # type: ignore[attr-defined]


if __name__ == "__main__":
    raise SystemExit(main())
