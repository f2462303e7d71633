"""What a sign-bit prefilter keeps of the exact top k, on real sentence embeddings, and what recall's pool keeps.

    .venv/bin/python bench/recall_prefilter.py                 # the whole dev set (~1 min)
    .venv/bin/python bench/recall_prefilter.py --queries 50    # a quick check

Migration 0023's first form of bounded recall ranked a large candidate set by the Hamming distance of its rows'
sign bits (bit_count(a # b) over engine.embedding_signs()) and re-ranked only the best few hundred exactly; this
measured that, and is why migration 0025 scores every candidate by its exact distance, read from an index, and
bounds only the rows that go through the lexical part and the demotion (``RECALL_POOL``). Random vectors are a
poor test of a prefilter (their cosines to a query are all ~0, so the exact top k is noise the bits cannot see),
so this uses the labelled dev set's e5 embeddings (bench/data/recall_dev:
multilingual-e5-small, 384 dimensions zero-padded to 512, English and Chinese): every one of its memories
(1,692) as the profile of one user, every query (803) against them.

Two measurements:

* **vectors alone**: of the exact top k by cosine distance, the share that is among the best P by Hamming
  distance (recall@k of the prefilter, P the pool re-ranked exactly);
* **the recall statement**: ``eros.store.recall.ranked`` on the profile layer with the defaults (message
  included) and ``pool`` P (``--recall-pools``: k + P rows get the lexical part), against the same with
  ``utterance_window`` 0 (the exact scan): the share of the exact top k returned, and of queries whose top k
  is the same rows in the same order.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import (
    RESULTS,
    add_database_url_option,
    bench_environment,
    command_line,
    database,
    describe_machine,
    git_commit,
    use_database,
    write_results,
)

DATA = Path(__file__).resolve().parent / "data" / "recall_dev"
RESULTS_FILE = RESULTS / "recall_prefilter.md"
USER = "bench-prefilter"
DIM = 512


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--queries", type=int, default=0, help="the first N queries only (0: all)")
    p.add_argument("--pools", default="50,100,200,400", help="prefilter pools P (rows re-ranked exactly)")
    p.add_argument("--recall-pools", default="0,8,32,100", help="recall's RECALL_POOL values compared")
    p.add_argument("--ks", default="5,10,30", help="the top k compared")
    p.add_argument("--pgdata", default="/tmp/eros-bench-prefilter", help="the embedded Postgres folder")
    p.add_argument("--out", type=Path, default=RESULTS_FILE, help="markdown results file ('-' for none)")
    add_database_url_option(p)
    return p.parse_args(argv)


def padded(vector: list[float]) -> list[float]:
    return vector + [0.0] * (DIM - len(vector))


def load(conn: Any) -> tuple[int, list[dict]]:
    """Every dev memory as one user's profile row; returns the row count and the queries."""
    from pgvector import Vector

    memories = [json.loads(line) for line in (DATA / "memories.jsonl").read_text(encoding="utf-8").splitlines()]
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    conn.execute("DELETE FROM engine.companion_memories WHERE user_id = %s", (USER,))
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO engine.companion_memories (id, user_id, content, embedding, category, importance, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [(uuid.uuid5(uuid.NAMESPACE_URL, m["id"]), USER, m["content"], Vector(padded(m["embedding"])),
              m.get("category") or "fact", m.get("importance"), datetime.fromisoformat(m["created_at"]))
             for m in memories])
    conn.execute("VACUUM ANALYZE engine.companion_memories")
    return len(memories), queries


_RANKS = """
WITH q AS (SELECT %(q)s::vector AS v, engine.embedding_signs(%(q)s::vector) AS s),
rows AS (SELECT id, embedding <=> q.v AS distance, bit_count(signs # q.s) AS hamming
         FROM engine.companion_memories, q WHERE user_id = %(user)s AND instance_id IS NULL)
SELECT rank() OVER (ORDER BY distance) AS exact, rank() OVER (ORDER BY hamming) AS hamming,
       row_number() OVER (ORDER BY hamming, id) AS place
FROM rows ORDER BY distance, id
LIMIT %(k)s
"""


def vectors_alone(conn: Any, queries: list[dict], pools: list[int], ks: list[int]) -> dict[tuple[int, int], float]:
    """recall@k of the Hamming top P, per (P, k): the exact top k's rows whose Hamming place is within P."""
    from pgvector import Vector

    kept = {(p, k): 0 for p in pools for k in ks}
    for query in queries:
        places = [r["place"] for r in conn.execute(_RANKS, {"q": Vector(padded(query["embedding"])), "user": USER,
                                                             "k": max(ks)})]
        for p in pools:
            for k in ks:
                kept[p, k] += sum(1 for place in places[:k] if place <= p)
    return {key: n / (len(queries) * key[1]) for key, n in kept.items()}


def through_recall(queries: list[dict], pools: list[int], ks: list[int]
                   ) -> dict[tuple[int, int], tuple[float, float]]:
    """Per (P, k): the share of the exact scan's top k that the bounded statement returns, and the share of
    queries whose top k is identical (rows and order)."""
    from eros.config import RecallKnobs
    from eros.memory import MemoryLayer
    from eros.store import recall as recall_store

    exact_knobs = RecallKnobs(utterance_window=0)
    out: dict[tuple[int, int], list[float]] = {(p, k): [0.0, 0.0] for p in pools for k in ks}
    for query in queries:
        vector = padded(query["embedding"])
        at = datetime.fromisoformat(query["at"])

        def top(knobs: RecallKnobs, vector=vector, query=query, at=at) -> list[uuid.UUID]:
            return [r["id"] for r in recall_store.ranked(MemoryLayer.PROFILE, knobs, USER, vector, k=max(ks),
                                                         cap=None, message=query["text"], now=at)]

        exact = top(exact_knobs)
        for p in pools:
            bounded = top(RecallKnobs(pool=p))
            for k in ks:
                out[p, k][0] += len(set(bounded[:k]) & set(exact[:k])) / k
                out[p, k][1] += bounded[:k] == exact[:k]
    return {key: (a / len(queries), b / len(queries)) for key, (a, b) in out.items()}


def render(command: str, rows: int, queries: int, pools: list[int], ks: list[int], alone: dict, recall: dict,
           seconds: float, recall_pools: list[int]) -> str:
    lines = [f"`{command}`", "", f"{datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, commit {git_commit()}, "
             f"{describe_machine()}", "",
             f"{rows:,} profile rows of one user (every memory of bench/data/recall_dev, e5 embeddings 384-d padded"
             f" to 512), {queries} queries; {seconds:.0f} s.", "",
             "**Vectors alone**: share of the exact top k (cosine) among the best P by Hamming distance of the"
             " sign bits.", "",
             "| P (re-ranked exactly) | " + " | ".join(f"recall@{k}" for k in ks) + " |",
             "| ---: | " + " | ".join("---:" for _ in ks) + " |"]
    lines += [f"| {p} ({p / rows:.0%} of the rows) | " + " | ".join(f"{alone[p, k]:.3f}" for k in ks) + " |"
              for p in pools]
    lines += ["", "**Through the recall statement** (`ranked`, profile layer, default knobs, the query's text as"
              " the message) with `pool` P (RECALL_POOL) against `utterance_window` 0 (the exact scan): share of the"
              " exact top k returned / share of queries with the identical top k.", "",
              "| P | " + " | ".join(f"top {k}: kept / identical" for k in ks) + " |",
              "| ---: | " + " | ".join("---:" for _ in ks) + " |"]
    lines += [f"| {p} | " + " | ".join(f"{recall[p, k][0]:.3f} / {recall[p, k][1]:.3f}" for k in ks) + " |"
              for p in recall_pools]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with bench_environment():
        return _main(args, command_line(__file__, argv))


def _main(args: argparse.Namespace, command: str) -> int:
    from eros.db import connect

    pools = [int(x) for x in args.pools.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    url = database(args.pgdata, url=args.database_url)
    started = time.perf_counter()
    with connect(url) as conn:
        rows, queries = load(conn)
        queries = queries[:args.queries] if args.queries else queries
        alone = vectors_alone(conn, queries, pools, ks)
    use_database(url)
    recall_pools = [int(x) for x in args.recall_pools.split(",")]
    recall = through_recall(queries, recall_pools, ks)
    report = render(command, rows, len(queries), pools, ks, alone, recall, time.perf_counter() - started,
                    recall_pools)
    print(report)
    write_results(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
