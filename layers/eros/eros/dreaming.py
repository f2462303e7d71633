"""Dreaming-lite: sweep idle sessions (claim, fan out) and extract one session into profile memories.

sweep()            -- the sweeper Lambda's use-case: claim batches until nothing is eligible or the
                      tick's budget (what the extract function can start before claims go stale, the
                      tick cap, the time budget) is reached; hand each claim to an invoker.
extract_session()  -- the extract Lambda's use-case: take the claim's lease -> transcript -> one LLM
                      call (per window) -> one embedding batch -> one guarded transaction; a failure
                      goes back with a backoff, counted against whoever was at fault (issue 8).

The invoke seam (``Invoker``): in AWS the sweeper function's boto3 invoker (InvocationType=Event); locally
``eros.local.InProcessInvoker``. Either way one extract invocation per claimed session.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from uuid import UUID, uuid4

from . import extraction, usage
from .config import Settings
from .extraction import Candidate, windows
from .observability import logger, metrics
from .providers import Deadline, ProviderConfigurationError, ProviderError, ProviderUnavailable, chat_client, embedder
from .store import dreaming as store
from .store import usage as usage_store
from .store.rows import Claim, ClaimedSession, Message

CONTEXT_MESSAGES = 6  # earlier turns shown (marked) to a resumed session's extraction
WINDOW_CHARS = 24_000  # transcript characters per extraction call (~6k tokens)
MAX_WINDOWS = 4  # per invocation; the rest is taken by the next sweep from the new watermark
MESSAGES_PER_INVOCATION = 2_000


# --- the sweeper ------------------------------------------------------------------------------
class Invoker(Protocol):
    def __call__(self, payload: dict, /) -> None: ...


@dataclass
class SweepResult:
    claimed: int = 0
    invoked: int = 0
    invoke_failures: int = 0
    batches: int = 0
    stopped_by: str = "drained"  # what ended the sessions' part of the tick
    users_claimed: int = 0  # the deep pass: users claimed and invoked (kind "deep_pass") after the sessions
    deep_pass_invoked: int = 0
    deep_pass_invoke_failures: int = 0
    budget: int = 0  # jobs this tick could claim: the extract function's capacity less what is in flight
    in_flight: int = 0  # jobs claimed by earlier ticks and not stale yet
    blocked: list[str] | None = None  # providers that refused our credentials (only a probe is claimed)
    messages_expired: int = 0  # retention (TRANSCRIPT_RETENTION_DAYS): extracted messages deleted this tick


RETENTION_PER_TICK = 10000  # messages a sweep deletes at most (a backlog goes over the next ticks)


def expire_transcripts(cfg: Settings, moment: datetime) -> int:
    """Retention, once per sweep: off unless TRANSCRIPT_RETENTION_DAYS is set."""
    if not cfg.transcript_retention_days:
        return 0
    expired = store.expire_messages(moment - timedelta(days=cfg.transcript_retention_days), RETENTION_PER_TICK)
    metrics.add_metric(name="MessagesExpired", unit="Count", value=expired)
    return expired


def utcnow() -> datetime:
    """Dreaming's application clock: claims, leases, backoffs. Tests replace it to move time without sleeping."""
    return datetime.now(UTC)


def extract_payload(claim: Claim) -> dict:
    """The extract function's event for one claimed session (``functions/extract/app.py`` reads it)."""
    return {"session_id": str(claim["id"]), "user_id": claim["user_id"],
            "claim_token": claim["claim_token"].isoformat()}


def sweep(cfg: Settings, invoke: Invoker, *, now: Callable[[], datetime] | None = None,
          time_budget_secs: float = 60.0) -> SweepResult:
    """Claim idle sessions batch after batch and invoke one extraction per session; then, unless the
    tick ran out of time or invokes fail, claim users whose deep pass is due and invoke one pass each.

    The tick claims at most what the extract function can start before the claims go stale
    (``Settings.dreaming_capacity``, less the jobs still in flight, and DREAMING_TICK_CAP): beyond that
    a claim only waits in Lambda's queue until it goes stale and is claimed again. While a provider
    refuses our credentials, only one probe job per DREAMING_CONFIG_PROBE_SECS is claimed."""
    from . import deep_pass  # the per-user pass rides on the same tick and the same extract function

    now = now or utcnow
    started = time.monotonic()
    result = SweepResult()
    moment = now()
    result.in_flight, backlog_age = store.load(moment - timedelta(seconds=cfg.dreaming_claim_stale_secs),
                                               moment - timedelta(seconds=cfg.dreaming_idle_secs))
    budget = min(cfg.dreaming_tick_cap, max(0, cfg.dreaming_capacity - result.in_flight))
    blocks = store.blocks()
    if blocks:
        result.blocked = [b["provider"] for b in blocks]
        budget = 1 if store.take_probe(moment, cfg.dreaming_config_probe_secs) else 0
        logger.error("dreaming held: a provider refuses our credentials", extra={
            "blocked": [{k: str(v) for k, v in b.items()} for b in blocks], "probe": bool(budget)})
    result.budget = budget
    while True:
        if result.claimed >= budget:
            result.stopped_by = ("provider blocked" if blocks else "tick cap" if budget == cfg.dreaming_tick_cap
                                 else "capacity")
            break
        if time.monotonic() - started > time_budget_secs:
            result.stopped_by = "time budget"
            break
        moment = now()
        batch = store.claim(idle_before=moment - timedelta(seconds=cfg.dreaming_idle_secs),
                            stale_before=moment - timedelta(seconds=cfg.dreaming_claim_stale_secs),
                            limit=min(cfg.dreaming_batch_size, budget - result.claimed),
                            now=moment)
        if not batch:
            break
        result.batches += 1
        result.claimed += len(batch)
        invoked, failed = fan_out(batch, invoke, extract_payload,
                                  lambda row: store.release(row["user_id"], row["id"], row["claim_token"]))
        result.invoked += invoked
        result.invoke_failures += failed
        if failed:
            result.stopped_by = "invoke failures"  # don't re-claim the released sessions in a hot loop
            break
    if result.stopped_by in ("drained", "tick cap", "capacity"):
        users = deep_pass.sweep_users(cfg, invoke, now, lambda: time.monotonic() - started > time_budget_secs,
                                      limit=budget - result.claimed)
        result.users_claimed, result.deep_pass_invoked = users.claimed, users.invoked
        result.deep_pass_invoke_failures = users.invoke_failures
    result.messages_expired = expire_transcripts(cfg, moment)
    metrics.add_metric(name="SessionsClaimed", unit="Count", value=result.claimed)
    metrics.add_metric(name="ExtractInvoked", unit="Count", value=result.invoked)
    metrics.add_metric(name="ExtractInvokeFailures", unit="Count", value=result.invoke_failures)
    metrics.add_metric(name="UsersClaimed", unit="Count", value=result.users_claimed)
    metrics.add_metric(name="DeepPassInvoked", unit="Count", value=result.deep_pass_invoked)
    metrics.add_metric(name="DeepPassInvokeFailures", unit="Count", value=result.deep_pass_invoke_failures)
    metrics.add_metric(name="DreamingInFlight", unit="Count", value=result.in_flight)
    metrics.add_metric(name="ProvidersBlocked", unit="Count", value=len(blocks))
    metrics.add_metric(name="DreamingBacklogAge", unit="Seconds", value=backlog_age)
    logger.info("sweep done", extra=asdict(result))
    return result


def fan_out[J](batch: Sequence[J], invoke: Invoker, payload: Callable[[J], dict],
            release: Callable[[J], object]) -> tuple[int, int]:
    """Invoke one job per claimed row; a failed invoke gives its claim back at once (the next tick
    takes it) instead of leaving it to go stale. Returns (invoked, failed)."""
    invoked = failed = 0
    for row in batch:
        job = payload(row)
        try:
            invoke(job)
            invoked += 1
        except Exception as exc:  # any invoke failure: give the claim back for the next tick
            failed += 1
            release(row)
            logger.warning("invoke failed; claim released", extra={"job": job, "error": repr(exc)[:300]})
    return invoked, failed


def redrive(why: str = "retry-window", user_id: str | None = None) -> list[UUID]:
    """Make sessions given up on eligible again with fresh counters: those the world failed for the
    whole retry window (``why='retry-window'``, the default: run it once the provider is back) or, after
    a fix in our code, those whose own attempts ran out (``'attempts'``). Returns their ids."""
    ids = store.redrive(why, user_id)
    metrics.add_metric(name="SessionsRedriven", unit="Count", value=len(ids))
    logger.info("sessions re-driven", extra={"why": why, "user_id": user_id, "sessions": len(ids)})
    return ids


# --- extract ----------------------------------------------------------------------------------
@dataclass
class ExtractResult:
    session_id: str
    # What happened, truthfully:
    #   extracted | consolidated | nothing | unparsable  -- written (stamped, or a watermark moved)
    #   retry-later   -- a failure; the claim is back with a backoff (``fault`` says whose)
    #   blocked       -- a provider refused our credentials; nothing counted, dreaming held until fixed
    #   gave-up       -- stamped without extracting (``fault``: own = attempts cap, world = retry window)
    #   deferred      -- the daily token budget is spent (or held by turns in flight): back with retry_at =
    #                    midnight UTC (or when those reservations expire), uncounted
    #   duplicate     -- another delivery of this claim holds its lease: returned before any provider call
    #   not-claimed   -- this claim no longer holds the session (done, released, re-claimed, unknown)
    #   lost-claim    -- the claim was lost while working (it went stale and was re-taken): nothing written
    outcome: str
    memories: int = 0  # new profile rows
    superseded: int = 0  # known rows the new ones replaced
    confirmed: int = 0  # known rows the session repeated (no new row)
    ignored: int = 0  # handles the model named that could not be applied
    llm_calls: int = 0
    fault: str | None = None  # own | world | configuration, for retry-later, blocked and gave-up
    retry_at: str | None = None  # retry-later: the earliest next attempt


_OUTCOME_METRICS = {"duplicate": "ExtractDuplicates", "not-claimed": "ExtractNotClaimed",
                    "lost-claim": "ExtractLostClaims", "gave-up": "ExtractGaveUp", "blocked": "ExtractBlocked",
                    "retry-later": "ExtractRetriesScheduled", "deferred": "ExtractDeferredOverBudget"}


def _report(result: ExtractResult, **extra) -> ExtractResult:
    if result.outcome in _OUTCOME_METRICS:
        metrics.add_metric(name=_OUTCOME_METRICS[result.outcome], unit="Count", value=1)
    logger.info("extract done", extra=asdict(result) | extra)
    return result


def backoff(cfg: Settings, failures: int, hint: float | None = None, rng: Callable[[], float] = random.random
            ) -> float:
    """Seconds before the next attempt after ``failures`` failures in a row: exponential from
    DREAMING_RETRY_BASE_SECS, capped at DREAMING_RETRY_MAX_DELAY_SECS, with "equal jitter" (half fixed,
    half random) so sessions that failed together do not come back together; a provider's Retry-After
    hint is a floor (still capped)."""
    delay = min(cfg.dreaming_retry_max_delay_secs, cfg.dreaming_retry_base_secs * 2 ** min(max(failures - 1, 0), 30))
    delay *= 0.5 + rng() / 2
    if hint:
        delay = max(delay, min(hint, cfg.dreaming_retry_max_delay_secs))
    return delay


def describe_failure(exc: BaseException, step: str | None = None) -> str:
    """What a stored error and a log line may say about a failure: its kind and status, never a provider's
    body (it can echo user content)."""
    status = getattr(exc, "status", None)
    where = f" from the {step}" if step else ""
    return f"{type(exc).__name__}{f' (HTTP {status})' if status else ''}{where}"


def extract_session(cfg: Settings, user_id: str, session_id: UUID, claim_token: datetime,
                    time_budget_secs: float = 100.0, now: datetime | None = None) -> ExtractResult:
    """Extract one claimed session and consolidate it with what the user's memory already holds.

    Provider calls: one LLM call per transcript window and one embedding batch for the new rows,
    nothing else (the known memories are found by SQL). The delivery first takes the claim's lease, so
    a duplicate delivery returns before any provider call. Failures are sorted by whose fault they are
    (see ``store.dreaming`` and migration 0005): nothing raises but a crash in our own code, which is
    counted against the session first. ``time_budget_secs`` bounds every provider call."""
    sid = str(session_id)
    moment = now or utcnow()
    state, session = store.start(user_id, session_id, claim_token, moment)
    if session is None:  # a duplicate delivery, a retry after success, or a claim taken over by another
        return _report(ExtractResult(sid, state))
    retry_at = usage_store.held_until(session["user_id"], moment, cfg.daily_token_budget)
    if retry_at is not None:
        # The user's daily token budget is spent (or held by turns in flight: what a turn's admission reads): the
        # session waits for midnight UTC (or for those reservations), counted as nobody's failure (not an
        # attempt, not a retry), and is extracted then.
        if not store.retry_later(session, claim_token, "deferred: the user's daily token budget is spent",
                                 retry_at, None, moment):
            return _report(ExtractResult(sid, "lost-claim"))
        return _report(ExtractResult(sid, "deferred", retry_at=retry_at.isoformat()))
    if _attempts_exhausted(cfg, session["extraction_attempts"]):  # e.g. its workers kept dying
        return _give_up(session, claim_token, "own", f"gave up after {session['extraction_attempts']}"
                        f" attempts: {session['extraction_error']}", "attempts")

    progress = {"calls": 0, "step": "llm"}
    try:
        return _extract(cfg, session, claim_token, time_budget_secs, progress)
    except ProviderError as exc:
        return _failed(cfg, session, claim_token, exc, progress, moment)
    except Exception as exc:  # a crash in our code on this session: count it, then let it be seen
        logger.exception("extraction crashed", extra={"session_id": sid, "error": describe_failure(exc)})
        try:
            _failed(cfg, session, claim_token, exc, progress, moment)
        except Exception:  # e.g. the database is gone too: the claim goes stale and is counted then
            logger.exception("could not record the crash", extra={"session_id": sid})
        raise


def _extract(cfg: Settings, session: ClaimedSession, claim_token: datetime, time_budget_secs: float,
             progress: dict) -> ExtractResult:
    session_id, sid = session["id"], str(session["id"])
    earlier, new = store.transcript(session["user_id"], session_id, session["extraction_watermark"],
                                    CONTEXT_MESSAGES, MESSAGES_PER_INVOCATION)
    if not new:
        if store.finish(session, claim_token, [], None, None) is None:
            return _report(ExtractResult(sid, "lost-claim"))
        return _report(ExtractResult(sid, "nothing"))
    parts = windows(new, WINDOW_CHARS)[:MAX_WINDOWS]
    first, watermark = parts[0][0]["id"], parts[-1][-1]["id"]
    shown = extraction.handles(store.touched_memories(session["user_id"], session_id, session["extraction_watermark"],
                                                      extraction.MAX_KNOWN))
    deadline = Deadline.after(time_budget_secs)
    progress["user_id"], progress["session_id"] = session["user_id"], session_id
    candidates, problems, model = _candidates(cfg, earlier, parts, shown, deadline, progress)
    store.unblock("llm")  # it answered: whatever block it had is over
    decided = extraction.plan(candidates, shown)
    progress["step"] = "embedder"
    rows = _rows(decided, model, deadline, first, watermark, session)
    if rows:
        store.unblock("embedder")
    calls = progress["calls"]

    # Zero candidates or unparsable output still stamp: a poison pill must not loop.
    error = "; ".join(problems) or (None if rows or decided.confirm else "no memories in this session")
    counts = store.finish(session, claim_token, rows, watermark, error, decided.confirm, first, decided.told)
    if counts is None:
        logger.warning("claim lost before writing; another worker owns the session", extra={"session_id": sid})
        return _report(ExtractResult(sid, "lost-claim", llm_calls=calls))
    result = ExtractResult(sid, "extracted" if rows else "consolidated" if decided.confirm
                           else "unparsable" if problems else "nothing",
                           memories=len(rows), superseded=counts["superseded"], confirmed=counts["confirmed"],
                           ignored=counts["ignored"] + decided.ignored, llm_calls=calls)
    for name, value in (("MemoriesExtracted", result.memories), ("MemoriesSuperseded", result.superseded),
                        ("MemoriesConfirmed", result.confirmed), ("ConsolidationIgnored", result.ignored)):
        metrics.add_metric(name=name, unit="Count", value=value)
    return _report(result, known_shown=len(shown))


def _candidates(cfg: Settings, earlier: list[Message], parts: list[list[Message]],
                shown: Mapping[str, Mapping[str, Any]], deadline: Deadline, progress: dict
                ) -> tuple[list[Candidate], list[str], str]:
    """One LLM call per window: (candidates, parse problems, the model that answered); calls counted in
    ``progress`` as they are made (a later window's failure still reports what was paid)."""
    llm = chat_client()
    candidates: list[Candidate] = []
    problems: list[str] = []
    model = cfg.extract_model
    for part in parts:
        completion = llm.complete(cfg.extract_model, [
            {"role": "system", "content": extraction.SYSTEM_PROMPT},
            {"role": "user", "content": extraction.render_transcript(earlier, part, shown)},
        ], max_tokens=1200, temperature=0.0, deadline=deadline, json_mode=True)
        progress["calls"] += 1
        usage.spend(progress["user_id"], usage_store.Call.of("extraction", completion),
                    held_by=("session", progress["session_id"]))
        model = completion.model
        try:
            candidates.extend(extraction.parse_candidates(completion.text))
        except extraction.Unparsable as exc:
            problems.append(f"unparsable model output: {exc}")
        earlier = part[-CONTEXT_MESSAGES:]
    return candidates, problems, model


def _rows(decided: extraction.Plan, model: str, deadline: Deadline, first: int, last: int,
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


def _attempts_exhausted(cfg: Settings, attempts: int) -> bool:
    """The session's own failures (counted so far) have reached DREAMING_MAX_ATTEMPTS: stop trying it.
    Checked when a delivery starts (the claim counted a worker that died) and after a failure of its own."""
    return attempts >= cfg.dreaming_max_attempts


def _give_up(session: ClaimedSession, claim_token: datetime, fault: str, error: str, why: str, calls: int = 0
             ) -> ExtractResult:
    sid = str(session["id"])
    if not store.give_up(session, claim_token, error, why):
        return _report(ExtractResult(sid, "lost-claim", llm_calls=calls))
    return _report(ExtractResult(sid, "gave-up", llm_calls=calls, fault=fault), error=error)


def _failed(cfg: Settings, session: ClaimedSession, claim_token: datetime, exc: Exception, progress: dict,
            moment: datetime) -> ExtractResult:
    """Sort a failure by whose fault it is and give the claim back accordingly (or give up)."""
    sid, calls = str(session["id"]), progress["calls"]
    error = describe_failure(exc, progress["step"] if isinstance(exc, ProviderError) else None)
    if isinstance(exc, ProviderConfigurationError):  # a bad key, no credit: hold everything, count nothing
        store.block(progress["step"], exc.status, error, moment, cfg.dreaming_config_probe_secs)
        logger.error("a provider refuses our credentials: dreaming is held until the configuration is fixed",
                     extra={"session_id": sid, "provider": progress["step"], "status": exc.status})
        if not store.retry_later(session, claim_token, error, None, None, moment):
            return _report(ExtractResult(sid, "lost-claim", llm_calls=calls))
        return _report(ExtractResult(sid, "blocked", llm_calls=calls, fault="configuration"))
    if isinstance(exc, ProviderUnavailable):  # the world's fault: back off, for as long as the window allows
        retries = session["extraction_retries"] + 1
        since = session["extraction_retrying_since"] or moment
        if (moment - since).total_seconds() >= cfg.dreaming_retry_window_secs:
            metrics.add_metric(name="ExtractRetryWindowExhausted", unit="Count", value=1)
            logger.error("a session was given up after the retry window: re-drive it (eros.dreaming.redrive)"
                         " once the provider is back", extra={"session_id": sid, "retries": retries,
                                                              "since": since.isoformat(), "error": error})
            return _give_up(session, claim_token, "world", f"gave up after {retries} retries since"
                            f" {since.isoformat()} (provider unavailable): {error}", "retry-window", calls)
        fault, delay = "world", backoff(cfg, retries, exc.retry_after)
        counts = "retries"
        metrics.add_metric(name="ExtractProviderFailures", unit="Count", value=1)
    else:  # the session's own: a provider 4xx on its transcript, a crash on it
        attempts = session["extraction_attempts"] + 1  # this failure included
        if _attempts_exhausted(cfg, attempts):
            return _give_up(session, claim_token, "own", f"gave up after {attempts} attempts: {error}",
                            "attempts", calls)
        fault, delay, counts = "own", backoff(cfg, attempts), "attempts"
    retry_at = moment + timedelta(seconds=delay)
    if not store.retry_later(session, claim_token, error, retry_at, counts, moment):
        return _report(ExtractResult(sid, "lost-claim", llm_calls=calls))
    logger.warning("extraction failed; retrying later", extra={"session_id": sid, "fault": fault, "error": error,
                                                               "retry_at": retry_at.isoformat()})
    return _report(ExtractResult(sid, "retry-later", llm_calls=calls, fault=fault, retry_at=retry_at.isoformat()))
