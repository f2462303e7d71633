"""Consolidation evaluation: the real extraction + write-time consolidation over scripted multi-session
transcripts, then recall on probe queries.

    .venv/bin/python bench/consolidation_eval.py                      # scripted model (what tests use)
    .venv/bin/python bench/consolidation_eval.py --llm offline        # the offline stand-in (slot rules)
    .venv/bin/python bench/consolidation_eval.py --llm configured     # the real model: OPENROUTER_API_KEY
    .venv/bin/python bench/consolidation_eval.py --users en-01,zh-02  # a slice

The transcripts are ``bench/data/consolidation_dev/users.jsonl`` (``make_dev.py`` writes them): per user
a few sessions days to months apart, update chains (city, job, partner, diet: A -> B [-> C]), facts
repeated in 2-5 sessions, stable facts said once early, over-invalidation traps ("Mia started school"
after "Has a daughter, Mia"), and probe queries ("Where do I live now?").

Everything runs through the real code, in its own embedded Postgres (``--pgdata``): each session is
chatted through the chat Lambda's handler (so the relationship layer holds the turns' embeddings), its
rows are moved back to the scripted date, it is claimed (``eros.store.dreaming.claim``) and the extract
Lambda's handler runs it; at the end ``eros.recall.recall`` answers the probes.

``--llm``: ``scripted`` -- a fake OpenRouter on loopback (``tests/fakes.py``) answers each extraction
from the script: which memories to write and which earlier fact each one replaces (``supersedes``) or
repeats (``same_as``). It resolves those to handles by reading the ``<known_memories>`` block of the
actual request, so when the engine did not *show* the old fact, the scripted model cannot name it:
the figures measure the pipeline (the touched-memories query, the handle mapping, the guarded apply,
recall). ``offline`` -- the engine's offline stand-in (``eros.providers.offline.offline_candidates``).
``configured`` -- the real model from OPENROUTER_API_KEY / LLM_BASE_URL. Chat *replies* always come
from the fake (they are not what is measured, and a real model would bill every turn).
``--embeddings``: ``offline`` -- a fake Voyage on loopback speaking the offline hashing vectors (so the
calls are counted on the wire); ``e5``, ``minilm``, ``static`` -- the same fake answering that model's vectors
(bench/embed_recall_dev.py's models, computed by bench/_e5_worker.py in the model's throwaway virtualenv,
``--embed-python``, and cached on disk, ``--embed-cache``); ``configured`` -- VOYAGE_API_KEY / EMBED_BASE_URL.
``--thresholds calibrated`` runs recall with the model's calibration from ``eros.calibration.SHIPPED`` (issue 30)
instead of the defaults (e5's).

Two arms in one run, each with its own users: ``before`` -- consolidation off: the model's
``supersedes`` / ``same_as`` are dropped (the scripted model never answers them; for the other models
the parsed answer is stripped), so only the engine's own exact-repeat rule in ``eros.extraction.plan``
is left; ``after`` -- consolidation as built. Figures:

* probes: current above superseded (the current version injected, no superseded version ranked above
  it), superseded shown (any superseded version reaches the prompt), current injected;
* stable facts kept (stable, trap and filler facts with an active row; false supersession = the
  facts left with none);
* active rows per repeated fact (a current version said in >= 2 sessions; target 1.0) and stale
  active rows (older versions of a chain still active);
* provider calls per extracted session, LLM + embedding (target: 2 with new memories, 1 when the
  session only repeats known memories or has nothing to remember).

A stored row is attributed to a fact version by the version's regular expression (traps first, the
newest version of a chain first): exact for the scripted model, approximate for real models
(unlabelled rows are counted). Results: ``bench/results/consolidation_eval_<llm>.md`` (``--out``);
text below its ``<!-- notes -->`` line is hand-written and kept by re-runs. The bench's own database
(``--pgdata``) is migrated from scratch every run; ``--database-url`` (the tests) is only truncated.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import io
import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from _common import (
    EMPTY_ENGINE,
    PROVIDER_ENV,
    RESULTS,
    ROOT,
    add_database_url_option,
    bench_environment,
    command_line,
    database,
    describe_machine,
    patched,
    test_helpers_on_path,
    write_results,
)

DATA = ROOT / "bench" / "data" / "consolidation_dev" / "users.jsonl"
# Embedders answered by the fake Voyage from a model's vectors (bench/embed_recall_dev.py's --model names).
MODEL_EMBEDDINGS = ("e5", "minilm", "static")
EMBED_PYTHON = {"e5": "/tmp/embedvenv/bin/python", "minilm": "/tmp/embedvenv-minilm/bin/python",
                "static": "/tmp/embedvenv-static/bin/python"}
# The recall knobs a calibration sets (eros.calibration.Calibration field -> the setting's variable).
CALIBRATED_ENV = {"dedupe_similarity": "RECALL_DEDUPE_SIMILARITY", "demote_similarity": "RECALL_DEMOTE_SIMILARITY",
                  "demote_penalty": "RECALL_DEMOTE_PENALTY", "importance_weight": "RECALL_IMPORTANCE_WEIGHT",
                  "lexical_weight": "RECALL_LEXICAL_WEIGHT", "lexical_year_weight": "RECALL_LEXICAL_YEAR_WEIGHT",
                  "recency_weight": "RECALL_DECAY_LAMBDA"}
PERSONA = "luna"
CHAT_REPLY = "That sounds like a lot. I'm here for you."
KNOWN_LINE = re.compile(r"^- (m\d+) \((\w+), noted [0-9-]+(?:; when: [^)]*)?\): (.*)$", re.M)


# --- the script ---------------------------------------------------------------------------------

def load_users(path: Path = DATA, only: list[str] | None = None, limit: int | None = None) -> list[dict]:
    users = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if only:
        missing = set(only) - {u["user"] for u in users}
        if missing:
            raise SystemExit(f"unknown users: {', '.join(sorted(missing))}")
        users = [u for u in users if u["user"] in only]
    return users[:limit] if limit else users


def labeller(user: dict):
    """content -> (fact, version) or None: traps first, then everything else in the file's order, and
    within a chain the newest version first ("Moved from Berlin to Lisbon" states Lisbon)."""
    order = sorted(user["facts"].items(), key=lambda kv: kv[1]["kind"] != "trap")
    rules = [(name, v, re.compile(f["versions"][v]["match"], re.I)) for name, f in order
             for v in reversed(range(len(f["versions"])))]

    def label(content: str) -> tuple[str, int] | None:
        return next(((name, v) for name, v, rule in rules if rule.search(content)), None)

    return label


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def scripted_answer(session: dict, facts: dict, known_block: str, consolidate: bool, stats: collections.Counter,
                    misses: list | None = None) -> str:
    """What the scripted model answers for one session, given the known memories it was actually shown;
    ``stats`` counts how often the earlier fact it must name was shown, ``misses`` lists when it was not."""
    shown = [(handle, _norm(content)) for handle, _, content in KNOWN_LINE.findall(known_block)]

    def handles_of(ref: dict) -> list[str]:
        version = facts[ref["fact"]]["versions"][ref["version"]]
        texts = {_norm(t) for t in [version["content"], *version["variants"]]}
        return [h for h, content in shown if content in texts]

    memories = []
    for m in session["memories"]:
        out = {"content": m["content"], "category": m["category"], "importance": m["importance"]}
        for relation in ("supersedes", "same_as"):
            if relation in m:
                found = handles_of(m[relation])
                stats[f"{relation} asked"] += 1
                stats[f"{relation} shown"] += bool(found)
                if not found and misses is not None:
                    misses.append({"relation": relation, "memory": m["content"], "target": facts[m[relation]["fact"]][
                        "versions"][m[relation]["version"]]["content"], "shown": len(shown), "turns": session["turns"]})
                if consolidate and found:
                    out[relation] = found[:3] if relation == "supersedes" else found[0]
        memories.append(out)
    return json.dumps({"memories": memories}, ensure_ascii=False)


# --- the run ------------------------------------------------------------------------------------

@dataclass
class Arm:
    name: str
    consolidate: bool
    sessions: list[dict] = field(default_factory=list)  # one per extracted session
    probes: list[dict] = field(default_factory=list)
    facts: list[dict] = field(default_factory=list)  # one per (user, fact): the end state
    script: collections.Counter = field(default_factory=collections.Counter)  # scripted: shown when asked
    misses: list[dict] = field(default_factory=list)  # scripted: the earlier fact was not shown


def run(argv: list[str] | None = None) -> dict:
    """Parse the arguments, run both arms, write the report; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm", choices=("scripted", "offline", "configured"), default="scripted")
    parser.add_argument("--embeddings", choices=("offline", "configured", *MODEL_EMBEDDINGS), default="offline")
    parser.add_argument("--embed-python", default="", help="the Python of the model's throwaway virtualenv (default: "
                        + ", ".join(f"{k}: {v}" for k, v in EMBED_PYTHON.items()) + ")")
    parser.add_argument("--embed-cache", default="", help="the model's vectors on disk (default "
                                                          "/tmp/eros-consolidation-<model>.sqlite)")
    parser.add_argument("--thresholds", choices=("defaults", "calibrated"), default="defaults",
                        help="recall's cosine thresholds and weights: the defaults (e5's) or the model's calibration")
    parser.add_argument("--users", default="", help="comma-separated user ids (default: all)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many users")
    parser.add_argument("--arms", default="before,after", help="before (consolidation off), after, or both")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--pgdata", default="/tmp/eros-bench-consolidation")
    add_database_url_option(parser)
    parser.add_argument("--out", default="", help="markdown results (default bench/results/consolidation_eval_<llm>.md;"
                                                   " '-' for none)")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    users = load_users(Path(args.data), [u for u in args.users.split(",") if u] or None, args.limit or None)
    arms = [Arm(name, name == "after") for name in args.arms.split(",") if name]
    if not arms or any(a.name not in ("before", "after") for a in arms):
        raise SystemExit("--arms takes before, after or before,after")
    configured = {name: os.environ.get(name) for name in PROVIDER_ENV}
    if args.llm == "configured" and not (configured["OPENROUTER_API_KEY"] or configured["LLM_BASE_URL"]):
        raise SystemExit("--llm configured needs OPENROUTER_API_KEY (or LLM_BASE_URL for an OpenAI-compatible "
                         "server) in the environment; none is set. Use --llm scripted or --llm offline.")
    if args.embeddings == "configured" and not (configured["VOYAGE_API_KEY"] or configured["EMBED_BASE_URL"]):
        raise SystemExit("--embeddings configured needs VOYAGE_API_KEY (or EMBED_BASE_URL); none is set.")

    if args.thresholds == "calibrated" and args.embeddings == "configured":
        raise SystemExit("--thresholds calibrated needs a model the bench knows: --embeddings offline|"
                         + "|".join(MODEL_EMBEDDINGS))
    started = time.monotonic()
    with bench_environment(POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true",
                           PROVIDER_MAX_RETRIES="2", **thresholds_env(args)), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        with contextlib.redirect_stdout(io.StringIO()):  # Powertools prints its metrics blobs
            figures = _run(args, users, arms, configured)
    figures["seconds"] = round(time.monotonic() - started, 1)
    report = render(args, command, users, arms, figures)
    default = (f"consolidation_eval_{args.llm}" + (f"_{args.embeddings}" if args.embeddings in MODEL_EMBEDDINGS else "")
               + ("_calibrated" if args.thresholds == "calibrated" else ""))
    write_results(args.out or RESULTS / f"{default}.md", report)
    print(report)
    return figures


def thresholds_env(args) -> dict[str, str]:
    """The recall settings of ``--thresholds calibrated``: the model's shipped calibration."""
    if args.thresholds != "calibrated":
        return {}
    from embed_recall_dev import MODELS

    from eros.calibration import SHIPPED
    from eros.providers.offline import HashingEmbedder

    cal = SHIPPED[MODELS[args.embeddings] if args.embeddings in MODEL_EMBEDDINGS else HashingEmbedder.model]
    return {env: str(getattr(cal, field)) for field, env in CALIBRATED_ENV.items()}


def _run(args, users: list[dict], arms: list[Arm], configured: dict) -> dict:
    from eros import db as eros_db
    from eros import extraction

    # The bench's own database is migrated from scratch every run, so an edited migration cannot go stale.
    url = database(args.pgdata, url=args.database_url, from_scratch=True)
    with eros_db.connect(url, vector=False) as conn:  # every run starts from an empty engine
        conn.execute(EMPTY_ENGINE)
    pipeline = Pipeline(args, configured, url)
    try:
        with patched((extraction, "parse_extraction", pipeline.parse_for_arm)):
            for arm in arms:
                for user in users:
                    pipeline.run_user(arm, user)
    finally:
        pipeline.close()
    return summarise(arms)


class Pipeline:
    """The fakes, the handlers and the session the scripted model is answering for."""

    def __init__(self, args, configured: dict, url: str):
        test_helpers_on_path()
        from apiclient import Api
        from fakes import FakeOpenRouter, FakeVoyage

        from eros import db as eros_db
        from eros import extraction
        from eros_dev.lambda_runtime import load_function

        self.args, self.configured = args, configured
        self.current: dict = {}  # the session being extracted (the scripted model reads it)
        self.misses: list[dict] = []
        self.in_use: dict[str, dict] = {}
        self.parse = extraction.parse_extraction
        self.llm = FakeOpenRouter(self.respond)
        self.vectors = None
        if args.embeddings in MODEL_EMBEDDINGS:
            from long_history_eval import E5, e5_voyage

            self.vectors = E5(args.embed_python or EMBED_PYTHON[args.embeddings],
                              args.embed_cache or f"/tmp/eros-consolidation-{args.embeddings}.sqlite", args.embeddings)
            self.voyage = e5_voyage(self.vectors)
        else:
            self.voyage = FakeVoyage() if args.embeddings == "offline" else None
        os.environ["DATABASE_URL"] = url
        if self.voyage is not None:
            os.environ.update({"EMBED_BASE_URL": self.voyage.url, "VOYAGE_API_KEY": "bench"})
        else:
            os.environ.update({k: v for k, v in configured.items() if k in ("VOYAGE_API_KEY", "EMBED_BASE_URL") and v})
        self.extract = load_function("extract")
        eros_db.reset()
        self.api = Api()  # tests/apiclient.py: the chat handler with API Gateway events, as the tests call it

    def close(self) -> None:
        from eros import db as eros_db

        self.llm.close()
        if self.voyage is not None:
            self.voyage.close()
        if self.vectors is not None:
            self.vectors.close()
        eros_db.reset()

    def respond(self, body: dict) -> str:
        """The fake OpenRouter: chat replies, and the scripted extraction of the current session."""
        from eros import extraction

        messages = body["messages"]
        if messages[0].get("content") != extraction.SYSTEM_PROMPT:
            return CHAT_REPLY
        text = str(messages[-1].get("content") or "")
        block = text.split("</known_memories>", 1)[0] if "<known_memories>" in text else ""
        current = self.current
        arm = current["arm"]
        found = scripted_answer(current["session"], current["facts"], block, arm.consolidate, arm.script, self.misses)
        arm.misses.extend(dict(m, user=current["user"]) for m in self.misses)
        self.misses.clear()
        return found

    def parse_for_arm(self, answer: str):
        """The "before" arm for models we do not script: drop what they say about known memories."""
        parsed = self.parse(answer)
        if self.current.get("arm") is not None and not self.current["arm"].consolidate:
            parsed.candidates = [c.model_copy(update={"supersedes": [], "same_as": None}) for c in parsed.candidates]
        return parsed

    def use(self, phase: str) -> None:
        """Point the LLM at the fake (chat replies, scripted extraction), the offline stand-in or the
        configured model; the embedder stays as chosen. The LLM client is rebuilt only when that changes
        (a new HTTP client costs tens of ms: with the scripted model, chat and extraction share one)."""
        from eros import providers
        from eros.config import settings

        args, configured = self.args, self.configured
        llm_env = ({"LLM_BASE_URL": self.llm.url, "OPENROUTER_API_KEY": "bench"}
                   if phase == "chat" or args.llm == "scripted"
                   else {k: v for k, v in configured.items() if k in ("OPENROUTER_API_KEY", "LLM_BASE_URL") and v}
                   if args.llm == "configured" else {})
        if self.in_use.get("llm") == llm_env:
            return
        for name in ("OPENROUTER_API_KEY", "LLM_BASE_URL"):
            os.environ.pop(name, None)
        os.environ.update(llm_env)
        self.in_use["llm"] = llm_env
        settings.cache_clear()
        getattr(providers.chat_client, "cache_clear", providers.reset)()  # the embedder's client stays

    def call(self, method: str, path: str, body: dict, user: str) -> dict:
        status, answer = self.api.call(method, path, body, user=user)
        assert status in (200, 201), answer
        return answer

    def run_user(self, arm: Arm, user: dict) -> None:
        """Every session of one user, then the probes."""
        from eros import db as eros_db
        from eros import providers, recall

        uid = f"{arm.name}.{user['user']}"
        self.current.update(arm=arm, facts=user["facts"], user=uid)
        for n, session in enumerate(user["sessions"]):
            arm.sessions.append(self.run_session(n, session, uid))
        self.use("extract")
        _score_user(arm, user, uid, eros_db.connection(), providers, recall)

    def run_session(self, n: int, session: dict, uid: str) -> dict:
        """Chat the session through the chat handler at its scripted date, claim it, extract it; what it cost."""
        from eros import db as eros_db
        from eros import providers
        from eros.dreaming import session as session_job
        from eros.store import dreaming as store
        from eros_dev.lambda_runtime import LambdaContext

        llm, voyage = self.llm, self.voyage
        at = dt.datetime.fromisoformat(session["at"])
        self.current["session"] = session
        self.use("chat")
        sid = self.call("POST", "/v1/sessions", {"persona_id": PERSONA}, uid)["id"]
        for turn in session["turns"]:
            self.call("POST", f"/v1/sessions/{sid}/turns", {"content": turn}, uid)
        _backdate_turns(eros_db.connection(), sid, at)
        now = dt.datetime.now(dt.UTC)
        claimed = [r for r in store.claim(now, now - dt.timedelta(seconds=600), 50) if str(r["id"]) == sid]
        assert claimed, f"session {sid} of {uid} was not claimable"
        self.use("extract")
        wire = (llm.calls, voyage.calls if voyage else 0)
        with _counted_calls(providers) as seam:
            result = self.extract.lambda_handler(session_job.event(claimed[0]),
                                                 LambdaContext("extract", timeout_secs=120))
        llm_calls = llm.calls - wire[0] if self.args.llm == "scripted" else seam["llm"]
        embed_calls = voyage.calls - wire[1] if voyage else seam["embed"]
        _backdate_extraction(eros_db.connection(), sid, uid, at)
        expected = ("new" if any("same_as" not in m for m in session["memories"])
                    else "repeat-only" if session["memories"] else "nothing")
        return {"user": uid, "n": n, "expected": expected, "outcome": result["outcome"],
                "memories": result["memories"], "superseded": result["superseded"],
                "confirmed": result["confirmed"], "ignored": result["ignored"],
                "llm": llm_calls, "embed": embed_calls, "seam_llm": seam["llm"], "seam_embed": seam["embed"]}


def _counted_calls(providers):
    """Count provider calls at the client seam too (the only count for non-fake providers), for the block."""
    counts = {"llm": 0, "embed": 0}
    changes = []
    for kind, client, method in (("llm", providers.chat_client(), "complete"),
                                 ("embed", providers.embedder(), "embed")):
        original = getattr(client, method)

        def counted(*a, _original=original, _kind=kind, **kw):
            counts[_kind] += 1
            return _original(*a, **kw)

        changes.append((client, method, counted))
    return patched(*changes, result=counts)


def _backdate_turns(conn, sid: str, at: dt.datetime) -> None:
    """The session happened at the scripted time: its messages, relationship rows and activity."""
    conn.execute("UPDATE engine.chat_messages SET sent_at = %(at)s + (id - (SELECT min(id) FROM"
                 " engine.chat_messages WHERE session_id = %(sid)s)) * interval '20 seconds'"
                 " WHERE session_id = %(sid)s", {"at": at, "sid": sid})
    conn.execute("UPDATE engine.companion_memories SET created_at = %(at)s WHERE session_id = %(sid)s"
                 " AND instance_id IS NOT NULL", {"at": at, "sid": sid})
    conn.execute("UPDATE engine.chat_sessions SET created_at = %(at)s, last_active_at = %(at)s + interval"
                 " '10 minutes' WHERE id = %(sid)s", {"at": at, "sid": sid})


def _backdate_extraction(conn, sid: str, uid: str, at: dt.datetime) -> None:
    """The extraction ran 40 minutes after the session: its rows, and what it superseded or confirmed."""
    done = at + dt.timedelta(minutes=40)
    conn.execute("UPDATE engine.companion_memories SET created_at = %(done)s WHERE session_id = %(sid)s"
                 " AND instance_id IS NULL", {"done": done, "sid": sid})
    conn.execute("UPDATE engine.companion_memories SET superseded_at = %(done)s WHERE user_id = %(uid)s"
                 " AND superseded_at > %(done)s", {"done": done, "uid": uid})
    conn.execute("UPDATE engine.companion_memories SET last_confirmed_at = %(done)s WHERE user_id = %(uid)s"
                 " AND last_confirmed_at > %(done)s", {"done": done, "uid": uid})
    conn.execute("UPDATE engine.chat_sessions SET extracted_at = %(done)s WHERE id = %(sid)s"
                 " AND extracted_at IS NOT NULL", {"done": done, "sid": sid})


def _score_user(arm: Arm, user: dict, uid: str, conn, providers, recall) -> None:
    label = labeller(user)
    facts = user["facts"]
    end = dt.datetime.fromisoformat(user["sessions"][-1]["at"]) + dt.timedelta(days=1)
    rows = conn.execute("SELECT content, superseded_at IS NULL AS active FROM engine.companion_memories"
                        " WHERE user_id = %s AND instance_id IS NULL", (uid,)).fetchall()
    by_fact: dict[tuple, list[bool]] = collections.defaultdict(list)
    unlabelled = 0
    for r in rows:
        found = label(r["content"])
        if found is None:
            unlabelled += 1
        else:
            by_fact[found].append(r["active"])
    mentions = collections.Counter((m["fact"], m["version"]) for s in user["sessions"] for m in s["memories"])
    for name, f in facts.items():
        last = len(f["versions"]) - 1
        arm.facts.append({
            "user": uid, "fact": name, "kind": f["kind"], "repeated": mentions[(name, last)] >= 2,
            "rows": sum(len(by_fact[(name, v)]) for v in range(last + 1)),
            "current_active": sum(by_fact[(name, last)]),
            "stale_active": sum(sum(by_fact[(name, v)]) for v in range(last)),
        })
    arm.facts.append({"user": uid, "fact": None, "kind": "unlabelled", "rows": unlabelled})
    for probe in user["probes"]:
        last = len(facts[probe["fact"]]["versions"]) - 1
        query = providers.embedder().embed([probe["query"]], "query").vectors[0]
        recalled = recall.recall(uid, None, query, message=probe["query"], now=end).profile
        ranks = [label(r["content"]) for r in recalled]
        current = next((i for i, x in enumerate(ranks) if x == (probe["fact"], last)), None)
        old = next((i for i, x in enumerate(ranks) if x and x[0] == probe["fact"] and x[1] < last), None)
        arm.probes.append({"user": uid, "query": probe["query"], "current": current, "old": old,
                           "injected": len(recalled), "expected": facts[probe["fact"]]["versions"][last]["content"],
                           "top": [r["content"] for r in recalled[:4]]})


# --- figures ------------------------------------------------------------------------------------

def _rate(numerator: int, denominator: int) -> float | None:
    return None if denominator == 0 else numerator / denominator


def summarise(arms: list[Arm]) -> dict:
    out: dict = {"arms": {}}
    for arm in arms:
        probes, facts, sessions = arm.probes, arm.facts, arm.sessions
        kept = [f for f in facts if f["kind"] in ("stable", "trap", "filler") and f["rows"]]
        traps = [f for f in kept if f["kind"] == "trap"]
        repeated = [f for f in facts if f.get("repeated")]
        chains = [f for f in facts if f["kind"] == "chain"]
        groups: dict[str, dict] = {}
        for s in sessions:
            kind = "new" if s["memories"] else "repeat-only" if s["confirmed"] else "nothing"
            g = groups.setdefault(kind, {"sessions": 0, "llm": 0, "embed": 0, "calls": collections.Counter()})
            g["sessions"] += 1
            g["llm"] += s["llm"]
            g["embed"] += s["embed"]
            g["calls"][s["llm"] + s["embed"]] += 1
        target = {"new": 2, "repeat-only": 1, "nothing": 1}
        out["arms"][arm.name] = {
            "probes": len(probes),
            "current_above_superseded": _rate(sum(p["current"] is not None
                                                  and (p["old"] is None or p["current"] < p["old"])
                                                  for p in probes), len(probes)),
            "superseded_shown": _rate(sum(p["old"] is not None for p in probes), len(probes)),
            "current_injected": _rate(sum(p["current"] is not None for p in probes), len(probes)),
            "stable_facts": len(kept),
            "stable_kept": _rate(sum(f["current_active"] > 0 for f in kept), len(kept)),
            "false_supersession": _rate(sum(f["current_active"] == 0 for f in kept), len(kept)),
            "traps": len(traps),
            "traps_kept": _rate(sum(f["current_active"] > 0 for f in traps), len(traps)),
            "trap_bases_kept": _rate(sum(any(g["user"] == t["user"] and g["fact"] == facts_of(t)
                                             and g["current_active"] > 0 for g in kept) for t in traps), len(traps)),
            "repeated_facts": len(repeated),
            "active_per_repeated": _rate(sum(f["current_active"] for f in repeated), len(repeated)),
            "chains": len(chains),
            "chains_one_active": _rate(sum(f["current_active"] == 1 and f["stale_active"] == 0 for f in chains),
                                       len(chains)),
            "stale_active_rows": sum(f["stale_active"] for f in chains),
            "rows": sum(f["rows"] for f in facts),
            "unlabelled_rows": sum(f["rows"] for f in facts if f["kind"] == "unlabelled"),
            "sessions": len(sessions),
            "sessions_by_outcome": {k: {"sessions": g["sessions"], "llm": g["llm"], "embed": g["embed"],
                                        "calls": dict(sorted(g["calls"].items())), "target": target[k],
                                        "met": set(g["calls"]) == {target[k]}} for k, g in groups.items()},
            "calls_met": all(s["llm"] + s["embed"] == (2 if s["memories"] else 1) for s in sessions),
            "expected_matches_outcome": _rate(sum(
                (s["expected"] == "new") == bool(s["memories"]) for s in sessions), len(sessions)),
            "superseded_rows": sum(s["superseded"] for s in sessions),
            "confirmed": sum(s["confirmed"] for s in sessions),
            "ignored": sum(s["ignored"] for s in sessions),
            "script": dict(arm.script),
            "misses": len(arm.misses),
            "probe_details": probes,
            "wire_matches_seam": all((s["llm"], s["embed"]) == (s["seam_llm"], s["seam_embed"]) for s in sessions),
        }
    return out


def facts_of(trap: dict) -> str:
    return trap["fact"][: -len("_trap")]


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def render(args, command: str, users: list[dict], arms: list[Arm], figures: dict) -> str:
    names = [a.name for a in arms]
    cols = {"before": "before (consolidation off)", "after": "after (consolidation on)"}
    a = figures["arms"]
    header = "| | " + " | ".join(cols[n] for n in names) + " | target |"
    rule = "| --- | " + " | ".join("---:" for _ in names) + " | --- |"

    def row(title: str, key: str, fmt, target: str) -> str:
        return f"| {title} | " + " | ".join(fmt(a[n][key]) for n in names) + f" | {target} |"

    first = a[names[0]]
    script = figures["arms"].get("after", first)["script"]
    lines = [
        f"# Consolidation evaluation: `--llm {args.llm}`", "",
        f"* **Command:** `{command.strip()}`",
        f"* **Date:** {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"* **Machine:** {describe_machine(with_load=False)}",
        f"* **Data:** `{Path(args.data).relative_to(ROOT) if Path(args.data).is_relative_to(ROOT) else args.data}`: "
        f"{len(users)} users ({sum(u['lang'] == 'zh' for u in users)} Chinese, "
        f"{sum(u['heavy'] for u in users)} with > 30 memories), {sum(len(u['sessions']) for u in users)} sessions, "
        f"{sum(len(s['turns']) for u in users for s in u['sessions'])} user turns, "
        f"{sum(len(u['probes']) for u in users)} probes per arm.",
        f"* **Models:** extraction `{args.llm}`, embeddings `{args.embeddings}`"
        + (" (a fake Voyage on loopback answering the offline hashing vectors)" if args.embeddings == "offline" else
           " (a fake Voyage on loopback answering that model's vectors)" if args.embeddings in MODEL_EMBEDDINGS else "")
        + "; chat replies from a fake. Recall: " + (
            "the engine's defaults" if args.thresholds == "defaults" else
            "the model's calibration (`eros.calibration.SHIPPED`: " + ", ".join(
                f"{k}={v}" for k, v in thresholds_env(args).items()) + ")")
        + " (`eros.recall.recall`, profile layer, `now` = a day after the user's last session).",
        f"* **Run time:** {figures['seconds']} s for {len(arms)} arm(s).", "",
        "## Memory after all sessions, and recall on the probes", "",
        header, rule,
        row("current above superseded (probes)", "current_above_superseded", _pct, "≥ 95 %"),
        row("superseded version shown (probes)", "superseded_shown", _pct, "0 %"),
        row("current version injected (probes)", "current_injected", _pct, "100 %"),
        row("stable facts kept (stable, trap, filler)", "stable_kept", _pct, "≥ 99 %"),
        row("false supersession rate", "false_supersession", _pct, "≤ 1 %"),
        row("traps kept (the related newer fact)", "traps_kept", _pct, "100 %"),
        row("trap bases kept (the older fact)", "trap_bases_kept", _pct, "100 %"),
        row("active rows per repeated fact", "active_per_repeated", _num, "1.00"),
        row("update chains with exactly one active version", "chains_one_active", _pct, "100 %"),
        row("stale active rows (older chain versions)", "stale_active_rows", str, "0"),
        row("profile rows written (all versions)", "rows", str, ""),
        row("rows no fact label matches", "unlabelled_rows", str, "0"),
        row("rows superseded by extractions", "superseded_rows", str, ""),
        row("known rows confirmed (repeats, no new row)", "confirmed", str, ""),
        row("handles the engine ignored", "ignored", str, ""), "",
        f"Counts: {first['probes']} probes, {first['stable_facts']} stable/trap/filler facts ({first['traps']} traps), "
        f"{first['repeated_facts']} repeated facts, {first['chains']} update chains per arm. "
        , "",
        "## Provider calls per extracted session", "",
        "LLM + embedding calls of each extraction, " + (
            "counted on the fake servers (real HTTP)"
            if args.llm == "scripted" and args.embeddings in ("offline", *MODEL_EMBEDDINGS)
            else "counted on the fakes where there is one and at the provider clients otherwise") + "; the chat "
        "turns' own calls are not counted. A session is grouped by what the extraction did.", "",
        "| arm | sessions | outcome | LLM calls | embedding calls | calls per session | target |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    labels = {"new": "new memories written", "repeat-only": "only repeats (confirmed, no new row)",
              "nothing": "nothing to remember"}
    for n in names:
        for kind in ("new", "repeat-only", "nothing"):
            g = a[n]["sessions_by_outcome"].get(kind)
            if g:
                dist = ", ".join(f"{c}: {k}" for c, k in g["calls"].items())
                lines.append(f"| {n} | {g['sessions']} | {labels[kind]} | {g['llm']} | {g['embed']} | "
                             f"{dist} | {g['target']} ({'met' if g['met'] else 'NOT met'}) |")
    lines += ["", "* Calls per session on target in every session: "
              + ", ".join(f"{n} {'yes' if a[n]['calls_met'] else 'NO'}" for n in names)
              + "; wire counts equal the client-seam counts: "
              + ", ".join(f"{n} {'yes' if a[n]['wire_matches_seam'] else 'NO'}" for n in names) + "."]
    if args.llm == "scripted":
        lines += [f"* Scripted model, consolidation on: the earlier fact it was told to supersede was among the "
                  f"known memories shown in {script.get('supersedes shown', 0)} of {script.get('supersedes asked', 0)}"
                  f" cases, the one it was told to repeat in {script.get('same_as shown', 0)} of "
                  f"{script.get('same_as asked', 0)}. A fact that was not shown cannot be named: that is the "
                  "touched-memories query missing it.",
                  *[f"  * missed ({m['relation']}): {m['user']}, writing “{m['memory']}”, the earlier “{m['target']}” "
                    f"was not among the {m['shown']} known memories shown; the session's turns: "
                    + " / ".join(f"“{t}”" for t in m["turns"]) for m in arms[-1].misses[:20]],
                  "* Sessions whose outcome matches the script (new rows iff the script writes a new memory): "
                  + ", ".join(f"{n} {_pct(a[n]['expected_matches_outcome'])}" for n in names) + "."]
    failed = [p for p in arms[-1].probes if p["current"] is None or p["old"] is not None]
    if failed:
        lines += ["", f"## Probes where a superseded version reached the prompt or the current one was missing "
                      f"({arms[-1].name} arm, first 15 of {len(failed)})", "",
                  "| user | probe | current (expected) | its rank | best superseded rank | top recalled |",
                  "| --- | --- | --- | ---: | ---: | --- |"]
        for p in failed[:15]:
            top = " · ".join(t.replace("|", "/") for t in p["top"])
            lines.append(f"| {p['user']} | {p['query']} | {p['expected']} | "
                         f"{'—' if p['current'] is None else p['current'] + 1} | "
                         f"{'—' if p['old'] is None else p['old'] + 1} | {top} |")
    lines += ["", "<!-- notes -->", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    figures = run(argv)
    after = figures["arms"].get("after")
    return 0 if after is None or after["calls_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
