"""Dreaming-lite: sweep idle sessions (claim, fan out) and extract one session into profile memories.

sweep()            -- the sweeper Lambda's use-case: claim batches until nothing is eligible or the
                      tick's cap/time budget is reached; hand each claim to an invoker.
extract_session()  -- the extract Lambda's use-case: transcript -> one LLM call (per window) ->
                      one embedding batch -> one guarded transaction.

The invoke seam: boto3's Lambda client (InvocationType=Event) in AWS, an in-process call locally.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable, Protocol
from uuid import UUID, uuid4

from .config import Settings
from . import extraction
from .extraction import Candidate, windows
from .observability import logger, metrics
from .providers import Deadline, ProviderError, chat_client, embedder
from .store import dreaming as store

CONTEXT_MESSAGES = 6  # earlier turns shown (marked) to a resumed session's extraction
WINDOW_CHARS = 24_000  # transcript characters per extraction call (~6k tokens)
MAX_WINDOWS = 4  # per invocation; the rest is taken by the next sweep from the new watermark
MESSAGES_PER_INVOCATION = 2_000


# --- the sweeper ------------------------------------------------------------------------------
class Invoker(Protocol):
    def __call__(self, payload: dict) -> None: ...


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


def extract_payload(row: dict) -> dict:
    return {"session_id": str(row["id"]), "user_id": row["user_id"], "instance_id": str(row["instance_id"]),
            "claim_token": row["claim_token"].isoformat()}


def sweep(cfg: Settings, invoke: Invoker, *, now: Callable[[], datetime] | None = None,
          time_budget_secs: float = 60.0) -> SweepResult:
    """Claim idle sessions batch after batch and invoke one extraction per session; then, unless the
    tick ran out of time or invokes fail, claim users whose deep pass is due and invoke one pass each."""
    from . import deep_pass  # the per-user pass rides on the same tick and the same extract function

    now = now or (lambda: datetime.now(timezone.utc))
    started = time.monotonic()
    result = SweepResult()
    while True:
        if result.claimed >= cfg.dreaming_tick_cap:
            result.stopped_by = "tick cap"
            break
        if time.monotonic() - started > time_budget_secs:
            result.stopped_by = "time budget"
            break
        moment = now()
        batch = store.claim(idle_before=moment - timedelta(seconds=cfg.dreaming_idle_secs),
                            stale_before=moment - timedelta(seconds=cfg.dreaming_claim_stale_secs),
                            limit=min(cfg.dreaming_batch_size, cfg.dreaming_tick_cap - result.claimed),
                            now=moment)
        if not batch:
            break
        result.batches += 1
        result.claimed += len(batch)
        invoked, failed = fan_out(batch, invoke, extract_payload,
                                  lambda row: store.release(row["id"], row["claim_token"]))
        result.invoked += invoked
        result.invoke_failures += failed
        if failed:
            result.stopped_by = "invoke failures"  # don't re-claim the released sessions in a hot loop
            break
    if result.stopped_by in ("drained", "tick cap"):
        users = deep_pass.sweep_users(cfg, invoke, now, lambda: time.monotonic() - started > time_budget_secs)
        result.users_claimed, result.deep_pass_invoked = users.claimed, users.invoked
        result.deep_pass_invoke_failures = users.invoke_failures
    metrics.add_metric(name="SessionsClaimed", unit="Count", value=result.claimed)
    metrics.add_metric(name="ExtractInvoked", unit="Count", value=result.invoked)
    metrics.add_metric(name="ExtractInvokeFailures", unit="Count", value=result.invoke_failures)
    metrics.add_metric(name="UsersClaimed", unit="Count", value=result.users_claimed)
    metrics.add_metric(name="DeepPassInvoked", unit="Count", value=result.deep_pass_invoked)
    metrics.add_metric(name="DeepPassInvokeFailures", unit="Count", value=result.deep_pass_invoke_failures)
    logger.info("sweep done", extra=asdict(result))
    return result


def fan_out(batch: list[dict], invoke: Invoker, payload: Callable[[dict], dict],
            release: Callable[[dict], object]) -> tuple[int, int]:
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


class LambdaInvoker:
    """Fan-out in AWS: an asynchronous Lambda invocation per session (at-least-once delivery)."""

    def __init__(self, function_name: str, client=None):
        import boto3

        self.function_name = function_name
        self.client = client or boto3.client("lambda")

    def __call__(self, payload: dict) -> None:
        response = self.client.invoke(FunctionName=self.function_name, InvocationType="Event",
                                      Payload=json.dumps(payload).encode())
        if response.get("StatusCode") != 202:
            raise RuntimeError(f"async invoke answered {response.get('StatusCode')}")


class InProcessInvoker:
    """Fan-out locally: the extract handler itself, on a small thread pool (like concurrent Lambdas)."""

    def __init__(self, handler: Callable[[dict, object], dict], workers: int = 4):
        self.handler = handler
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="extract")

    def __call__(self, payload: dict) -> None:
        from .local import LambdaContext

        def run():
            try:
                self.handler(payload, LambdaContext("extract", timeout_secs=120))
            except Exception as exc:  # Lambda would retry; locally the claim goes stale and a later sweep retries
                logger.warning("local extract failed", extra={"error": repr(exc)[:300]})

        self.pool.submit(run)

    def wait(self) -> None:
        self.pool.shutdown(wait=True)


def sweep_locally(cfg: Settings) -> dict:
    """`eros sweep`: one sweep now, extractions in-process, waiting for them to finish."""
    from .local import load_function

    invoker = InProcessInvoker(load_function("extract").lambda_handler)
    result = sweep(cfg, invoker)
    invoker.wait()
    return asdict(result)


def run_local_sweeper(cfg: Settings) -> threading.Thread:
    """The local EventBridge schedule: a sweep every DREAMING_TICK_SECS, in a daemon thread."""
    from .local import load_function

    invoker = InProcessInvoker(load_function("extract").lambda_handler)

    def loop():
        while True:
            time.sleep(cfg.dreaming_tick_secs)
            try:
                result = sweep(cfg, invoker)
                if result.claimed:
                    print(f"[dreaming] claimed {result.claimed} idle session(s), extracting", flush=True)
                if result.users_claimed:
                    print(f"[dreaming] claimed {result.users_claimed} user(s) for a deep pass", flush=True)
            except Exception as exc:
                logger.exception("local sweep failed", extra={"error": repr(exc)[:300]})

    thread = threading.Thread(target=loop, name="sweeper", daemon=True)
    thread.start()
    return thread


# --- extract ----------------------------------------------------------------------------------
@dataclass
class ExtractResult:
    session_id: str
    outcome: str  # extracted | consolidated | nothing | unparsable | not-claimed | gave-up
    memories: int = 0  # new profile rows
    superseded: int = 0  # known rows the new ones replaced
    confirmed: int = 0  # known rows the session repeated (no new row)
    ignored: int = 0  # handles the model named that could not be applied
    llm_calls: int = 0
    more_pending: bool = False


def extract_session(cfg: Settings, session_id: UUID, claim_token: datetime,
                    time_budget_secs: float = 100.0) -> ExtractResult:
    """Extract one claimed session and consolidate it with what the user's memory already holds.

    Provider calls: one LLM call per transcript window and one embedding batch for the new rows,
    nothing else (the known memories are found by SQL). Provider-availability errors propagate
    (no stamp: retried later). ``time_budget_secs`` bounds every provider call."""
    sid = str(session_id)
    session = store.claimed_session(session_id, claim_token)
    if session is None:  # a duplicate delivery, a retry after success, or a claim taken over by another
        logger.info("claim no longer held; nothing to do", extra={"session_id": sid})
        return ExtractResult(sid, "not-claimed")
    if session["classification_attempts"] > cfg.dreaming_max_attempts:
        return _give_up(session, claim_token, f"gave up after {cfg.dreaming_max_attempts} attempts")

    earlier, new = store.transcript(session_id, session["watermark"], CONTEXT_MESSAGES, MESSAGES_PER_INVOCATION)
    if not new:
        store.finish(session, claim_token, [], None, None)
        return ExtractResult(sid, "nothing")
    parts = windows(new, WINDOW_CHARS)[:MAX_WINDOWS]
    first, through = parts[0][0]["id"], parts[-1][-1]["id"]
    shown = extraction.handles(store.touched_memories(session["user_id"], session_id, session["watermark"],
                                                      extraction.MAX_KNOWN))
    deadline = Deadline.after(time_budget_secs)
    calls = 0
    try:
        candidates, problems, model, calls = _candidates(cfg, earlier, parts, shown, deadline)
        decided = extraction.plan(candidates, shown)
        rows = _rows(decided, model, deadline, first, through)
    except ProviderError as exc:
        return _provider_failed(cfg, session, claim_token, exc, calls)

    # Zero candidates or unparsable output still stamp: a poison pill must not loop.
    error = "; ".join(problems) or (None if rows or decided.confirm else "no memories in this session")
    counts = store.finish(session, claim_token, rows, through, error, decided.confirm, first)
    if counts is None:
        logger.info("claim lost before writing; another worker owns the session", extra={"session_id": sid})
        return ExtractResult(sid, "not-claimed", llm_calls=calls)
    result = ExtractResult(sid, "extracted" if rows else "consolidated" if decided.confirm
                           else "unparsable" if problems else "nothing",
                           memories=len(rows), superseded=counts["superseded"], confirmed=counts["confirmed"],
                           ignored=counts["ignored"] + decided.ignored, llm_calls=calls,
                           more_pending=len(new) > sum(len(p) for p in parts) or len(new) == MESSAGES_PER_INVOCATION)
    for name, value in (("MemoriesExtracted", result.memories), ("MemoriesSuperseded", result.superseded),
                        ("MemoriesConfirmed", result.confirmed), ("ConsolidationIgnored", result.ignored)):
        metrics.add_metric(name=name, unit="Count", value=value)
    logger.info("session extracted", extra=asdict(result) | {"known_shown": len(shown)})
    return result


def _candidates(cfg: Settings, earlier: list[dict], parts: list[list[dict]], shown: dict[str, dict],
                deadline: Deadline) -> tuple[list[Candidate], list[str], str, int]:
    """One LLM call per window: (candidates, parse problems, the model that answered, calls made)."""
    llm = chat_client()
    candidates: list[Candidate] = []
    problems: list[str] = []
    model, calls = cfg.extract_model, 0
    for part in parts:
        completion = llm.complete(cfg.extract_model, [
            {"role": "system", "content": extraction.SYSTEM_PROMPT},
            {"role": "user", "content": extraction.render_transcript(earlier, part, shown)},
        ], max_tokens=1200, temperature=0.0, deadline=deadline, json_mode=True)
        calls += 1
        model = completion.model
        try:
            candidates.extend(extraction.parse_candidates(completion.text))
        except extraction.Unparsable as exc:
            problems.append(f"unparsable model output: {exc}")
        earlier = part[-CONTEXT_MESSAGES:]
    return candidates, problems, model, calls


def _rows(decided: extraction.Plan, model: str, deadline: Deadline, first: int, through: int) -> list[dict]:
    """The new profile rows, embedded in one batch (none when the session only repeated known memories)."""
    if not decided.new:
        return []
    vectors = embedder().embed([c.content for c, _ in decided.new], "document", deadline=deadline)
    return [{"id": uuid4(), "content": c.content, "category": c.category, "importance": c.importance,
             "embedding": v, "supersedes": supersedes, "from_message_id": first, "through_message_id": through,
             "metadata": {"model": model, "embed_model": vectors.model}}
            for (c, supersedes), v in zip(decided.new, vectors.vectors)]


def _give_up(session: dict, claim_token: datetime, error: str, calls: int = 0) -> ExtractResult:
    store.give_up(session, claim_token, error)
    metrics.add_metric(name="ExtractGaveUp", unit="Count", value=1)
    return ExtractResult(str(session["id"]), "gave-up", llm_calls=calls)


def _provider_failed(cfg: Settings, session: dict, claim_token: datetime, exc: ProviderError,
                     calls: int) -> ExtractResult:
    """A provider outage: no stamp (the session is retried), unless this was the last attempt."""
    error = f"{type(exc).__name__}: {exc}"
    if session["classification_attempts"] >= cfg.dreaming_max_attempts:
        return _give_up(session, claim_token,
                        f"gave up after {session['classification_attempts']} attempts: {error}", calls)
    store.record_failure(session["id"], claim_token, error)
    metrics.add_metric(name="ExtractProviderFailures", unit="Count", value=1)
    raise exc
