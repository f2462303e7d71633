"""Throughput and isolation of the local stack (`eros serve`) under concurrent clients.

    .venv/bin/python bench/local_concurrency.py                 # 16 clients x 60 rounds, 3 runs
    .venv/bin/python bench/local_concurrency.py --clients 4 --rounds 200
    .venv/bin/python bench/local_concurrency.py --containers 1   # every handler call serialised

Every client is its own user: it creates a session, then repeats a round of POST a turn (offline
providers), GET /v1/memories, GET /v1/sessions through real sockets. Reported per run: requests/s over
all clients (the clock starts when all clients have their session and stops when the last is done),
requests that failed (non-2xx) and responses that carried another user's data (must both be 0).
Postgres 16 + pgvector is embedded in /tmp/eros-bench-local (left running for re-runs).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import machine  # bench/machine.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--containers", type=int, default=16, help="chat containers (1 = handler calls serialised)")
    parser.add_argument("--pg", default="/tmp/eros-bench-local")
    args = parser.parse_args()

    for name in ("OPENROUTER_API_KEY", "VOYAGE_API_KEY", "LLM_BASE_URL", "EMBED_BASE_URL", "DATABASE_SECRET_ARN"):
        os.environ.pop(name, None)
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
    os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    os.environ.setdefault("LOCAL_JWT_SECRET", "bench-only-signing-key-0123456789abcdef")
    import httpx
    import pgserver

    from eros.config import settings
    from eros.db import connect
    from eros.local import issue_token, local_jwt_key, make_server
    from eros.migrate import migrate

    url = pgserver.get_server(args.pg, cleanup_mode=None).get_uri()
    os.environ["DATABASE_URL"] = url
    migrate(url)
    cfg = settings()
    print(machine.describe())
    for run in range(args.runs):
        with connect(url) as conn:
            conn.execute("DELETE FROM engine.companion_memories WHERE user_id LIKE 'bench-local-%'")
            conn.execute("DELETE FROM engine.chat_sessions WHERE user_id LIKE 'bench-local-%'")
        server = make_server(cfg, "127.0.0.1", 0, concurrency=args.containers)
        sys.stderr = sys.stdout = open(os.devnull, "w")  # the access log, metrics
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        ready = threading.Barrier(args.clients + 1)

        def client(n: int) -> tuple[int, int, int]:
            name = f"bench-local-{n:03d}"
            headers = {"Authorization": f"Bearer {issue_token(name, cfg, local_jwt_key())}"}
            failed = foreign = done = 0
            with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
                sid = http.post("/v1/sessions", json={"persona_id": "luna"}).json()["id"]
                ready.wait()
                for i in range(args.rounds):
                    text = f"{name} says {i}"
                    for response, mine in (
                            (r := http.post(f"/v1/sessions/{sid}/turns", json={"content": text}),
                             lambda: text in r.json()["reply"]),
                            (m := http.get("/v1/memories", params={"limit": 500}),
                             lambda: all(x["content"].startswith(name) for x in m.json()["memories"])),
                            (s := http.get("/v1/sessions"),
                             lambda: [x["id"] for x in s.json()["sessions"]] == [sid])):
                        done += 1
                        if response.status_code >= 300:
                            failed += 1
                        elif not mine():
                            foreign += 1
            return done, failed, foreign

        with ThreadPoolExecutor(args.clients) as pool:
            futures = [pool.submit(client, n) for n in range(args.clients)]
            ready.wait()
            started = time.monotonic()
            results = [f.result() for f in futures]
            elapsed = time.monotonic() - started
        server.shutdown()
        server.server_close()
        sys.stderr, sys.stdout = sys.__stderr__, sys.__stdout__
        done, failed, foreign = (sum(x) for x in zip(*results))
        print(f"run {run + 1}: {args.clients} clients, {args.containers} containers, {done} requests in {elapsed:.1f} s = {done / elapsed:.0f}"
              f" requests/s; failed {failed}, another user's data {foreign}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
