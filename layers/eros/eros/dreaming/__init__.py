"""Dreaming: the background work that turns quiet sessions into memories. A tick (``tick.sweep``, the sweeper
function) claims due jobs and fans them out to the extract function, one invocation each; a delivery runs one
job's life (``jobs.run``). Two kinds of job today, peers on one lifecycle:

  session.py    a session's extraction (``extract_session``; the prompt and parser are ``eros.extraction``)
  deep_pass.py  a user's deep pass: consolidation across sessions (``deep_pass.run``)

The lifecycle is written once: the claim, lease, release, backoff and give-up in ``eros.store.claims``; the
spend deferral, the attempts cap, whose fault a failure is and what follows (hold, back off, give up), the one
result type (``JobResult``) and the fan-out in ``jobs``.

Not a job: ``episodes.py`` backfills the episodes of sessions extracted before episodes existed, when an operator
runs ``eros backfill-episodes`` (within each user's budget, as the jobs are).

A new kind of job (re-embedding every memory when the embedder changes, episodes, ...) supplies a ``jobs.Kind``:
  * a ``store.claims.JobTable``: the table that holds one row per job (keyed by user_id, plus its own key), the
    prefix of its lifecycle columns (claimed_at, started_at, attempts, retries, retrying_since, error,
    next_attempt_at), what still has work (``pending``), how a job given up on is stamped, and its claim: ONE
    statement, a MATERIALIZED CTE FOR UPDATE SKIP LOCKED (docs/DESIGN.md "The claim");
  * the claim's cut-offs at a moment, the extract event for a claimed row, its attempts cap, and the names of
    its lifecycle metrics (``jobs.METRICS``);
  * its work: from a started ``jobs.Job`` to a ``JobResult`` (raise a ProviderError for the policy to sort);
    its one final write locks the user's memory (``consolidation.hold_user``) and the job (``claims.lock``);
and is added to the tick (``tick.sweep``), the extract function's events, and ``store.dreaming.load``.
"""

from .jobs import Invoker, JobResult
from .session import extract_session
from .tick import SweepResult, redrive, sweep

__all__ = ["Invoker", "JobResult", "SweepResult", "extract_session", "redrive", "sweep"]
