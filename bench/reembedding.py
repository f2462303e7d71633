"""A change of embedder on a heavy user (issue 30): how long the re-embedding takes, what it costs in provider calls,
and whether recall keeps working meanwhile.

    .venv/bin/python bench/reembedding.py                    # one user with 10,000 memories, 20 users with 50
    .venv/bin/python bench/reembedding.py --memories 2000    # a quick look

The database (an embedded Postgres in ``--pgdata``, database ``reembed``, made fresh) is loaded with the rows as the
offline embedder (the local stack without keys) would have stored them. Then the configuration changes to a
Voyage-like embedder (a fake on loopback speaking Voyage's wire format, answering other vectors than the offline
model's, at once), and the real sweep (``eros_dev.dreaming.sweep_locally``: the sweeper's and
the extract function's handlers) runs until the switch, while a second thread chats as the heavy user, turn after
turn, through the chat handler. Reported: time to the switch, sweeps, provider calls and rows re-embedded, every
turn's status, what it recalled and which model embedded its query, and, after the switch, that every stored
vector is the new model's.
"""

from __future__ import annotations

import argparse
import threading
import time

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
    write_results,
)

RESULTS_FILE = RESULTS / "reembedding.md"
NEW = "voyage-3.5-lite"
HEAVY = "heavy"
TOPICS = ["hiking", "cello", "Lisbon", "nursing", "Biscuit the dog", "sourdough", "the night shift", "Porto",
          "my sister Ana", "chess", "the marathon", "tea", "jazz", "the garden", "Mandarin lessons"]


def new_vector(text: str) -> list[float]:
    from eros.providers.offline import hash_embed

    return hash_embed(text[::-1] + " reembedded")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=10_000, help="the heavy user's rows (default: 10,000)")
    parser.add_argument("--users", type=int, default=20, help="other users, 50 rows each (default: 20)")
    parser.add_argument("--pgdata", default="/tmp/eros-bench-reembed")
    parser.add_argument("--out", default=str(RESULTS_FILE), help="results file ('-': none)")
    add_database_url_option(parser)
    return parser.parse_args(argv)


def load(url: str, memories: int, users: int) -> int:
    """The rows, as the offline embedder stored them (its model in their metadata: the recorded model)."""
    import psycopg
    from pgvector import Vector
    from pgvector.psycopg import register_vector

    from eros.providers.offline import HashingEmbedder, hash_embed

    rows = [(HEAVY, f"Said something about {TOPICS[i % len(TOPICS)]} (note {i})") for i in range(memories)]
    rows += [(f"user-{u}", f"Likes {TOPICS[i % len(TOPICS)]} ({i})") for u in range(users) for i in range(50)]
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        conn.execute("TRUNCATE engine.companion_memories, engine.chat_messages, engine.chat_sessions,"
                     " engine.user_deep_pass, engine.persona_instances, engine.user_reembedding CASCADE")
        conn.execute("DELETE FROM engine.embedding_space")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance, metadata)"
                " VALUES (%s, %s, %s, 'fact', 0.5, jsonb_build_object('embed_model', %s::text))",
                [(user, content, Vector(hash_embed(content)), HashingEmbedder.model) for user, content in rows])
    return len(rows)


def chatter(stop: threading.Event, log: list[dict]) -> None:
    """The heavy user chats, turn after turn, while the re-embedding runs."""
    from apiclient import Api

    from eros.calibrated import space

    api = Api()
    sid = api.session(user=HEAVY)
    n = 0
    while not stop.is_set():
        n += 1
        started = time.perf_counter()
        status, body = api.call("POST", f"/v1/sessions/{sid}/turns",
                                {"content": f"What do you remember about {TOPICS[n % len(TOPICS)]}?"}, user=HEAVY)
        recorded = (space() or {}).get("model")
        log.append({"status": status, "seconds": time.perf_counter() - started, "model": recorded,
                    "recalled": len(body.get("recalled", [])) if status == 200 else 0})
        time.sleep(0.05)


def run(args: argparse.Namespace) -> dict:
    test_helpers_on_path()
    from fakes import FakeVoyage

    from eros import calibrated
    from eros_dev.dreaming import sweep_locally

    url = database(args.pgdata, url=args.database_url, name=None if args.database_url else "reembed", fresh=True)
    rows = load(url, args.memories, args.users)
    with FakeVoyage(embed_fn=new_vector) as fake, bench_environment(
            DATABASE_URL=url, EMBED_BASE_URL=fake.url, VOYAGE_API_KEY="bench", EMBED_MODEL=NEW,
            PROVIDER_MAX_RETRIES="0", DREAMING_IDLE_SECS="86400"):
        log: list[dict] = []
        stop = threading.Event()
        before = fake.calls
        started = time.perf_counter()
        calibrated.embedder()  # what the first turn or extraction with the new configuration does: it starts it
        talker = threading.Thread(target=chatter, args=(stop, log), daemon=True)
        talker.start()
        sweeps: list[dict] = []
        switched_at: float | None = None
        while switched_at is None and len(sweeps) < 50:
            result = sweep_locally(workers=2)
            sweeps.append(result)
            if any(j.get("switch") == "switched" for j in result["jobs"]) or result.get("reembedding") == "switched":
                switched_at = time.perf_counter() - started
        time.sleep(2.0)  # a few turns after the switch: the new model embeds their queries
        stop.set()
        talker.join(60)
        calls = fake.calls - before
        import psycopg
        with psycopg.connect(url) as conn:
            models = conn.execute("SELECT metadata->>'embed_model', count(*) FROM engine.companion_memories"
                                  " GROUP BY 1").fetchall()
            space = conn.execute("SELECT model, next_model FROM engine.embedding_space").fetchone()
            sample = conn.execute("SELECT content, embedding::real[] FROM engine.companion_memories"
                                  " ORDER BY random() LIMIT 200").fetchall()
    wrong = sum(1 for content, vector in sample
                if max(abs(a - b) for a, b in zip(vector, new_vector(content), strict=True)) > 1e-5)
    return {"rows": rows, "switched_after_s": switched_at, "sweeps": len(sweeps), "provider_calls": calls,
            "turns": log, "models": models, "space": space, "sample_wrong": wrong, "sample": len(sample),
            "jobs": sum(len([j for j in s["jobs"] if j["kind"] == "reembedding"]) for s in sweeps)}


def report(args: argparse.Namespace, argv: list[str] | None, r: dict) -> str:
    turns = r["turns"]
    before = [t for t in turns if t["model"] != NEW]
    after = [t for t in turns if t["model"] == NEW]
    ok = sum(t["status"] == 200 for t in turns)
    recalled = sum(t["recalled"] > 0 for t in turns if t["status"] == 200)
    lat = summary([t["seconds"] for t in turns if t["status"] == 200])
    return "\n".join([
        "# Re-embedding: a change of embedder on a heavy user",
        "",
        f"* **Command:** `{command_line('bench/reembedding.py', argv)}`",
        f"* **Date:** {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {git_commit()}",
        f"* **Machine:** {describe_machine()}",
        f"* **Data:** one user with {args.memories:,} rows and {args.users} users with 50, {r['rows']:,} rows in all,"
        " stored by the offline embedder; then EMBED_MODEL is a Voyage-like model (a fake on loopback that answers"
        " at once: the time is the engine's and the database's, not a provider's).",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| time from the start to the switch | {r['switched_after_s']:.1f} s |" if r["switched_after_s"] is not None
        else "| time from the start to the switch | did not switch |",
        f"| sweeps | {r['sweeps']} |",
        f"| re-embedding jobs delivered | {r['jobs']} |",
        f"| provider calls (embedding requests, the turns' queries included) | {r['provider_calls']:,} |",
        f"| rows per provider call (at most 128 a batch) | {r['rows'] / max(1, r['provider_calls']):.1f} |",
        f"| the heavy user's turns during the re-embedding / answered 200 | {len(before)} / "
        f"{sum(t['status'] == 200 for t in before)} |",
        f"| ... that recalled memories | {sum(t['recalled'] > 0 for t in before if t['status'] == 200)} |",
        f"| turns after the switch / answered 200 | {len(after)} / {sum(t['status'] == 200 for t in after)} |",
        f"| all turns: answered 200, recalled, p50 / p95 ms | {ok} of {len(turns)}, {recalled}, "
        f"{lat['p50']:.0f} / {lat['p95']:.0f} |",
        f"| the recorded model after | {r['space']} |",
        f"| rows by the model in their metadata | {dict(r['models'])} |",
        f"| sampled rows whose vector is not the new model's | {r['sample_wrong']} of {r['sample']} |",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    text = report(args, argv, result)
    print(text)
    write_results(args.out, text)
    return 0 if result["switched_after_s"] is not None and result["sample_wrong"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
