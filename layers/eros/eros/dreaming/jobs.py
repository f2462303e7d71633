"""A claimed dreaming job's life, the same for every kind: take the lease, defer over the spend budget, stop at
the attempts cap, do the kind's work, and on a failure decide ONCE whose fault it is and what follows.

Whose fault (``classify``, issue 8, migration 0005):
  configuration -- a provider refuses our configuration (a bad key, no credit, a model it does not serve):
                   dreaming is held (a provider block), nothing is counted, one probe job per
                   DREAMING_CONFIG_PROBE_SECS tries again.
  world         -- the provider is unavailable: backed off and retried for DREAMING_RETRY_WINDOW_SECS, never
                   counted against the job; after the window it is given up on (re-drivable).
  own           -- a provider 4xx on the job's own prompt, a crash in our code on it, a worker that died on it:
                   counted, backed off, given up on at the kind's attempts cap.
What follows (``next_step``): hold, back off, or give up.

The invoke seam (``Invoker``): in AWS the sweeper function's boto3 invoker (InvocationType=Event); locally
``eros_dev.dreaming.InProcessInvoker``. Either way one extract invocation per claimed job.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from .. import apps, clock
from ..config import Settings
from ..db import embedding_switched
from ..observability import logger, metrics
from ..providers import (
    EmbedderMismatch,
    ModelNotFound,
    ProviderConfigurationError,
    ProviderError,
    ProviderUnavailable,
)
from ..store import blocks as provider_blocks
from ..store import claims
from ..store import usage as usage_store
from ..store.rows import ClaimedJob

Fault = Literal["configuration", "world", "own"]


class Invoker(Protocol):
    def __call__(self, payload: dict, /) -> None: ...


@dataclass(frozen=True)
class Kind:
    """What a kind of dreaming job supplies; the rest of its life is this module's (and ``store.claims``')."""

    name: str  # the extract event's "kind" and the result's
    noun: str  # in log lines: "<noun> done", "<noun> crashed"; its lifecycle metrics are named in METRICS
    table: claims.JobTable  # where its claims live, and its claim statement
    cutoffs: Callable[[Settings, datetime], dict[str, datetime]]  # the claim's cut-offs at a moment
    event: Callable[[Mapping[str, Any]], dict]  # the extract event for one claimed row
    max_attempts: Callable[[Settings], int]  # its own failures allowed
    work: Callable[[Settings, Job, float], JobResult]  # the work, once started: a result, or a failure raised


@dataclass
class JobResult:
    """What one delivery of a job did, truthfully (``outcome``):
      written          -- the kind's own words (extracted | consolidated | nothing | unparsable): stamped, or a
                          watermark moved
      retry-later      -- a failure; the claim is back with a backoff (``fault`` says whose)
      blocked          -- a provider refused our credentials; nothing counted, dreaming held until fixed
      gave-up          -- stamped without the work (``fault``: own = attempts cap, world = retry window)
      deferred         -- the user's daily token budget is spent (or held by turns in flight): back with
                          ``retry_at`` = midnight UTC (or when those reservations expire), uncounted
      duplicate        -- another delivery of this claim holds its lease: returned before any provider call
      not-claimed      -- this claim no longer holds the job (done, released, re-claimed, unknown)
      lost-claim       -- the claim was lost while working (it went stale and was re-taken): nothing written
    The counts are each kind's; a kind leaves the others' at 0."""

    kind: str
    user_id: str
    outcome: str
    session_id: str | None = None  # a session's extraction
    llm_calls: int = 0
    fault: Fault | None = None  # for retry-later, blocked and gave-up
    retry_at: str | None = None  # retry-later and deferred: the earliest next attempt
    memories: int = 0  # a session: new profile rows
    confirmed: int = 0  # a session: known rows it repeated (no new row)
    episode: str | None = None  # a session: its episode 'written', 'rewritten' or 'refused' (None: the answer had none)
    followed: int = 0  # a session: the user's later imported sessions the same invocation extracted after it
    clusters: int = 0  # a deep pass: clusters shown to the model
    shown: int = 0  # a deep pass: rows shown
    merged: int = 0  # a deep pass: rows merged into a kept twin (reason 'duplicate')
    superseded: int = 0  # rows replaced by a newer one (reason 'changed')
    ignored: int = 0  # named by the model but not applicable
    switch: str | None = None  # a re-embedding: the switch's outcome when its job was the last one pending


# Each kind's lifecycle metrics, by (kind, outcome or event), spelled out: alarms and the dashboard read them
# (tests/test_template.py finds them here). A new kind adds its names.
METRICS = {
    ("session", "duplicate"): "ExtractDuplicates", ("deep_pass", "duplicate"): "DeepPassDuplicates",
    ("session", "not-claimed"): "ExtractNotClaimed", ("deep_pass", "not-claimed"): "DeepPassNotClaimed",
    ("session", "lost-claim"): "ExtractLostClaims", ("deep_pass", "lost-claim"): "DeepPassLostClaims",
    ("session", "gave-up"): "ExtractGaveUp", ("deep_pass", "gave-up"): "DeepPassGaveUp",
    ("session", "blocked"): "ExtractBlocked", ("deep_pass", "blocked"): "DeepPassBlocked",
    ("session", "retry-later"): "ExtractRetriesScheduled", ("deep_pass", "retry-later"): "DeepPassRetriesScheduled",
    ("session", "deferred"): "ExtractDeferredOverBudget", ("deep_pass", "deferred"): "DeepPassDeferredOverBudget",
    ("session", "provider-failure"): "ExtractProviderFailures",
    ("deep_pass", "provider-failure"): "DeepPassProviderFailures",
    ("session", "retry-window"): "ExtractRetryWindowExhausted",
    ("deep_pass", "retry-window"): "DeepPassRetryWindowExhausted",
}


@dataclass
class Job:
    """A started job: its kind, its row (``store.claims.start``), its claim, when it started, and what its work
    has done so far (provider calls paid; the provider being called, whose block a configuration failure sets)."""

    kind: Kind
    row: ClaimedJob
    claim_token: datetime
    moment: datetime
    llm_calls: int = 0
    step: str = "llm"

    def report(self, outcome: str, **fields: Any) -> JobResult:
        return report(self.kind, JobResult(self.kind.name, self.row["user_id"], outcome, _session_id(self.row),
                                           llm_calls=self.llm_calls, **fields))

    def lost(self) -> JobResult:
        logger.warning("claim lost while working; another worker owns the job",
                       extra={"kind": self.kind.name, "user_id": self.row["user_id"]})
        return self.report("lost-claim")


def _session_id(key: Mapping[str, Any]) -> str | None:
    return str(key["id"]) if "id" in key else None


def _count(kind: Kind, event: str) -> None:
    if (kind.name, event) in METRICS:
        metrics.add_metric(name=METRICS[(kind.name, event)], unit="Count", value=1)


def report(kind: Kind, result: JobResult, **extra: Any) -> JobResult:
    _count(kind, result.outcome)
    logger.info(f"{kind.noun} done", extra=asdict(result) | extra)
    return result


def run(kind: Kind, cfg: Settings, key: Mapping[str, Any], claim_token: datetime, time_budget_secs: float,
        now: datetime | None = None) -> JobResult:
    """One delivery of a claimed job (``key``: its user_id and the kind's key). The delivery first takes the
    claim's lease, so a duplicate delivery returns before any provider call. Nothing raises but a crash in our
    own code, which is counted against the job first. ``time_budget_secs`` bounds every provider call."""
    moment = now or clock.now()
    state, row = claims.start(kind.table, key, claim_token, moment)
    if row is None:  # a duplicate delivery, a retry after success, or a claim taken over by another
        return report(kind, JobResult(kind.name, key["user_id"], state, _session_id(key)))
    job = Job(kind, row, claim_token, moment)
    cfg = apps.settings_for(row["user_id"], cfg)  # the user's app's budget and extraction model over the deployment's
    retry_at = usage_store.held_until(row["user_id"], moment, cfg.daily_token_budget)
    if retry_at is not None:
        # The user's daily token budget is spent (or held by turns in flight: what a turn's admission reads): the
        # job waits for midnight UTC (or for those reservations), counted as nobody's failure (not an attempt,
        # not a retry), and is done then.
        if not claims.retry_later(kind.table, row, claim_token, "deferred: the user's daily token budget is spent",
                                  retry_at, None, moment):
            return job.lost()
        return job.report("deferred", retry_at=retry_at.isoformat())
    if row["attempts"] >= kind.max_attempts(cfg):  # e.g. its workers kept dying
        return _give_up(job, Step("give up", "own", f"gave up after {row['attempts']} attempts: {row['error']}",
                                  why="attempts"))
    try:
        return kind.work(cfg, job, time_budget_secs)
    except ProviderError as exc:
        return failed(cfg, job, exc)
    except Exception as exc:  # a crash in our code on this job: count it, then let it be seen
        if embedding_switched(exc):  # a re-embedding switched models under it: nothing written, the world's turn
            return failed(cfg, job, ProviderUnavailable("the stored vectors were switched to another embedding"
                                                        " model while the job ran; it is retried with it"))
        logger.exception(f"{kind.noun} crashed", extra={"user_id": row["user_id"], "error": describe_failure(exc)})
        try:
            failed(cfg, job, exc)
        except Exception:  # e.g. the database is gone too: the claim goes stale and is counted then
            logger.exception("could not record the crash", extra={"user_id": row["user_id"]})
        raise


# --- the one failure policy -----------------------------------------------------------------------
def classify(exc: BaseException) -> Fault:
    """Whose fault a failure is."""
    if isinstance(exc, ProviderConfigurationError):
        return "configuration"
    if isinstance(exc, ProviderUnavailable):
        return "world"
    return "own"


@dataclass(frozen=True)
class Step:
    """What follows a failure: ``hold`` (nothing counted), ``back off`` (``counts`` the failure as the job's
    ``attempts`` or the world's ``retries``, next attempt after ``delay`` seconds) or ``give up`` (``why``)."""

    action: Literal["hold", "back off", "give up"]
    fault: Fault
    error: str  # what is stored
    counts: str | None = None
    delay: float = 0.0
    why: str | None = None  # give up: 'attempts' | 'retry-window'


def next_step(cfg: Settings, max_attempts: int, row: ClaimedJob, exc: BaseException, error: str,
              moment: datetime) -> Step:
    fault = classify(exc)
    if fault == "configuration":  # a bad key, no credit: hold everything, count nothing
        return Step("hold", fault, error)
    if fault == "world":  # back off, for as long as the window allows
        retries = row["retries"] + 1
        since = row["retrying_since"] or moment
        if (moment - since).total_seconds() >= cfg.dreaming_retry_window_secs:
            return Step("give up", fault, f"gave up after {retries} retries since {since.isoformat()}"
                        f" (provider unavailable): {error}", why="retry-window")
        return Step("back off", fault, error, "retries", backoff(cfg, retries, getattr(exc, "retry_after", None)))
    attempts = row["attempts"] + 1  # this failure included
    if attempts >= max_attempts:
        return Step("give up", fault, f"gave up after {attempts} attempts: {error}", why="attempts")
    return Step("back off", fault, error, "attempts", backoff(cfg, attempts))


def failed(cfg: Settings, job: Job, exc: Exception) -> JobResult:
    """Sort a failure by whose fault it is and give the claim back accordingly (or give up)."""
    kind, user_id = job.kind, job.row["user_id"]
    error = describe_failure(exc, job.step if isinstance(exc, ProviderError) else None)
    step = next_step(cfg, kind.max_attempts(cfg), job.row, exc, error, job.moment)
    if step.action == "give up":
        if step.why == "retry-window":
            _count(kind, "retry-window")
            logger.error("a job was given up after the retry window (a session: re-drive it with"
                         " eros.dreaming.redrive once the provider is back; a deep pass is due again at the user's"
                         " next memory change)", extra={"kind": kind.name, "user_id": user_id, "error": step.error})
        return _give_up(job, step)
    if step.action == "hold":
        provider_blocks.block(job.step, getattr(exc, "status", None), error, job.moment, cfg.dreaming_config_probe_secs)
        logger.error("a provider refuses our configuration: dreaming is held until the configuration is fixed",
                     extra={"kind": kind.name, "user_id": user_id, "provider": job.step})
        if not claims.retry_later(kind.table, job.row, job.claim_token, error, None, None, job.moment):
            return job.lost()
        return job.report("blocked", fault=step.fault)
    if step.fault == "world":
        _count(kind, "provider-failure")
    retry_at = job.moment + timedelta(seconds=step.delay)
    if not claims.retry_later(kind.table, job.row, job.claim_token, error, retry_at, step.counts, job.moment):
        return job.lost()
    logger.warning(f"{kind.noun} failed; retrying later", extra={"user_id": user_id, "fault": step.fault,
                                                                 "error": error, "retry_at": retry_at.isoformat()})
    return job.report("retry-later", fault=step.fault, retry_at=retry_at.isoformat())


def _give_up(job: Job, step: Step) -> JobResult:
    if not claims.give_up(job.kind.table, job.row, job.claim_token, step.error, step.why or ""):
        return job.lost()
    return report(job.kind, JobResult(job.kind.name, job.row["user_id"], "gave-up", _session_id(job.row),
                                      llm_calls=job.llm_calls, fault=step.fault), error=step.error)


def backoff(cfg: Settings, failures: int, hint: float | None = None, rng: Callable[[], float] = random.random
            ) -> float:
    """Seconds before the next attempt after ``failures`` failures in a row: exponential from
    DREAMING_RETRY_BASE_SECS, capped at DREAMING_RETRY_MAX_DELAY_SECS, with "equal jitter" (half fixed,
    half random) so jobs that failed together do not come back together; a provider's Retry-After
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
    # Our own words, with the names of settings: a model the provider does not serve, two embedding models
    what = (f": {exc.hint()}" if isinstance(exc, ModelNotFound)
            else f": {exc}" if isinstance(exc, EmbedderMismatch) else "")
    return f"{type(exc).__name__}{f' (HTTP {status})' if status else ''}{where}{what}"


# --- the fan-out ----------------------------------------------------------------------------------
def fan_out[J](batch: Sequence[J], invoke: Invoker, event: Callable[[J], dict],
            release: Callable[[J], object]) -> tuple[int, int]:
    """Invoke one job per claimed row; a failed invoke gives its claim back at once (the next tick
    takes it) instead of leaving it to go stale. Returns (invoked, failed)."""
    invoked = failed = 0
    for row in batch:
        job = event(row)
        try:
            invoke(job)
            invoked += 1
        except Exception as exc:  # any invoke failure: give the claim back for the next tick
            failed += 1
            release(row)
            logger.warning("invoke failed; claim released", extra={"job": job, "error": repr(exc)[:300]})
    return invoked, failed
