"""Throughput and isolation of the local stack (`eros serve`) under concurrent clients.

    .venv/bin/python bench/local_concurrency.py                 # 16 clients x 60 rounds, 3 runs
    .venv/bin/python bench/local_concurrency.py --clients 4 --rounds 200
    .venv/bin/python bench/local_concurrency.py --containers 1   # every handler call serialised

Every client is its own user: it creates a session, then repeats a round of POST a turn (offline
providers), GET /v1/memories, GET /v1/sessions through real sockets. Reported per run: requests/s over
all clients (the clock starts when all clients have their session and stops when the last is done),
requests that failed (non-2xx) and responses that carried another user's data (must both be 0).
Postgres 16 + pgvector is embedded in /tmp/eros-bench-local (left running for re-runs). The runs go to
stdout, and with ``--out`` to a markdown file too.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from _common import (
    add_database_url_option,
    bench_environment,
    command_line,
    database,
    describe_machine,
    use_database,
    write_results,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--containers", type=int, default=16, help="chat containers (1 = handler calls serialised)")
    parser.add_argument("--pg", default="/tmp/eros-bench-local")
    add_database_url_option(parser)
    parser.add_argument("--out", default="-", help="also write the runs to this markdown file ('-': stdout only)")
    args = parser.parse_args(argv)
    with bench_environment(POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true",
                           LOCAL_JWT_SECRET=os.environ.get("LOCAL_JWT_SECRET",
                                                           "bench-only-signing-key-0123456789abcdef")):
        return _main(args, command_line(__file__, argv))


def _main(args: argparse.Namespace, command: str) -> int:
    from eros.config import settings
    from eros.db import connect

    url = database(args.pg, url=args.database_url)
    use_database(url)
    cfg = settings()
    mach = describe_machine()
    print(mach)
    lines = []
    bad = False
    for run in range(args.runs):
        with connect(url) as conn:
            conn.execute("DELETE FROM engine.companion_memories WHERE user_id LIKE 'bench-local-%'")
            conn.execute("DELETE FROM engine.chat_sessions WHERE user_id LIKE 'bench-local-%'")
        done, failed, foreign, elapsed = one_run(cfg, args)
        bad = bad or bool(failed or foreign)
        print(f"run {run + 1}: {args.clients} clients, {args.containers} containers, {done} requests in "
              f"{elapsed:.1f} s = {done / elapsed:.0f} requests/s; failed {failed}, another user's data {foreign}",
              flush=True)
        lines.append(f"| {run + 1} | {args.clients} | {args.containers} | {done} | {elapsed:.1f} | "
                     f"{done / elapsed:.0f} | {failed} | {foreign} |")
    write_results(args.out, "\n".join([
        "# Local stack under concurrent clients", "",
        f"* **Command:** `{command}`",
        f"* **Date:** {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"* **Machine:** {mach}",
        f"* **Rounds:** {args.rounds} per client (POST a turn, GET /v1/memories, GET /v1/sessions), offline providers",
        "", "| run | clients | containers | requests | seconds | requests/s | failed | another user's data |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *lines, ""]), notes=False)
    return 1 if bad else 0


def one_run(cfg, args: argparse.Namespace) -> tuple[int, int, int, float]:
    """One server, every client at once: (requests, failed, another user's data, seconds)."""
    from eros_dev.server import make_server

    server = make_server(cfg, "127.0.0.1", 0, concurrency=args.containers)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    ready = threading.Barrier(args.clients + 1)
    try:
        with (open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull),  # the access log, metrics
              contextlib.redirect_stderr(devnull), ThreadPoolExecutor(args.clients) as pool):
            futures = [pool.submit(client, n, base, ready, cfg, args.rounds) for n in range(args.clients)]
            try:
                ready.wait()
            except threading.BrokenBarrierError:
                pass  # a client failed to start: its future raises below
            started = time.monotonic()
            results = [f.result() for f in futures]
            elapsed = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    done, failed, foreign = (sum(x) for x in zip(*results, strict=True))
    return done, failed, foreign, elapsed


def client(n: int, base: str, ready: threading.Barrier, cfg, rounds: int) -> tuple[int, int, int]:
    """One user: a session, then ``rounds`` x (a turn, the memories, the sessions); returns (requests, failed,
    answers with another user's data)."""
    import httpx

    from eros_dev.tokens import issue_token, local_jwt_key

    name = f"bench-local-{n:03d}"
    counts = {"done": 0, "failed": 0, "foreign": 0}

    def tally(response, mine) -> None:
        counts["done"] += 1
        if response.status_code >= 300:
            counts["failed"] += 1
        elif not mine(response.json()):
            counts["foreign"] += 1

    headers = {"Authorization": f"Bearer {issue_token(name, cfg, local_jwt_key())}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        try:
            created = http.post("/v1/sessions", json={"persona_id": "luna"})
            created.raise_for_status()
            sid = created.json()["id"]
        except BaseException:
            ready.abort()  # nobody waits for a client that could not start
            raise
        ready.wait()
        for i in range(rounds):
            text = f"{name} says {i}"
            tally(http.post(f"/v1/sessions/{sid}/turns", json={"content": text}),
                  lambda body, text=text: text in body["reply"])
            tally(http.get("/v1/memories", params={"limit": 500}),
                  lambda body: all(x["content"].startswith(name) for x in body["memories"]))
            tally(http.get("/v1/sessions"), lambda body: [x["id"] for x in body["sessions"]] == [sid])
    return counts["done"], counts["failed"], counts["foreign"]


if __name__ == "__main__":
    sys.exit(main())
