"""The session job: extract one claimed session into profile memories (the extract function's default event).

The work, once its lease is taken (``jobs.run``): the transcript from the watermark -> one LLM call per window ->
one embedding batch for the new rows and the session's episode -> one guarded transaction
(``store.dreaming.finish``) that writes them, applies their consolidation with what the user's memory already
holds, writes or rewrites the episode, and moves the watermark. The known memories are found by SQL, with no
provider call. The prompt, parser and plan are ``eros.extraction``.

The episode (migration 0021): each window's call is shown the episode so far (the one an earlier extraction of
the session wrote, then the one the previous window answered) and answers the whole updated one, so the last
answer that had a valid episode is the session's. An episode the answer lacks or that validation refuses is
skipped (logged, ``EpisodesRefused``): the memories of the same answer are written all the same.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from .. import calibrated, clock, usage
from .. import extraction as extraction_prompt
from ..config import Settings
from ..extraction import Candidate, Episode, windows
from ..memory import event_time
from ..observability import logger, metrics
from ..providers import Deadline, chat_client
from ..store import blocks as provider_blocks
from ..store import dreaming as dreaming_store
from ..store import usage as usage_store
from ..store.rows import ClaimedSession, EpisodeContext, Message
from . import jobs

CONTEXT_MESSAGES = 6  # earlier turns shown (marked) to a resumed session's extraction
WINDOW_CHARS = 24_000  # transcript characters per extraction call (~6k tokens)
MAX_WINDOWS = 4  # per invocation; the rest is taken by the next sweep from the new watermark
MESSAGES_PER_INVOCATION = 2_000


def event(claim: Mapping[str, Any]) -> dict:
    """The extract function's event for one claimed session (``functions/extract/app.py`` reads it)."""
    return {"session_id": str(claim["id"]), "user_id": claim["user_id"],
            "claim_token": claim["claim_token"].isoformat()}


# An invocation that extracted an imported session goes on with the user's next one while it has at least this
# long left (an extraction is one LLM call per window of the transcript and one embedding batch).
FOLLOW_SECS = 30.0
WRITTEN = ("extracted", "consolidated", "nothing", "unparsable")


def extract_session(cfg: Settings, user_id: str, session_id: UUID, claim_token: datetime,
                    time_budget_secs: float = 100.0, now: datetime | None = None) -> jobs.JobResult:
    """Extract one claimed session and consolidate it with what the user's memory already holds. Then, while
    ``time_budget_secs`` leaves FOLLOW_SECS, the user's next imported session (an imported history's sessions are
    dreamt one at a time, oldest first: store.dreaming's claim), claimed as the sweep would claim it, so that an
    imported history is distilled at the pace of its extractions rather than one session a sweep. The result is
    the first session's, with ``followed``."""
    started = time.monotonic()
    result = jobs.run(SESSION, cfg, {"user_id": user_id, "id": session_id}, claim_token, time_budget_secs, now)
    outcome = result.outcome
    while outcome in WRITTEN:
        left = time_budget_secs - (time.monotonic() - started)
        moment = now or clock.now()
        following = dreaming_store.claim_next_imported(user_id, moment, **_cutoffs(cfg, moment)) \
            if left >= FOLLOW_SECS else None
        if following is None:
            break
        outcome = jobs.run(SESSION, cfg, {"user_id": user_id, "id": following["id"]}, following["claim_token"],
                           left, now).outcome
        result.followed += 1
    return result


def _extract(cfg: Settings, job: jobs.Job, time_budget_secs: float) -> jobs.JobResult:
    session: ClaimedSession = job.row  # type: ignore[assignment]  # the row of SESSIONS' claim
    session_id, user = session["id"], session["user_id"]
    earlier, new = dreaming_store.transcript(user, session_id, session["extraction_watermark"],
                                             CONTEXT_MESSAGES, MESSAGES_PER_INVOCATION)
    if not new:
        if dreaming_store.finish(session, job.claim_token, [], None, dreaming_store.NOTHING_TO_REMEMBER) is None:
            return job.lost()
        return job.report("nothing")
    parts = windows(new, WINDOW_CHARS)[:MAX_WINDOWS]
    first, watermark = parts[0][0]["id"], parts[-1][-1]["id"]
    shown = extraction_prompt.handles(dreaming_store.touched_memories(user, session_id, session["extraction_watermark"],
                                                                      extraction_prompt.MAX_KNOWN))
    context = dreaming_store.episode_context(user, session_id)
    # Before any paid call: what this embedder writes could not be stored beside vectors of another model (a
    # configuration fault: dreaming holds until EMBED_MODEL is the stored vectors' again).
    job.step = "embedder"
    calibrated.embedder()  # the stored vectors' model can be embedded with, or nothing is paid
    job.step = "llm"
    deadline = Deadline.after(time_budget_secs)
    answers = _answers(cfg, earlier, parts, shown, context, deadline, job)
    provider_blocks.unblock("llm")  # it answered: whatever block it had is over
    decided = extraction_prompt.plan(answers.candidates, shown)
    job.step = "embedder"
    rows, episode = _rows(decided, answers, context, deadline, (first, watermark), session)
    if rows or episode:
        provider_blocks.unblock("embedder")

    # Zero candidates or unparsable output still stamp: a poison pill must not loop.
    problems = answers.problems
    error = "; ".join(problems) or (None if rows or episode or decided.confirm
                                           else dreaming_store.NOTHING_TO_REMEMBER)
    counts = dreaming_store.finish(session, job.claim_token, rows, watermark, error, decided.confirm, first,
                                   decided.told, episode)
    if counts is None:
        return job.lost()
    for name, value in (("MemoriesExtracted", len(rows)), ("MemoriesSuperseded", counts["superseded"]),
                        ("MemoriesConfirmed", counts["confirmed"]),
                        ("ConsolidationIgnored", counts["ignored"] + decided.ignored),
                        ("EpisodesWritten", counts["episode"] is not None),
                        ("EpisodesRefused", len(answers.refused))):
        metrics.add_metric(name=name, unit="Count", value=int(value))
    outcome = ("extracted" if rows or episode else "consolidated" if decided.confirm
               else "unparsable" if problems else "nothing")
    result = jobs.JobResult(SESSION.name, user, outcome, str(session_id), llm_calls=job.llm_calls,
                            memories=len(rows), superseded=counts["superseded"], confirmed=counts["confirmed"],
                            ignored=counts["ignored"] + decided.ignored,
                            episode=counts["episode"] or ("refused" if answers.refused else None))
    return jobs.report(SESSION, result, known_shown=len(shown))


@dataclass
class Answers:
    """What a session's calls answered: every window's candidates, the parse problems, the episode of the last
    window that gave a valid one (and the last message it covers), the episodes refused, the model."""

    model: str
    candidates: list[Candidate] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    episode: Episode | None = None
    episode_through: int | None = None
    days: tuple[date | None, date | None] = (None, None)  # the days of the episode's new messages, first and last
    refused: list[str] = field(default_factory=list)


def _answers(cfg: Settings, earlier: list[Message], parts: list[list[Message]],
             shown: Mapping[str, Mapping[str, Any]], context: EpisodeContext, deadline: Deadline, job: jobs.Job
             ) -> Answers:
    """One LLM call per window, each shown the episode so far; calls counted in ``job`` as they are made (a later
    window's failure still reports what was paid)."""
    llm = chat_client()
    out = Answers(cfg.extract_model)
    so_far = context["episode"]
    for part in parts:
        completion = llm.complete(cfg.extract_model, [
            {"role": "system", "content": extraction_prompt.SYSTEM_PROMPT},
            {"role": "user", "content": extraction_prompt.render_transcript(
                earlier, part, shown, persona=context["persona_name"], episode_so_far=so_far)},
        ], max_tokens=1200, temperature=0.0, deadline=deadline, json_mode=True)
        job.llm_calls += 1
        usage.spend(job.row["user_id"], usage_store.Call.of("extraction", completion),
                    held_by=("session", job.row["id"]))  # type: ignore[typeddict-item]
        out.model = completion.model
        try:
            parsed = extraction_prompt.parse_extraction(completion.text)
        except extraction_prompt.Unparsable as exc:
            out.problems.append(f"unparsable model output: {exc}")
        else:
            out.candidates.extend(parsed.candidates)
            if parsed.episode is not None:
                out.episode, out.episode_through, so_far = parsed.episode, part[-1]["id"], parsed.episode.content
                out.days = day_of(parts[0][0]), day_of(part[-1])
            elif parsed.episode_refused:  # the memories of the same answer are kept
                out.refused.append(parsed.episode_refused)
                logger.warning("an extracted episode was refused", extra={
                    "session_id": str(job.row["id"]), "problem": parsed.episode_refused})  # type: ignore[typeddict-item]
        earlier = part[-CONTEXT_MESSAGES:]
    return out


def day_of(message: Message) -> date | None:
    """The (UTC) day a message was sent on, as the transcript's day lines give it."""
    sent = message.get("sent_at")
    return sent.astimezone(UTC).date() if sent else None


def _rows(decided: extraction_prompt.Plan, answers: Answers, context: EpisodeContext, deadline: Deadline,
          read: tuple[int, int], session: ClaimedSession) -> tuple[list[dict], dict | None]:
    """The new profile rows and the episode, embedded in one batch (none when the session only repeated known
    memories and had no episode)."""
    episode = answers.episode
    texts = [c.content for c, _ in decided.new] + ([episode.content] if episode else [])
    if not texts:
        return [], None
    vectors = calibrated.embedder().embed(texts, "document", deadline=deadline)
    usage.spend(session["user_id"], usage_store.Call.of("extraction", vectors),
                held_by=("session", session["id"]))
    metadata = {"model": answers.model, "embed_model": vectors.model}
    rows = [{"id": uuid4(), "content": c.content, "category": c.category, "importance": c.importance,
             "occurred": c.occurred_at, "embedding": v, "supersedes": supersedes, "from_message_id": read[0],
             "through_message_id": read[1], "metadata": metadata}
            for (c, supersedes), v in zip(decided.new, vectors.vectors[:len(decided.new)], strict=True)]
    if episode is None:
        return rows, None
    before = event_time(context["occurred_at"], context["occurred_precision"])
    return rows, {"content": episode.content, "embedding": vectors.vectors[-1], "from_message_id": read[0],
                  "through_message_id": answers.episode_through, "metadata": metadata,
                  "occurred": episode.event_time(*answers.days, before)}


def _cutoffs(cfg: Settings, moment: datetime) -> dict[str, datetime]:
    return {"idle_before": moment - timedelta(seconds=cfg.dreaming_idle_secs),
            "stale_before": moment - timedelta(seconds=cfg.dreaming_claim_stale_secs)}


SESSION = jobs.Kind("session", "extract", dreaming_store.SESSIONS, _cutoffs, event,
                    lambda cfg: cfg.dreaming_max_attempts, _extract)
