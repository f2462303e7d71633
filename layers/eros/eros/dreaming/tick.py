"""One dreaming tick (the sweeper function's use-case): the capacity budget, provider blocks, claim sessions then
users and fan each claim out to the extract function, then retention. Also the operators' re-drive.

The tick claims at most what the extract function can start before the claims go stale
(``Settings.dreaming_capacity``, less the jobs still in flight, and DREAMING_TICK_CAP): beyond that a claim only
waits in Lambda's queue until it goes stale and is claimed again. While a provider refuses our configuration,
only one probe job per DREAMING_CONFIG_PROBE_SECS is claimed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from uuid import UUID

from .. import apps, clock, events, webhooks
from ..config import Settings
from ..observability import logger, metrics
from ..store import apps as app_store
from ..store import blocks as provider_blocks
from ..store import claims
from ..store import dreaming as dreaming_store
from . import deep_pass, jobs, reembedding, session


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
    reembedding_claimed: int = 0  # a change of embedder: users claimed and invoked (kind "reembedding"), last
    reembedding_invoked: int = 0
    reembedding: str | None = None  # the switch's outcome ('switched', 'waiting', 'stale'), when no job was due
    budget: int = 0  # jobs this tick could claim: the extract function's capacity less what is in flight
    in_flight: int = 0  # jobs claimed by earlier ticks and not stale yet
    blocked: list[str] | None = None  # providers that refused our credentials (only a probe is claimed)
    messages_expired: int = 0  # retention (TRANSCRIPT_RETENTION_DAYS): extracted messages deleted this tick
    events_published: int = 0  # memory events (eros.events) published this tick
    webhooks_delivered: int = 0  # deliveries to the apps' webhooks (eros.webhooks) made this tick


RETENTION_PER_TICK = 10000  # messages a sweep deletes at most (a backlog goes over the next ticks)


def expire_transcripts(cfg: Settings, moment: datetime) -> int:
    """Retention, once per sweep, app by app: each app's ``transcript_retention_days`` (eros.apps.AppSettings), or
    the deployment's TRANSCRIPT_RETENTION_DAYS; 0 keeps them (no app keeping them for a limited time: no metric)."""
    kept_for = {}
    for app in app_store.every():
        days = apps.remember(app["id"], app["settings"]).transcript_retention_days
        days = cfg.transcript_retention_days if days is None else days
        if days and app["deleted_at"] is None:
            kept_for[app["id"]] = days
    if not kept_for:
        return 0
    expired = 0
    for app, days in kept_for.items():
        if expired < RETENTION_PER_TICK:
            expired += dreaming_store.expire_messages(app, moment - timedelta(days=days), RETENTION_PER_TICK - expired)
    metrics.add_metric(name="MessagesExpired", unit="Count", value=expired)
    return expired


@dataclass
class Drained:
    """One kind's part of a tick."""
    claimed: int = 0
    invoked: int = 0
    invoke_failures: int = 0
    batches: int = 0
    stopped_by: str = "drained"  # | limit | time budget | invoke failures
    moment: datetime | None = None  # the clock at the last claim


def drain(kind: jobs.Kind, cfg: Settings, invoke: jobs.Invoker, now: Callable[[], datetime],
          out_of_time: Callable[[], bool], limit: int) -> Drained:
    """Claim ``kind``'s due jobs batch after batch, up to ``limit``, and invoke one extract per claim. A failed
    invoke gives its claim back and ends this part of the tick (the released jobs are not re-claimed in a hot
    loop)."""
    done = Drained()
    while True:
        if done.claimed >= limit:
            done.stopped_by = "limit"
            break
        if out_of_time():
            done.stopped_by = "time budget"
            break
        done.moment = moment = now()
        batch = claims.claim(kind.table, min(cfg.dreaming_batch_size, limit - done.claimed), moment,
                             **kind.cutoffs(cfg, moment))
        if not batch:
            break
        done.batches += 1
        done.claimed += len(batch)
        invoked, failed = jobs.fan_out(batch, invoke, kind.event,
                                       lambda row: claims.release(kind.table, row, row["claim_token"]))
        done.invoked += invoked
        done.invoke_failures += failed
        if failed:
            done.stopped_by = "invoke failures"
            break
    return done


def sweep(cfg: Settings, invoke: jobs.Invoker, *, now: Callable[[], datetime] | None = None,
          time_budget_secs: float = 60.0) -> SweepResult:
    """Claim idle sessions batch after batch and invoke one extraction per session; then, unless the
    tick ran out of time or invokes fail, claim users whose deep pass is due (up to DEEP_PASS_TICK_CAP and
    what is left of the budget) and invoke one pass each."""
    now = now or clock.now
    started = time.monotonic()
    result = SweepResult()
    moment = now()
    result.in_flight, backlog_age = dreaming_store.load(moment - timedelta(seconds=cfg.dreaming_claim_stale_secs),
                                                        moment - timedelta(seconds=cfg.dreaming_idle_secs))
    budget = min(cfg.dreaming_tick_cap, max(0, cfg.dreaming_capacity - result.in_flight))
    blocks = provider_blocks.blocks()
    if blocks:
        result.blocked = [b["provider"] for b in blocks]
        budget = 1 if provider_blocks.take_probe(moment, cfg.dreaming_config_probe_secs) else 0
        logger.error("dreaming held: a provider refuses our configuration", extra={
            "blocked": [{k: str(v) for k, v in b.items()} for b in blocks], "probe": bool(budget)})
    result.budget = budget

    def out_of_time() -> bool:
        return time.monotonic() - started > time_budget_secs

    sessions = drain(session.SESSION, cfg, invoke, now, out_of_time, budget)
    moment = sessions.moment or moment
    result.claimed, result.invoked = sessions.claimed, sessions.invoked
    result.invoke_failures = sessions.invoke_failures
    result.batches, result.stopped_by = sessions.batches, sessions.stopped_by
    if sessions.stopped_by == "limit":
        result.stopped_by = ("provider blocked" if blocks else "tick cap" if budget == cfg.dreaming_tick_cap
                             else "capacity")
    if result.stopped_by in ("drained", "tick cap", "capacity"):
        users = drain(deep_pass.DEEP_PASS, cfg, invoke, now, out_of_time,
                      min(cfg.deep_pass_tick_cap, budget - result.claimed))
        result.users_claimed, result.deep_pass_invoked = users.claimed, users.invoked
        result.deep_pass_invoke_failures = users.invoke_failures
        _reembed(cfg, invoke, now, out_of_time, budget - result.claimed - result.users_claimed, result)
    result.messages_expired = expire_transcripts(cfg, moment)
    result.events_published = events.publish_pending(cfg)
    result.webhooks_delivered = webhooks.deliver(cfg)
    _metrics(result, len(blocks), backlog_age)
    logger.info("sweep done", extra=asdict(result))
    return result


def _reembed(cfg: Settings, invoke: jobs.Invoker, now: Callable[[], datetime], out_of_time: Callable[[], bool],
             limit: int, result: SweepResult) -> None:
    """A change of embedder (eros.dreaming.reembedding, started by the first container that embeds with it): claim
    users' jobs with what is left of the budget, and switch once none is pending (the sweeper calls no provider: a
    row written since its user was done queues its user again)."""
    users = drain(reembedding.REEMBEDDING, cfg, invoke, now, out_of_time, limit)
    result.reembedding_claimed, result.reembedding_invoked = users.claimed, users.invoked
    if users.claimed == 0:
        result.reembedding = reembedding.switch_when_done()


def _metrics(result: SweepResult, blocked: int, backlog_age: float) -> None:
    for name, value in (("SessionsClaimed", result.claimed), ("ExtractInvoked", result.invoked),
                        ("ExtractInvokeFailures", result.invoke_failures), ("UsersClaimed", result.users_claimed),
                        ("DeepPassInvoked", result.deep_pass_invoked),
                        ("DeepPassInvokeFailures", result.deep_pass_invoke_failures),
                        ("DreamingInFlight", result.in_flight), ("ProvidersBlocked", blocked)):
        metrics.add_metric(name=name, unit="Count", value=value)
    metrics.add_metric(name="DreamingBacklogAge", unit="Seconds", value=backlog_age)


def redrive(why: str = "retry-window", user_id: str | None = None) -> list[UUID]:
    """Make sessions given up on eligible again with fresh counters: those the world failed for the
    whole retry window (``why='retry-window'``, the default: run it once the provider is back) or, after
    a fix in our code, those whose own attempts ran out (``'attempts'``). Returns their ids."""
    ids = dreaming_store.redrive(why, user_id)
    metrics.add_metric(name="SessionsRedriven", unit="Count", value=len(ids))
    logger.info("sessions re-driven", extra={"why": why, "user_id": user_id, "sessions": len(ids)})
    return ids
