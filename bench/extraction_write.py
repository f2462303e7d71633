"""The database side of one extraction, on the turn bench's 1M-row data set (issue 13: what one writer does per
extraction, beside the turn and the claim).

    .venv/bin/python bench/extraction_write.py                   # 300 sessions, 5 memories each, 1 of them a change
    .venv/bin/python bench/extraction_write.py --sessions 50     # a quick look

Each session of ``bench/turn_overhead.py``'s data set (10,000 users x 100 profile memories, 20 messages a
session; loaded here the same way when it is missing) first gets ``--turns`` real chat turns (``take_turn``,
untimed: they store the messages and the utterances whose embeddings find the known memories), is claimed
for this run (untimed) and is extracted by the real ``eros.dreaming.extract_session`` with zero-latency
providers: the model answers ``--memories`` new
memories, the first of which supersedes a known memory that the request showed it (a changed fact), and the
embedder hands out pre-drawn vectors. Timed, per extraction: every statement it sends, grouped as the store
functions that send them -- the lease (``start``), the transcript, the known memories the session touches
(found by SQL from the turns' embeddings), and the ONE write transaction (``finish``: insert the rows,
supersede, stamp the session) -- and the whole extraction. The run leaves the data set as it found it
(its turns, memories, supersessions and usage rows are undone).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from datetime import UTC, datetime, timedelta

import turn_overhead as turns
from _common import (
    RESULTS,
    bench_environment,
    command_line,
    database,
    describe_machine,
    git_commit,
    patched,
    summary,
    use_database,
    write_results,
)

RESULTS_FILE = RESULTS / "extraction_write.md"
KNOWN = re.compile(r"^- (m\d+) \(", re.M)  # a known memory's handle in the extraction request
TIMED = ("start", "transcript", "touched_memories", "finish")
MEMORY_TEXT = "Bench memory "  # what this run's memories start with (forget_this_run deletes them)


class FakeExtractor:
    """Zero latency: ``count`` new memories, the first superseding the first known memory the request showed."""

    model = "bench/fake-extractor"

    def __init__(self, count: int):
        self.count = count
        self.superseding = 0

    def describe(self) -> str:
        return "bench fake extraction model (instant answer)"

    def complete(self, model, messages, *, max_tokens=600, temperature=0.7, deadline=None, json_mode=False):
        from eros.providers.llm import Completion

        handles = KNOWN.findall("\n".join(m["content"] for m in messages))
        memories = [{"content": f"{MEMORY_TEXT}{i} of this session, about work and family", "category": "fact",
                     "importance": 0.5} for i in range(self.count)]
        if handles and memories:
            memories[0]["supersedes"] = [handles[0]]
            self.superseding += 1
        return Completion(text=json.dumps({"memories": memories}), model=self.model,
                          usage={"prompt_tokens": 0, "completion_tokens": 0})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=300, help="extractions timed (default: 300)")
    parser.add_argument("--memories", type=int, default=5, help="new memories per extraction (default: 5)")
    parser.add_argument("--turns", type=int, default=3, help="chat turns each session gets first (default: 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pgdata", default="/tmp/eros-bench-turn", help="turn_overhead.py's Postgres folder")
    parser.add_argument("--database-url", default="", help="a disposable database instead (its engine tables are "
                        "reloaded with the turn bench's data set when they do not hold it)")
    for name, default in (("users", 10_000), ("memories-per-user", 100), ("relationship-per-user", 20),
                          ("history-per-user", 20)):
        parser.add_argument(f"--{name}", type=int, default=default, help=f"turn_overhead.py's --{name}")
    parser.add_argument("--long-history", type=int, default=0, metavar="N",
                        help="alternate each extraction with one of a user whose conversation holds N utterances and "
                             "--long-profile profile memories (turn_overhead.py --long-history's user), and compare")
    parser.add_argument("--long-profile", type=int, default=2_000, help="active profile memories of the long user")
    parser.add_argument("--out", default=str(RESULTS_FILE), help="results file ('-': none)")
    args = parser.parse_args(argv)
    args.argv = argv
    return args


def data_set(args: argparse.Namespace) -> str:
    """The URL of turn_overhead.py's data set, loaded when it is not there (with that bench's own code)."""
    from eros.db import connect

    data = turns.parse_args(["--users", str(args.users), "--memories-per-user", str(args.memories_per_user),
                             "--relationship-per-user", str(args.relationship_per_user),
                             "--history-per-user", str(args.history_per_user), "--pgdata", args.pgdata,
                             "--database-url", args.database_url])
    url = database(data.pgdata, url=data.database_url, name=turns.database_name(data))
    with connect(url) as conn:
        have = turns.seeded_counts(conn)
    if have != turns.expected_counts(data):
        print(f"loading {turns.database_name(data)} ...", flush=True)
        turns.load(url, data)
    forget_this_run(url)
    use_database(url)
    return url


def forget_this_run(url: str) -> None:
    """Undo what the run wrote: its memories (and the supersessions they made), its turns, its usage rows."""
    from eros.db import connect

    with connect(url) as conn:
        # The version chains the run joined (migration 0017) come apart first: the run's rows leave them, then
        # the rows they superseded are current again, each a chain of its own.
        conn.execute("UPDATE engine.companion_memories SET chain_id = NULL WHERE source = 'dreaming'"
                     " AND content LIKE %s AND chain_id IS NOT NULL", (MEMORY_TEXT + "%",))
        conn.execute("UPDATE engine.companion_memories SET superseded_at = NULL, superseded_by = NULL,"
                     " superseded_reason = NULL, chain_id = NULL WHERE superseded_by IN (SELECT id FROM"
                     " engine.companion_memories WHERE source = 'dreaming' AND content LIKE %s)",
                     (MEMORY_TEXT + "%",))
        conn.execute("DELETE FROM engine.companion_memories WHERE source = 'dreaming' AND content LIKE %s",
                     (MEMORY_TEXT + "%",))
        conn.execute("DELETE FROM engine.user_model_usage WHERE user_id LIKE 'bench-u%'")
        conn.execute("DELETE FROM engine.user_deep_pass WHERE user_id LIKE 'bench-u%'")
    turns.forget_earlier_runs(url)


def claim_for_this_run(conn, user: str, session) -> datetime:
    """Claim the session for this run, from the watermark its earlier messages leave (untimed set-up; the claim
    itself is claim_throughput's): the extraction reads the new turns with their context."""
    token = datetime.now(UTC) - timedelta(seconds=1)
    conn.execute("UPDATE engine.chat_sessions SET extraction_claimed_at = %s, extracted_at = NULL,"
                 " extraction_watermark = (SELECT max(id) FROM engine.chat_messages WHERE session_id = %s"
                 "   AND user_id = %s AND client_turn_id LIKE 'seed-%%'), last_active_at = now() - interval '1 hour'"
                 " WHERE id = %s AND user_id = %s", (token, session, user, session, user))
    return token


def run(url: str, args: argparse.Namespace) -> dict:
    import eros.chat
    from eros.config import settings
    from eros.db import connect
    from eros.dreaming import session as session_job
    from eros.store import claims
    from eros.store import dreaming as store

    rng = random.Random(args.seed)
    with connect(url) as conn:
        sessions = [(r["user_id"], r["id"]) for r in conn.execute(
            "SELECT user_id, id FROM engine.chat_sessions WHERE user_id LIKE 'bench-u%' ORDER BY id").fetchall()]
    picked = [("small", user, session) for user, session in rng.sample(sessions, args.sessions)]
    if args.long_history:  # interleaved: the same load on these shared cores for both
        turns.load_long_history(url, [args.long_history], args.long_profile)
        long_user = turns.long_users([args.long_history])[args.long_history]
        with connect(url) as conn:
            old = [(long_user, r["id"]) for r in conn.execute(
                "SELECT id FROM engine.chat_sessions WHERE user_id = %s ORDER BY created_at DESC OFFSET 1",
                (long_user,))]
        picked = [each for pair in zip(picked, [("long", user, session) for user, session in
                                                  rng.sample(old, args.sessions)], strict=True) for each in pair]
    extractor = FakeExtractor(args.memories)
    embedder = turns.FakeEmbedder(turns.random_unit_vectors(rng, 512, 512))
    per_call: dict[str, dict[str, list[float]]] = {label: {name: [] for name in TIMED} for label in ("small", "long")}
    current: dict[str, float] = {}

    def timed(name, function):
        def wrapper(*a, **kw):
            started = time.perf_counter()
            try:
                return function(*a, **kw)
            finally:
                current[name] = current.get(name, 0.0) + time.perf_counter() - started
        return wrapper

    whole: dict[str, list[float]] = {"small": [], "long": []}
    outcomes: dict[str, int] = {}
    home = {"start": claims, "transcript": store, "touched_memories": store, "finish": store}
    changes = [(home[name], name, timed(name, getattr(home[name], name))) for name in TIMED]
    changes += [(session_job, "chat_client", lambda: extractor), (session_job, "embedder", lambda: embedder),
                (eros.chat, "chat_client", turns.FakeChat), (eros.chat, "embedder", lambda: embedder)]
    with patched(*changes), connect(url) as setup, turns.logging_to_nowhere():
        cfg = settings()
        for n, (label, user, session) in enumerate(picked):
            for t in range(args.turns):
                eros.chat.take_turn(user, session, turns.UTTERANCES[(n + t) % len(turns.UTTERANCES)],
                                    f"{turns.TURN_PREFIX}xw-{n}-{t}")
            token = claim_for_this_run(setup, user, session)
            current.clear()
            started = time.perf_counter()
            result = session_job.extract_session(cfg, user, session, token)
            whole[label].append(time.perf_counter() - started)
            outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
            for name in TIMED:
                per_call[label][name].append(current.get(name, 0.0))
    forget_this_run(url)
    return {"whole": whole, "per_call": per_call, "outcomes": outcomes, "superseding": extractor.superseding}


def render(args: argparse.Namespace, res: dict) -> str:
    def row(label: str, seconds: list[float], bold: bool = False) -> str:
        s = summary(seconds)
        cells = [f"{s[k]:.2f}" for k in ("p50", "p95", "p99", "mean", "max")]
        return f"| {label} | " + " | ".join(f"**{c}**" if bold else c for c in cells) + " |"

    labels = {"start": "the lease (start: lock the session, check the claim, count the attempt)",
              "transcript": "the transcript (new messages and their context)",
              "touched_memories": "the known memories the session touches (SQL from the turns' embeddings)",
              "finish": "**the write transaction** (finish: insert, supersede, confirm, stamp)"}
    def database_part(label: str) -> list[float]:
        return [sum(res["per_call"][label][n][i] for n in TIMED) for i in range(len(res["whole"][label]))]

    lines = [
        "# Extraction: the database side of one session's dreaming", "",
        "Written by `bench/extraction_write.py`; re-running overwrites everything above the notes marker.", "",
        f"* **Command:** `{command_line(__file__, args.argv)}`",
        f"* **Date:** {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; code at {git_commit()}",
        f"* **Machine:** {describe_machine()}.",
        f"* **Data:** `bench/turn_overhead.py`'s data set ({args.users:,} users x {args.memories_per_user} profile "
        f"memories, {args.relationship_per_user} relationship rows and {args.history_per_user} messages a session), "
        "embedded PostgreSQL over a Unix socket.",
        f"* **Extractions:** {args.sessions} random sessions, each after {args.turns} chat turns, {args.memories} "
        "new memories each from a zero-latency "
        f"model, the first superseding a known memory the request showed ({res['superseding']} of them had one "
        f"to show); outcomes: {', '.join(f'{k} {v}' for k, v in sorted(res['outcomes'].items()))}.", "",
        "| per extraction | p50 ms | p95 ms | p99 ms | mean ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        row("whole extraction (extract_session; providers instant)", res["whole"]["small"], bold=True),
        row("database (the four below)", database_part("small")),
        *(row(labels[name], res["per_call"]["small"][name]) for name in TIMED),
    ]
    if args.long_history:
        small, large = summary(database_part("small")), summary(database_part("long"))
        lines += [
            "", f"**A long history**, alternating with the extractions above (same load): {args.sessions} sessions "
            f"of a user whose persona conversation holds {args.long_history:,} utterances (and their episodes) and "
            f"whose profile holds {args.long_profile:,} active memories (`bench/turn_overhead.py --long-history`'s "
            "user).", "",
            "| per extraction, long history | p50 ms | p95 ms | p99 ms | mean ms | max ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            row("whole extraction", res["whole"]["long"], bold=True),
            row("database (the four below)", database_part("long")),
            *(row(labels[name], res["per_call"]["long"][name]) for name in TIMED),
            "", f"Database part, long over small: p50 x{large['p50'] / small['p50']:.2f}, "
            f"p95 x{large['p95'] / small['p95']:.2f} (goal: at most x1.5).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with bench_environment():
        url = data_set(args)
        res = run(url, args)
    report = render(args, res)
    print(report)
    write_results(args.out, report)
    return res


if __name__ == "__main__":
    main()
