"""Event time evaluation: sessions that say when something happened ("last week", "in 2019", "去年", "明天"),
through the real chat handler, claim and extract handler, scored on the event time stored with the memory.

    .venv/bin/python bench/event_time_eval.py                     # scripted model (what the tests use)
    .venv/bin/python bench/event_time_eval.py --llm offline       # the offline stand-in's few time words
    .venv/bin/python bench/event_time_eval.py --llm configured    # the real model: OPENROUTER_API_KEY
    .venv/bin/python bench/event_time_eval.py --cases en-01,zh-03 # a slice

The cases are ``bench/event_time_dev.jsonl``: one short session each, in English or Chinese, sent at a
known moment (``said_at``, UTC; turns 20 s apart, replies between them), with the memory it should leave
and its expected event time in the API's form (``expected``: "2026-W47", "2025-12", "2019", "2026-11-26",
or null when the session names no time). They cover the relative words (yesterday, tomorrow, last/next
week, last month, last year, 上周, 明天, 去年 ...) across month, year and ISO-week boundaries, absolute
dates of each precision ("in March 2021", "2018年5月12日"), a weekday ("on Friday"), a session that crosses
midnight, and sessions with no time at all.

Each session is chatted through the chat Lambda's handler, its messages moved to ``said_at``, claimed
(``eros.store.dreaming.claim``) and extracted by the extract Lambda's handler; then the session's profile
rows are read back. A case is right when the distinct event times of its rows are exactly the expected
one (same day and precision), or none for a case without a time.

``--llm``: ``scripted`` -- a fake OpenRouter on loopback (``tests/fakes.py``) answers each extraction with the
case's memory and expected time, but names the time only when the transcript it was sent shows the date of
the turn that said it: the figures measure the pipeline (the transcript's dates, the parse, the guarded
write, the stored columns), not a model. ``offline`` -- the engine's offline stand-in
(``eros.providers.offline.resolve_when``). ``configured`` -- the real model from OPENROUTER_API_KEY /
LLM_BASE_URL. Chat replies always come from the fake; embeddings from a fake Voyage speaking the offline
hashing vectors. Also reported: whether the session left a memory, and whether a relative time word stayed
in a memory's text (the prompt asks the model to keep them out; the offline stand-in quotes the user).
Results: ``bench/results/event_time_eval_<llm>.md`` (``--out``); text below its ``<!-- notes -->`` line is
kept by re-runs. The bench's own database (``--pgdata``) is migrated from scratch every run;
``--database-url`` (the tests) is only emptied.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass
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
    test_helpers_on_path,
    write_results,
)

DATA = ROOT / "bench" / "event_time_dev.jsonl"
CHAT_REPLY = "I'm listening."
TURN_GAP = dt.timedelta(seconds=20)  # between a session's messages (user, reply, user, ...)


def load_cases(path: Path = DATA, only: list[str] | None = None) -> list[dict]:
    cases = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if only:
        missing = set(only) - {c["id"] for c in cases}
        if missing:
            raise SystemExit(f"unknown cases: {', '.join(sorted(missing))}")
        cases = [c for c in cases if c["id"] in only]
    return cases


def last_turn_at(case: dict) -> dt.datetime:
    """When the case's last user turn was sent: its time word is resolved against that day."""
    return dt.datetime.fromisoformat(case["said_at"]) + 2 * (len(case["turns"]) - 1) * TURN_GAP


def scripted_answer(case: dict, transcript: str) -> str:
    """The scripted extraction: the case's memory, with its expected time if the transcript dates the turn."""
    from eros.extraction import day_line

    dated = day_line(last_turn_at(case).astimezone(dt.UTC).date()) in transcript.split("<session>", 1)[-1]
    return json.dumps({"memories": [{"content": case["memory"], "category": case["category"], "importance": 0.6,
                                     "occurred_at": case["expected"] if dated else None}]}, ensure_ascii=False)


@dataclass
class Outcome:
    case: dict
    got: list[str]  # the distinct event times of the session's profile rows, in the API's form
    rows: int
    relative_left: bool  # a relative time word of the session is in a stored memory's text

    @property
    def right(self) -> bool:
        return self.got == ([self.case["expected"]] if self.case["expected"] else [])


class Pipeline:
    """The fakes, the handlers, and the case the scripted model is answering for."""

    def __init__(self, llm_choice: str, configured: dict, url: str):
        test_helpers_on_path()
        from apiclient import Api
        from fakes import FakeOpenRouter, FakeVoyage

        from eros_dev.lambda_runtime import load_function

        self.choice, self.configured = llm_choice, configured
        self.current: dict = {}
        self.llm, self.voyage = FakeOpenRouter(self.respond), FakeVoyage()
        os.environ.update({"DATABASE_URL": url, "EMBED_BASE_URL": self.voyage.url, "VOYAGE_API_KEY": "bench"})
        self.in_use: dict | None = None
        self.use("chat")
        self.extract = load_function("extract")
        self.api = Api()

    def close(self) -> None:
        self.llm.close()
        self.voyage.close()

    def respond(self, body: dict) -> str:
        from eros import extraction

        if body["messages"][0].get("content") != extraction.SYSTEM_PROMPT:
            return CHAT_REPLY
        return scripted_answer(self.current, str(body["messages"][-1].get("content") or ""))

    def use(self, phase: str) -> None:
        """Chat replies from the fake; extraction from the fake (scripted), the offline stand-in (no LLM
        configured) or the configured model. The clients are rebuilt only when that changes."""
        from eros import providers
        from eros.config import settings

        env = ({"LLM_BASE_URL": self.llm.url, "OPENROUTER_API_KEY": "bench"} if phase == "chat"
               or self.choice == "scripted" else {k: v for k, v in self.configured.items()
                                                 if k in ("OPENROUTER_API_KEY", "LLM_BASE_URL") and v}
               if self.choice == "configured" else {})
        if env == self.in_use:
            return
        for name in ("OPENROUTER_API_KEY", "LLM_BASE_URL"):
            os.environ.pop(name, None)
        os.environ.update(env)
        self.in_use = env
        settings.cache_clear()  # the database connection stays
        providers.reset()

    def run(self, case: dict) -> Outcome:
        """Chat the case's session, date it, claim it, extract it; read back what was stored."""
        from eros import db as eros_db
        from eros.dreaming import session as session_job
        from eros.memory import event_time_text
        from eros.store import dreaming as store
        from eros_dev.lambda_runtime import LambdaContext

        user = f"eval.{case['id']}"
        self.current = case
        self.use("chat")
        sid = self._call("POST", "/v1/sessions", {"persona_id": "luna"}, user)["id"]
        for turn in case["turns"]:
            self._call("POST", f"/v1/sessions/{sid}/turns", {"content": turn}, user)
        conn = eros_db.connection()
        conn.execute("UPDATE engine.chat_messages SET sent_at = %(at)s + (id - (SELECT min(id)"
                     " FROM engine.chat_messages WHERE session_id = %(sid)s)) * %(gap)s WHERE session_id = %(sid)s",
                     {"at": dt.datetime.fromisoformat(case["said_at"]), "gap": TURN_GAP, "sid": sid})
        conn.execute("UPDATE engine.chat_sessions SET last_active_at = now() - interval '1 hour' WHERE id = %s", (sid,))
        now = dt.datetime.now(dt.UTC)
        [claimed] = [r for r in store.claim(now, now - dt.timedelta(seconds=600), 50) if str(r["id"]) == sid]
        self.use("extract")
        self.extract.lambda_handler(session_job.event(claimed), LambdaContext("extract", timeout_secs=120))
        rows = conn.execute("SELECT content, occurred_at, occurred_precision FROM engine.companion_memories"
                            " WHERE session_id = %s AND instance_id IS NULL", (sid,)).fetchall()
        got = sorted({t for r in rows if (t := event_time_text(r["occurred_at"], r["occurred_precision"]))})
        left = any(word.casefold() in r["content"].casefold() for r in rows for word in case["relative"])
        return Outcome(case, got, len(rows), left)

    def _call(self, method: str, path: str, body: dict, user: str) -> dict:
        status, answer = self.api.call(method, path, body, user=user)
        assert status in (200, 201), answer
        return answer


def run(argv: list[str] | None = None) -> dict:
    """Parse the arguments, run every case, write the report; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm", choices=("scripted", "offline", "configured"), default="scripted")
    parser.add_argument("--cases", default="", help="comma-separated case ids (default: all)")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--pgdata", default="/tmp/eros-bench-event-time")
    add_database_url_option(parser)
    parser.add_argument("--out", default="", help="markdown results (default bench/results/event_time_eval_<llm>.md;"
                                                   " '-' for none)")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    cases = load_cases(Path(args.data), [c for c in args.cases.split(",") if c] or None)
    configured = {name: os.environ.get(name) for name in PROVIDER_ENV}
    if args.llm == "configured" and not (configured["OPENROUTER_API_KEY"] or configured["LLM_BASE_URL"]):
        raise SystemExit("--llm configured needs OPENROUTER_API_KEY (or LLM_BASE_URL for an OpenAI-compatible "
                         "server) in the environment; none is set. Use --llm scripted or --llm offline.")
    started = time.monotonic()
    with bench_environment(POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true",
                           PROVIDER_MAX_RETRIES="2"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No application metrics to publish")
        with contextlib.redirect_stdout(io.StringIO()):  # Powertools prints its metrics blobs
            outcomes = _run(args, cases, configured)
    figures = summarise(outcomes) | {"llm": args.llm, "seconds": round(time.monotonic() - started, 1)}
    report = render(args, command, outcomes, figures)
    write_results(args.out or RESULTS / f"event_time_eval_{args.llm}.md", report)
    print(report)
    return figures


def _run(args, cases: list[dict], configured: dict) -> list[Outcome]:
    from eros import db as eros_db

    # The bench's own database is migrated from scratch every run, so an edited migration cannot go stale.
    url = database(args.pgdata, url=args.database_url, from_scratch=True)
    with eros_db.connect(url, vector=False) as conn:  # every run starts from an empty engine
        conn.execute(EMPTY_ENGINE)
    pipeline = Pipeline(args.llm, configured, url)
    try:
        return [pipeline.run(case) for case in cases]
    finally:
        pipeline.close()


def _rate(right: int, of: int) -> float | None:
    return None if of == 0 else right / of


def summarise(outcomes: list[Outcome]) -> dict:
    """Exact-match rates overall, per language and for cases with and without a time."""
    groups = {"all": outcomes, "English": [o for o in outcomes if o.case["lang"] == "en"],
              "Chinese": [o for o in outcomes if o.case["lang"] == "zh"],
              "with a time": [o for o in outcomes if o.case["expected"]],
              "without a time": [o for o in outcomes if not o.case["expected"]]}
    said = [o for o in outcomes if o.case["relative"]]
    return {"groups": {name: {"cases": len(group), "right": sum(o.right for o in group),
                              "exact": _rate(sum(o.right for o in group), len(group)),
                              "remembered": _rate(sum(o.rows > 0 for o in group), len(group))}
                       for name, group in groups.items()},
            "relative_cases": len(said), "relative_left": sum(o.relative_left for o in said)}


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def render(args, command: str, outcomes: list[Outcome], figures: dict) -> str:
    data = Path(args.data)
    lines = [
        f"# Event time evaluation: `--llm {args.llm}`", "",
        f"* **Command:** `{command.strip()}`",
        f"* **Date:** {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"* **Machine:** {describe_machine(with_load=False)}",
        f"* **Data:** `{data.relative_to(ROOT) if data.is_relative_to(ROOT) else data}`: {len(outcomes)} sessions "
        f"({figures['groups']['English']['cases']} English, {figures['groups']['Chinese']['cases']} Chinese; "
        f"{figures['groups']['without a time']['cases']} without a time).",
        f"* **Models:** extraction `{args.llm}`; chat replies from a fake, embeddings from a fake Voyage (the "
        "offline hashing vectors).",
        f"* **Run time:** {figures['seconds']} s.", "",
        "## Exact match of the stored event time (day and precision)", "",
        "| cases | sessions | right | exact match | left a memory |", "| --- | ---: | ---: | ---: | ---: |",
        *[f"| {name} | {g['cases']} | {g['right']} | {_pct(g['exact'])} | {_pct(g['remembered'])} |"
          for name, g in figures["groups"].items()], "",
        f"A relative time word stayed in a memory's text in {figures['relative_left']} of the "
        f"{figures['relative_cases']} sessions that used one.", "",
        "## Per session", "",
        "| case | sent (UTC) | what the user said | expected | stored | |", "| --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        said = " / ".join(o.case["turns"]).replace("|", "/")
        lines.append(f"| {o.case['id']} | {last_turn_at(o.case):%a %Y-%m-%d %H:%M} | {said} | "
                     f"{o.case['expected'] or '—'} | {', '.join(o.got) or ('—' if o.rows else 'no memory')} | "
                     f"{'✓' if o.right else '✗'} |")
    lines += ["", "<!-- notes -->", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Non-zero when the scripted run misses a case: the pipeline lost a time a model gave it. A model's
    misses are what the evaluation measures, not a failure of the run."""
    figures = run(argv)
    every = figures["groups"]["all"]
    return 1 if figures["llm"] == "scripted" and every["right"] < every["cases"] else 0


if __name__ == "__main__":
    sys.exit(main())
