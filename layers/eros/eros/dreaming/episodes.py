"""The backfill of episodes: on a database of an earlier release, the sessions extracted before episodes existed have
none. ``backfill`` writes one for each (``eros backfill-episodes``): one LLM call over the session's transcript as
extraction read it (up to its watermark; its first window, ``session.WINDOW_CHARS``, for a very long session: the
episode's message range says so) with the episode prompt alone, one embedding, one write under the user's memory
lock that never replaces an episode a resumed extraction wrote meanwhile.

Bounded as dreaming is: a user whose daily token budget is spent (or held by turns in flight, what a turn's
admission reads) is skipped for this run (``deferred``), and every call is counted on the user's day
(purpose 'extraction') while the session exists. Sessions whose transcript retention already cut are skipped
(``retention_skipped``): an episode of part of a session would say less than it seems to. A provider failure
skips its session for this run; the next run takes it again (a session with an episode is never taken twice).

It runs in the operator's process, in batches of ``limit`` sessions, oldest first, and can be stopped and run
again at any time. It is not a claimed dreaming job (``jobs.Kind``): no sweep runs it, so a deployed stack pays
nothing for it until an operator asks; a session the sweep claims meanwhile is left to its extraction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .. import apps, calibrated, clock, usage
from .. import extraction as extraction_prompt
from ..config import Settings
from ..extraction import windows
from ..observability import logger, metrics
from ..providers import Deadline, ProviderError, chat_client
from ..store import dreaming as dreaming_store
from ..store import usage as usage_store
from ..store.rows import Message
from .jobs import describe_failure
from .session import MESSAGES_PER_INVOCATION, WINDOW_CHARS, day_of


@dataclass
class Backfilled:
    """What one run did: episodes written; sessions the model had no episode for, or whose episode was refused;
    sessions of users over their budget; sessions retention cut; provider failures; calls paid."""

    written: int = 0
    no_episode: int = 0
    refused: int = 0
    deferred: int = 0
    retention_skipped: int = 0
    failed: int = 0
    llm_calls: int = 0
    embedding_calls: int = 0
    deferred_users: list[str] = field(default_factory=list)


def backfill(cfg: Settings, user_id: str | None = None, limit: int = 100, now: datetime | None = None,
             time_budget_secs: float = 60.0, *, app: str | None = None) -> Backfilled:
    """Write the episodes of up to ``limit`` extracted sessions that have none (of ``user_id``, or everyone's:
    of ``app`` when one is named)."""
    done = Backfilled(retention_skipped=len(dreaming_store.sessions_without_episode(user_id, limit, whole=False,
                                                                                    app=app)))
    base = cfg
    for session in dreaming_store.sessions_without_episode(user_id, limit, app=app):
        user = session["user_id"]
        cfg = apps.settings_for(user, base)  # the user's app's budget and extraction model
        if user in done.deferred_users or usage_store.held_until(user, now or clock.now(), cfg.daily_token_budget):
            done.deferred += 1
            if user not in done.deferred_users:
                done.deferred_users.append(user)
            continue
        try:
            outcome = _episode(cfg, session, done, time_budget_secs)
        except ProviderError as exc:  # skipped for this run: the next run takes it again
            done.failed += 1
            logger.warning("an episode backfill call failed", extra={"user_id": user, "session_id": str(session["id"]),
                                                                     "error": describe_failure(exc)})
            continue
        setattr(done, outcome, getattr(done, outcome) + 1)
    metrics.add_metric(name="EpisodesBackfilled", unit="Count", value=done.written)
    logger.info("episode backfill done", extra={k: v for k, v in done.__dict__.items() if k != "deferred_users"})
    return done


def _episode(cfg: Settings, session: dict[str, Any], done: Backfilled, time_budget_secs: float) -> str:
    user, session_id = session["user_id"], session["id"]
    calibrated.embedder()  # an episode's vector beside the stored ones: their model's embedder, or nothing paid
    _, messages = dreaming_store.transcript(user, session_id, None, 0, MESSAGES_PER_INVOCATION)
    read: list[Message] = [m for m in messages if m["id"] <= session["extraction_watermark"]]
    if not read:
        return "no_episode"
    part = windows(read, WINDOW_CHARS)[0]
    context = dreaming_store.episode_context(user, session_id)
    deadline = Deadline.after(time_budget_secs)
    completion = chat_client().complete(cfg.extract_model, [
        {"role": "system", "content": extraction_prompt.EPISODE_PROMPT},
        {"role": "user", "content": extraction_prompt.render_transcript([], part, persona=context["persona_name"])},
    ], max_tokens=300, temperature=0.0, deadline=deadline, json_mode=True)
    done.llm_calls += 1
    usage.spend(user, usage_store.Call.of("extraction", completion), held_by=("session", session_id))
    try:
        parsed = extraction_prompt.parse_extraction(completion.text)
    except extraction_prompt.Unparsable:
        return "no_episode"
    if parsed.episode is None:
        return "refused" if parsed.episode_refused else "no_episode"
    vectors = calibrated.embedder().embed([parsed.episode.content], "document", deadline=deadline)
    done.embedding_calls += 1
    usage.spend(user, usage_store.Call.of("extraction", vectors), held_by=("session", session_id))
    written = dreaming_store.add_episode(session, {
        "content": parsed.episode.content, "embedding": vectors.vectors[0], "from_message_id": part[0]["id"],
        "through_message_id": part[-1]["id"], "occurred": parsed.episode.event_time(day_of(part[0]), day_of(part[-1])),
        "metadata": {"model": completion.model, "embed_model": vectors.model, "backfilled": True}})
    return "written" if written else "no_episode"
