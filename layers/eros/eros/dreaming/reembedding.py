"""A change of embedder (issue 30): every stored vector is embedded again with the new model, user by user, as a
dreaming job kind, while the engine goes on with the old model; then one switch (migration 0033 says how).

* The first container that embeds with a configured model other than the stored vectors' (engine.embedding_space)
  starts it (``eros.calibrated.start_reembedding``): one job per user.
* Each job embeds the user's rows that have no vector of the new model yet, in batches, with the configured
  embedder, writes them beside the old ones (``embedding_next``), and is done when none is left; a job that runs
  out of its invocation's time gives its claim back with its progress kept, and the next sweep goes on.
* Meanwhile turns, recall and dreaming embed with the recorded model (``eros.calibrated.embedder``): recall keeps
  working, and never compares vectors of two models.
* When no job is pending, the sweep switches (``store.reembedding.switch``): one transaction, after which the new
  model's vectors and thresholds are the ones used.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from .. import calibrated, usage
from ..config import Settings
from ..observability import logger, metrics
from ..providers import Deadline
from ..store import reembedding as reembedding_store
from ..store import usage as usage_store
from ..store.rows import ReembeddingJob
from . import jobs

BATCH = 128  # rows a provider call embeds (Voyage takes up to 1,000 texts a request; a batch's write is one statement)
RESERVE_SECS = 5.0  # what a job keeps of its time to write its last batch and report
LATE_BEFORE_LOCK = 2000  # rows written since their user was done, embedded by the last job before the switch's lock


def switch_when_done() -> str | None:
    """After the jobs: the switch, when every row has its vector of the target ('switched'; None: nothing to do)."""
    state = reembedding_store.progress()
    if not state or not state["next_model"] or state["users_pending"]:
        return None
    outcome = reembedding_store.switch(state["next_model"])
    if outcome == "switched":
        calibrated.reset()
        logger.warning("re-embedding done: the stored vectors are the new model's",
                       extra={"from": state["model"], "to": state["next_model"], "rows": state["rows_done"]})
        metrics.add_metric(name="ReembeddingSwitched", unit="Count", value=1)
    return outcome


def event(row: Mapping[str, Any]) -> dict:
    return {"kind": REEMBEDDING.name, "user_id": row["user_id"], "claim_token": row["claim_token"].isoformat()}


def run(cfg: Settings, user_id: str, claim_token: datetime, time_budget_secs: float = 100.0,
        now: datetime | None = None) -> jobs.JobResult:
    """One claimed user's re-embedding (as much of it as ``time_budget_secs`` allows)."""
    return jobs.run(REEMBEDDING, cfg, {"user_id": user_id}, claim_token, time_budget_secs, now)


def _run(cfg: Settings, job: jobs.Job, time_budget_secs: float) -> jobs.JobResult:
    row: ReembeddingJob = job.row  # type: ignore[assignment]  # the row of USERS' claim
    user, model = row["user_id"], row["model"]
    client = calibrated.target_embedder(model)
    if client is None:  # the configuration changed again: the next sweep's begin queues the new target
        return job.report("stale")
    started, written = time.monotonic(), 0
    job.step = "embedder"
    while time.monotonic() - started < time_budget_secs - RESERVE_SECS:
        rows = reembedding_store.pending_rows(user, BATCH)
        if not rows:
            if not reembedding_store.done(job.row, job.claim_token):
                return job.lost()
            return job.report("reembedded", memories=written, switch=_switch_if_last(client, model, job))
        deadline = Deadline.after(max(1.0, time_budget_secs - (time.monotonic() - started)))
        vectors = [(i, v) for i, _, v in _embed(client, [r | {"user_id": user} for r in rows], deadline, job)]
        if not reembedding_store.write(job.row, job.claim_token, model, vectors):
            return job.lost()
        written += len(vectors)
    if not reembedding_store.pause(job.row, job.claim_token):  # out of time: the next sweep goes on
        return job.lost()
    return job.report("partial", memories=written)


def _embed(client: Any, rows: list[dict[str, Any]], deadline: Deadline | None,
           job: jobs.Job | None = None) -> list[tuple[Any, str, list[float]]]:
    """The rows' vectors of the new model (id, user, vector), each provider call counted against its user."""
    out = []
    for input_type in ("document", "query"):  # a message's row was embedded as a query (eros.ingest)
        for user in sorted({r["user_id"] for r in rows}):
            batch = [r for r in rows
                     if r["user_id"] == user and (r["source"] == "utterance") == (input_type == "query")]
            if batch:
                embedded = client.embed([r["content"] for r in batch], input_type, deadline=deadline)
                if job is not None:
                    job.llm_calls += 1
                usage.spend(user, usage_store.Call.of("reembedding", embedded))
                out += [(r["id"], user, v) for r, v in zip(batch, embedded.vectors, strict=True)]
    return out


def _switch_if_last(client: Any, model: str, job: jobs.Job) -> str | None:
    """The last user's job switches: the rows written since their user was done are embedded (most of them before
    the switch's lock, the last few under it), then the switch. Its outcome, or None when jobs are pending."""
    if reembedding_store.any_pending():
        return None
    late = reembedding_store.late_rows(LATE_BEFORE_LOCK)
    if late:
        reembedding_store.write_late(model, _embed(client, late, None, job))
    outcome = reembedding_store.switch(model, lambda rows: _embed(client, rows, None, job))
    if outcome == "switched":
        calibrated.reset()
        logger.warning("re-embedding done: the stored vectors are the new model's", extra={"to": model})
        metrics.add_metric(name="ReembeddingSwitched", unit="Count", value=1)
    return outcome


def _cutoffs(cfg: Settings, moment: datetime) -> dict[str, datetime]:
    return {"stale_before": moment - timedelta(seconds=cfg.deep_pass_claim_stale_secs)}


REEMBEDDING = jobs.Kind("reembedding", "re-embedding", reembedding_store.USERS, _cutoffs, event,
                        lambda cfg: cfg.deep_pass_max_attempts, _run)
