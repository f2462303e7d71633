"""The session job: extract one claimed session into profile memories (the extract function's default event).

The work, once its lease is taken (``jobs.run``): the transcript from the watermark -> one LLM call per window ->
one embedding batch for the new rows -> one guarded transaction (``store.dreaming.finish``) that writes them,
applies their consolidation with what the user's memory already holds, and moves the watermark. The known
memories are found by SQL, with no provider call. The prompt, parser and plan are ``eros.extraction``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from .. import extraction as extraction_prompt
from .. import usage
from ..config import Settings
from ..extraction import Candidate, windows
from ..observability import metrics
from ..providers import Deadline, chat_client, embedder
from ..store import blocks as provider_blocks
from ..store import dreaming as dreaming_store
from ..store import usage as usage_store
from ..store.rows import ClaimedSession, Message
from . import jobs

CONTEXT_MESSAGES = 6  # earlier turns shown (marked) to a resumed session's extraction
WINDOW_CHARS = 24_000  # transcript characters per extraction call (~6k tokens)
MAX_WINDOWS = 4  # per invocation; the rest is taken by the next sweep from the new watermark
MESSAGES_PER_INVOCATION = 2_000


def event(claim: Mapping[str, Any]) -> dict:
    """The extract function's event for one claimed session (``functions/extract/app.py`` reads it)."""
    return {"session_id": str(claim["id"]), "user_id": claim["user_id"],
            "claim_token": claim["claim_token"].isoformat()}


def extract_session(cfg: Settings, user_id: str, session_id: UUID, claim_token: datetime,
                    time_budget_secs: float = 100.0, now: datetime | None = None) -> jobs.JobResult:
    """Extract one claimed session and consolidate it with what the user's memory already holds."""
    return jobs.run(SESSION, cfg, {"user_id": user_id, "id": session_id}, claim_token, time_budget_secs, now)


def _extract(cfg: Settings, job: jobs.Job, time_budget_secs: float) -> jobs.JobResult:
    session: ClaimedSession = job.row  # type: ignore[assignment]  # the row of SESSIONS' claim
    session_id, user = session["id"], session["user_id"]
    earlier, new = dreaming_store.transcript(user, session_id, session["extraction_watermark"],
                                             CONTEXT_MESSAGES, MESSAGES_PER_INVOCATION)
    if not new:
        if dreaming_store.finish(session, job.claim_token, [], None, None) is None:
            return job.lost()
        return job.report("nothing")
    parts = windows(new, WINDOW_CHARS)[:MAX_WINDOWS]
    first, watermark = parts[0][0]["id"], parts[-1][-1]["id"]
    shown = extraction_prompt.handles(dreaming_store.touched_memories(user, session_id, session["extraction_watermark"],
                                                                      extraction_prompt.MAX_KNOWN))
    deadline = Deadline.after(time_budget_secs)
    candidates, problems, model = _candidates(cfg, earlier, parts, shown, deadline, job)
    provider_blocks.unblock("llm")  # it answered: whatever block it had is over
    decided = extraction_prompt.plan(candidates, shown)
    job.step = "embedder"
    rows = _rows(decided, model, deadline, first, watermark, session)
    if rows:
        provider_blocks.unblock("embedder")

    # Zero candidates or unparsable output still stamp: a poison pill must not loop.
    error = "; ".join(problems) or (None if rows or decided.confirm else "no memories in this session")
    counts = dreaming_store.finish(session, job.claim_token, rows, watermark, error, decided.confirm, first,
                                   decided.told)
    if counts is None:
        return job.lost()
    for name, value in (("MemoriesExtracted", len(rows)), ("MemoriesSuperseded", counts["superseded"]),
                        ("MemoriesConfirmed", counts["confirmed"]),
                        ("ConsolidationIgnored", counts["ignored"] + decided.ignored)):
        metrics.add_metric(name=name, unit="Count", value=value)
    result = jobs.JobResult(SESSION.name, user, "extracted" if rows else "consolidated" if decided.confirm
                            else "unparsable" if problems else "nothing", str(session_id), llm_calls=job.llm_calls,
                            memories=len(rows), superseded=counts["superseded"], confirmed=counts["confirmed"],
                            ignored=counts["ignored"] + decided.ignored)
    return jobs.report(SESSION, result, known_shown=len(shown))


def _candidates(cfg: Settings, earlier: list[Message], parts: list[list[Message]],
                shown: Mapping[str, Mapping[str, Any]], deadline: Deadline, job: jobs.Job
                ) -> tuple[list[Candidate], list[str], str]:
    """One LLM call per window: (candidates, parse problems, the model that answered); calls counted in
    ``job`` as they are made (a later window's failure still reports what was paid)."""
    llm = chat_client()
    candidates: list[Candidate] = []
    problems: list[str] = []
    model = cfg.extract_model
    for part in parts:
        completion = llm.complete(cfg.extract_model, [
            {"role": "system", "content": extraction_prompt.SYSTEM_PROMPT},
            {"role": "user", "content": extraction_prompt.render_transcript(earlier, part, shown)},
        ], max_tokens=1200, temperature=0.0, deadline=deadline, json_mode=True)
        job.llm_calls += 1
        usage.spend(job.row["user_id"], usage_store.Call.of("extraction", completion),
                    held_by=("session", job.row["id"]))  # type: ignore[typeddict-item]
        model = completion.model
        try:
            candidates.extend(extraction_prompt.parse_candidates(completion.text))
        except extraction_prompt.Unparsable as exc:
            problems.append(f"unparsable model output: {exc}")
        earlier = part[-CONTEXT_MESSAGES:]
    return candidates, problems, model


def _rows(decided: extraction_prompt.Plan, model: str, deadline: Deadline, first: int, last: int,
          session: ClaimedSession) -> list[dict]:
    """The new profile rows, embedded in one batch (none when the session only repeated known memories)."""
    if not decided.new:
        return []
    vectors = embedder().embed([c.content for c, _ in decided.new], "document", deadline=deadline)
    usage.spend(session["user_id"], usage_store.Call.of("extraction", vectors),
                held_by=("session", session["id"]))
    return [{"id": uuid4(), "content": c.content, "category": c.category, "importance": c.importance,
             "occurred": c.occurred_at, "embedding": v, "supersedes": supersedes, "from_message_id": first,
             "through_message_id": last, "metadata": {"model": model, "embed_model": vectors.model}}
            for (c, supersedes), v in zip(decided.new, vectors.vectors, strict=True)]


def _cutoffs(cfg: Settings, moment: datetime) -> dict[str, datetime]:
    return {"idle_before": moment - timedelta(seconds=cfg.dreaming_idle_secs),
            "stale_before": moment - timedelta(seconds=cfg.dreaming_claim_stale_secs)}


SESSION = jobs.Kind("session", "extract", dreaming_store.SESSIONS, _cutoffs, event,
                    lambda cfg: cfg.dreaming_max_attempts, _extract)
