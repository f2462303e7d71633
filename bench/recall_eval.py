"""Recall evaluation: runs the project's real recall (eros.recall -> eros.store.recall SQL) over a
labelled dataset, for every strategy, and reports hit@k, MRR and how often a current fact ranks
above its superseded version.

Dataset: two JSONL files in one folder (format: bench/data/README.md), by default the committed
dev set bench/data/recall_dev. Embeddings come from the files (``--embeddings file``, any
dimension up to 512, zero-padded) or from the project's configured embedder (``--embeddings
configured``: Voyage when a key is set, else the offline lexical hashing embedder).

The data is loaded into its own embedded Postgres (``--dir``), memories as profile rows (or
relationship rows of one persona instance per user, ``layer: relationship``) with their
``created_at``; every query is asked at its own ``at`` (recall's injectable "now": rows created
later do not exist yet). The message itself counts as already in the prompt (hygiene).

Metrics, over the rows recall would inject. The prompt shows the two layers as two separate
sections, each in rank order, so a row's rank is its position inside its own layer's section:
  hit@k      a relevant row among the first k of its section
  MRR        1 / rank of the best-placed relevant row (0 when none is injected)
  in prompt  a relevant row is injected at all
  cur>old    (queries with superseded_ids) no superseded row is injected and a relevant one is,
             or a relevant profile row ranks above every injected superseded row
  old shown  (same queries) a superseded row is injected at all
  rows       mean rows injected per prompt (both sections)

``--sweep`` grid-searches lambda/tau (recency) and floor/ifloor/tau (composite), then K, the category
cap and the near-duplicate threshold, on the *tune* half of the users (even-numbered), and reports
the winners on the *holdout* half too. The objective is MRR, subject to two floors set by the
original ``grouped`` recall on the same queries: stable facts (tag ``stable``) reach the prompt at
least as often (burying an old but still true fact is a bug, not a trade-off), and cur>old is at
least as high (a ranking meant for knowledge updates must not do worse at them).

    .venv/bin/python bench/recall_eval.py --sweep --out bench/results/recall_eval_e5.md
    .venv/bin/python bench/recall_eval.py --sweep --embeddings configured --dir /tmp/eros-bench-eval-hash \
        --out bench/results/recall_eval_offline_hash.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "layers" / "eros"))

DIM = 512
ID_NAMESPACE = uuid.UUID("6f1d7a2e-5c3b-4e8a-9d0f-2b7c4a1e8f35")


def row_uuid(dataset_id: str) -> uuid.UUID:
    return uuid.uuid5(ID_NAMESPACE, dataset_id)


def load(folder: Path) -> tuple[list[dict], list[dict]]:
    def read(name):
        path = folder / f"{name}.jsonl"
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    memories, queries = read("memories"), read("queries")
    ids = {m["id"] for m in memories}
    if len(ids) != len(memories):
        raise SystemExit("duplicate memory ids")
    for q in queries:
        missing = [i for i in q["relevant_ids"] + q.get("superseded_ids", []) if i not in ids]
        if missing:
            raise SystemExit(f"query {q.get('id')} names unknown memories {missing}")
    return memories, queries


def pad(vector: list[float]) -> list[float]:
    if len(vector) > DIM:
        raise SystemExit(f"embedding of {len(vector)} dimensions: at most {DIM}")
    return list(vector) + [0.0] * (DIM - len(vector))


def embed_all(memories, queries, mode: str) -> str:
    """Puts a 512-d ``vector`` on every row; returns the embedder's name."""
    if mode == "file":
        for row in memories + queries:
            if "embedding" not in row:
                raise SystemExit(f"row {row.get('id')} has no embedding (use --embeddings configured)")
            row["vector"] = pad(row["embedding"])
        return memories[0].get("embedding_model", "embeddings from the file")
    from eros.providers import embedder

    e = embedder()
    for rows, field, input_type in ((memories, "content", "document"), (queries, "text", "query")):
        for start in range(0, len(rows), 64):
            batch = rows[start:start + 64]
            for row, vector in zip(batch, e.embed([r[field] for r in batch], input_type).vectors):
                row["vector"] = pad(vector)
    return e.model


def load_database(conn, memories) -> dict[str, uuid.UUID]:
    from pgvector import Vector

    conn.execute("TRUNCATE engine.companion_memories, engine.chat_messages, engine.chat_sessions, engine.user_consolidation,"
                 " engine.persona_instances CASCADE")
    persona = conn.execute("SELECT id FROM engine.personas ORDER BY id LIMIT 1").fetchone()["id"]
    instances: dict[str, uuid.UUID] = {}
    for user in sorted({m["user_id"] for m in memories}):
        instances[user] = conn.execute("INSERT INTO engine.persona_instances (user_id, persona_id) VALUES (%s, %s)"
                                       " RETURNING id", (user, persona)).fetchone()["id"]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO engine.companion_memories (id, user_id, instance_id, content, embedding, category,"
            " importance, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [(row_uuid(m["id"]), m["user_id"],
              instances[m["user_id"]] if m.get("layer") == "relationship" else None, m["content"],
              Vector(m["vector"]), m.get("category"), m.get("importance"), datetime.fromisoformat(m["created_at"]))
             for m in memories])
    conn.execute("ANALYZE engine.companion_memories")
    return instances


def evaluate(queries, instances, params) -> list[dict]:
    """One record per query: the ids (uuids) of the rows recall would inject, per layer, best first."""
    from eros import recall

    out = []
    for q in queries:
        result = recall.recall(q["user_id"], instances.get(q["user_id"]), q["vector"], message=q["text"],
                               now=datetime.fromisoformat(q["at"]), params=params)
        out.append({"query": q, "profile": [m["id"] for m in result.profile],
                    "relationship": [m["id"] for m in result.relationship]})
    return out


def metrics(records, uuid_of: dict[str, uuid.UUID]) -> dict:
    n = len(records)
    if n == 0:
        return {}
    hits = {1: 0, 3: 0, 5: 0}
    rr = in_prompt = rows = 0.0
    upd_n = upd_win = old_shown = 0
    for rec in records:
        q = rec["query"]
        relevant = {uuid_of[i] for i in q["relevant_ids"]}
        superseded = {uuid_of[i] for i in q.get("superseded_ids", [])}
        rows += len(rec["profile"]) + len(rec["relationship"])
        # Rank inside the layer's own prompt section: the sections are separate lists.
        positions = [pos for layer in ("profile", "relationship")
                     for pos, i in enumerate(rec[layer], 1) if i in relevant]
        first = min(positions, default=None)
        if first is not None:
            in_prompt += 1
            rr += 1 / first
            for k in hits:
                hits[k] += first <= k
        if superseded:
            upd_n += 1
            old_positions = [pos for pos, i in enumerate(rec["profile"], 1) if i in superseded]
            current = [pos for pos, i in enumerate(rec["profile"], 1) if i in relevant]
            old_shown += bool(old_positions)
            upd_win += (first is not None and not old_positions) or bool(
                current and all(min(current) < p for p in old_positions))
    return {"n": n, "hit@1": hits[1] / n, "hit@3": hits[3] / n, "hit@5": hits[5] / n, "mrr": rr / n,
            "in_prompt": in_prompt / n, "cur>old": upd_win / upd_n if upd_n else float("nan"),
            "old_shown": old_shown / upd_n if upd_n else float("nan"), "rows": rows / n}


def describe(p) -> str:
    if p.strategy == "grouped":
        return f"{p.per_category}/category, rel {p.relationship_top_k}"
    parts = ([f"λ={p.lam:g}"] if p.strategy == "recency" else [f"floor={p.floor:g}", f"ifloor={p.importance_floor:g}"])
    parts += [f"τ={p.tau_days:g}d", f"K={p.top_k}", f"cap={p.category_cap or '-'}"]
    if p.dedupe_similarity <= 1:
        parts.append(f"dedupe≥{p.dedupe_similarity:g}")
    else:
        parts.append("dedupe off")
    return ", ".join(parts)


class Runner:
    def __init__(self, queries, instances, uuid_of):
        self.queries, self.instances, self.uuid_of = queries, instances, uuid_of
        self.cache: dict = {}

    def run(self, params, subset=None) -> dict:
        key = tuple(sorted(asdict(params).items()))
        if key not in self.cache:
            self.cache[key] = evaluate(self.queries, self.instances, params)
        records = self.cache[key]
        if subset is not None:
            records = [r for r in records if subset(r["query"])]
        return metrics(records, self.uuid_of)


def tune(q) -> bool:
    return int(q["user_id"][-2:]) % 2 == 0


def holdout(q) -> bool:
    return not tune(q)


def tagged(tag):
    return lambda q: tag in q.get("tags", [])


def fmt(m: dict, keys=("hit@1", "hit@3", "hit@5", "mrr", "in_prompt", "cur>old", "old_shown")) -> str:
    cells = [f"{m[k]:.3f}" if k == "mrr" else f"{m[k]:.0%}" for k in keys]
    return " | ".join(cells) + f" | {m['rows']:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT / "bench" / "data" / "recall_dev"))
    ap.add_argument("--embeddings", choices=["file", "configured"], default="file")
    ap.add_argument("--dir", default="/tmp/eros-bench-eval", help="embedded Postgres folder (kept)")
    ap.add_argument("--sweep", action="store_true", help="grid-search the parameters on the tune half")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import pgserver

    from eros.config import Settings
    from eros.recall import RecallParams

    memories, queries = load(Path(args.data))
    server = pgserver.get_server(args.dir, cleanup_mode=None)
    from eros.db import connect
    from eros.migrate import migrate

    admin = connect(server.get_uri(), vector=False)
    if not admin.execute("SELECT 1 FROM pg_database WHERE datname = 'recall_eval'").fetchone():
        admin.execute("CREATE DATABASE recall_eval")
    dsn = server.get_uri().replace("/postgres?", "/recall_eval?")
    os.environ["DATABASE_URL"] = dsn
    migrate(dsn)
    from eros.config import settings

    settings.cache_clear()  # DATABASE_URL is set only now
    model = embed_all(memories, queries, args.embeddings)
    conn = connect(dsn)
    instances = load_database(conn, memories)
    uuid_of = {m["id"]: row_uuid(m["id"]) for m in memories}
    runner = Runner(queries, instances, uuid_of)
    started = time.perf_counter()

    defaults = RecallParams.from_settings(Settings())
    grouped = replace(defaults, strategy="grouped")
    baselines = {
        "grouped (original)": grouped,
        "recency (config defaults)": replace(defaults, strategy="recency"),
        "composite (config defaults)": replace(defaults, strategy="composite"),
    }
    sweep_lines: list[str] = []
    chosen: dict[str, RecallParams] = {}
    if args.sweep:
        stable_floor = runner.run(grouped, lambda q: tune(q) and tagged("stable")(q))["in_prompt"]
        update_floor = runner.run(grouped, tune)["cur>old"]

        def objective(p):
            m = runner.run(p, tune)
            ok = (runner.run(p, lambda q: tune(q) and tagged("stable")(q))["in_prompt"] >= stable_floor
                  and m["cur>old"] >= update_floor)
            return (ok, m["mrr"], m["cur>old"])

        base = replace(defaults, top_k=8, category_cap=0)
        grids = {
            "recency": [replace(base, strategy="recency", lam=lam, tau_days=tau)
                        for lam in (0.002, 0.005, 0.01, 0.02, 0.05, 0.1) for tau in (7, 30, 90, 365)],
            "composite": [replace(base, strategy="composite", floor=floor, tau_days=tau, importance_floor=ifloor)
                          for ifloor in (0.0, 0.5, 0.8, 0.9) for floor in (0.25, 0.5, 0.75, 0.9)
                          for tau in (7, 30, 90, 365)],
        }
        for strategy, grid in grids.items():
            sweep_lines += [f"### {strategy}: ranking parameters (K=8, no cap), tune half", "",
                            "| parameters | hit@1 | hit@3 | hit@5 | MRR | in prompt | cur>old | old shown | rows "
                            "| stable in prompt |",
                            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
            for p in grid:
                st = runner.run(p, lambda q: tune(q) and tagged("stable")(q))["in_prompt"]
                sweep_lines.append(f"| {describe(p)} | {fmt(runner.run(p, tune))} | {st:.0%} |")
            best = max(grid, key=objective)
            shape = [replace(best, top_k=k, category_cap=cap) for k in (5, 8, 10) for cap in (0, 2)]
            best = max(shape, key=lambda p: objective(p) + (-p.top_k,))  # ties: the shorter prompt
            dedupe = [replace(best, dedupe_similarity=s) for s in (0.9, 0.95, 0.98, 2.0)]
            sweep_lines += ["", f"### {strategy}: prompt shape and near-duplicate threshold, tune half", "",
                            "| parameters | hit@1 | hit@3 | hit@5 | MRR | in prompt | cur>old | old shown | rows |",
                            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
            for p in shape + dedupe:
                sweep_lines.append(f"| {describe(p)} | {fmt(runner.run(p, tune))} |")
            sweep_lines.append("")
            chosen[strategy] = max(dedupe, key=lambda p: objective(p) + (p.dedupe_similarity <= 1,))
            ok, mrr, upd = objective(chosen[strategy])
            if not ok:
                sweep_lines += [f"No {strategy} setting met both floors (stable in prompt >= {stable_floor:.0%}, "
                                f"cur>old >= {update_floor:.0%} on the tune half); the row shown is the best "
                                "MRR without them.", ""]
        print(f"sweep done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    configs = dict(baselines)
    for strategy, p in chosen.items():
        configs[f"{strategy} (best on tune)"] = p

    header = ("| strategy | parameters | hit@1 | hit@3 | hit@5 | MRR | in prompt | cur>old | old shown | rows |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [f"# Recall evaluation: {Path(args.data).name}, embeddings: {model}", "",
             f"{len(queries)} queries ({sum(tagged('en')(q) for q in queries)} English, "
             f"{sum(tagged('zh')(q) for q in queries)} Chinese) over {len(memories)} memories of "
             f"{len(instances)} users; run {datetime.now():%Y-%m-%d %H:%M} with "
             f"`{' '.join(['.venv/bin/python bench/recall_eval.py'] + sys.argv[1:])}`.", "",
             "Metrics: see the docstring of bench/recall_eval.py. *cur>old* and *old shown* are over the "
             f"{sum(bool(q.get('superseded_ids')) for q in queries)} knowledge-update queries.", ""]
    for title, subset in (("All queries", None), ("Holdout half (users not used for tuning)", holdout),
                          ("Tune half", tune)):
        lines += [f"## {title}", "", header]
        for name, p in configs.items():
            lines.append(f"| {name} | {describe(p)} | {fmt(runner.run(p, subset))} |")
        lines.append("")
    slices = ["update", "as_of", "stable", "importance", "event", "relationship", "en", "zh"]
    lines += ["## MRR by slice (all queries); *stable in prompt*: old facts that reached the prompt", "",
              "| strategy | " + " | ".join(slices) + " | stable in prompt |",
              "| --- | " + " | ".join("---" for _ in slices) + " | --- |"]
    for name, p in configs.items():
        cells = [f"{runner.run(p, tagged(s))['mrr']:.3f}" for s in slices]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {runner.run(p, tagged('stable'))['in_prompt']:.0%} |")
    lines.append("")
    if sweep_lines:
        lines += ["## Sweep", ""] + sweep_lines
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    print(f"done in {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
