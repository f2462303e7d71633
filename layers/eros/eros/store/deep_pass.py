"""The deep pass's data access: its claim, a user's candidate clusters, and the one guarded write of a plan.

A user's deep pass is a dreaming job (``store.claims``): ``USERS`` says where its claim lives (the user's
``engine.user_deep_pass`` row); the claim's lease, backoff and give-up are written once, in ``store.claims``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from psycopg.types.json import Jsonb

from ..db import connection, one, retried, transaction
from ..memory import EventTime, event_columns, event_time, later_telling
from . import claims, consolidation
from .rows import UserClaim

_TICK = timedelta(microseconds=1)  # timestamptz resolution

# Due: the memory changed since the last pass. Quiet: not changed for a while (a pass per burst of sessions, not
# per session). The rest of the claim is every per-user kind's (store.claims.user_claim).
_CLAIM = claims.user_claim(
    "engine.user_deep_pass",
    due="(consolidated_at IS NULL OR consolidated_at < changed_at) AND changed_at < %(quiet_before)s",
    order="changed_at")
# The claim's cut-offs: quiet_before (not changed since), stale_before (a claim older is presumed dead). A user
# given up on is stamped consolidated: the next memory change makes the pass due again (it re-drives itself).
USERS = claims.JobTable("user_deep_pass", _CLAIM, reads=("changed_at",),
                        given_up="consolidated_at = greatest(now(), changed_at), attempts = 0")


def claim_users(quiet_before: datetime, stale_before: datetime, limit: int,
                now: datetime | None = None) -> list[UserClaim]:
    """Claim up to ``limit`` users whose deep pass is due; ``now`` stamps the claim (the token)."""
    return claims.claim(USERS, limit, now, quiet_before=quiet_before, stale_before=stale_before)  # type: ignore[return-value]



# --- what the pass reads ----------------------------------------------------------------------------
@dataclass
class Snapshot:
    """The user's recent active profile rows and the close pairs among them, as read at ``read_at``.

    ``seen_changed_at`` is the user's ``changed_at`` read just before the rows: if it moved by the
    time the plan is applied, something changed that the pass may not have seen."""

    read_at: datetime
    seen_changed_at: datetime | None
    rows: dict[UUID, dict] = field(default_factory=dict)
    pairs: list[tuple[UUID, UUID, float]] = field(default_factory=list)


# The user's most recent active profile rows (an exact scan through the partial profile index), and
# every pair among them at least ``similarity`` apart by cosine. 300 rows are 45k distances of
# 512-d vectors: a few tens of milliseconds, computed where the vectors are.
_ROWS = """
SELECT id, content, category, importance, mention_count, created_at, last_confirmed_at, occurred_at, occurred_precision
FROM engine.companion_memories
WHERE user_id = %(user)s AND instance_id IS NULL AND superseded_at IS NULL
ORDER BY created_at DESC, id
LIMIT %(limit)s
"""
_PAIRS = """
WITH recent AS (
    SELECT id, embedding FROM engine.companion_memories
    WHERE id = ANY(%(ids)s) AND user_id = %(user)s AND instance_id IS NULL
)
SELECT a.id AS a, b.id AS b, 1 - (a.embedding <=> b.embedding) AS similarity
FROM recent a JOIN recent b ON a.id < b.id
WHERE (a.embedding <=> b.embedding) <= 1 - %(similarity)s
"""


def snapshot(user_id: str, max_rows: int, similarity: float) -> Snapshot:
    conn = connection()
    state = one(conn.execute(
        "SELECT clock_timestamp() AS read_at,"
        " (SELECT changed_at FROM engine.user_deep_pass WHERE user_id = %s) AS changed_at",
        (user_id,),
    ))
    rows = conn.execute(_ROWS, {"user": user_id, "limit": max_rows}).fetchall()
    found = Snapshot(read_at=state["read_at"], seen_changed_at=state["changed_at"],
                     rows={r["id"]: r for r in rows})
    if len(rows) >= 2:
        pairs = conn.execute(_PAIRS, {"ids": list(found.rows), "user": user_id,
                                      "similarity": similarity}).fetchall()
        found.pairs = [(p["a"], p["b"], float(p["similarity"])) for p in pairs]
    return found


# --- the one guarded write --------------------------------------------------------------------------
@dataclass
class Applied:
    merged: int = 0  # rows superseded as duplicates of a kept row
    superseded: int = 0  # rows superseded as changed facts
    ignored: int = 0  # asked for, but not applicable when written (superseded meanwhile, not the user's)


def _stamp(conn, user_id: str, consolidated_at, error: str | None) -> None:
    conn.execute(
        "UPDATE engine.user_deep_pass SET consolidated_at = %s, claimed_at = NULL, started_at = NULL,"
        " attempts = 0, retries = 0, retrying_since = NULL, next_attempt_at = NULL, error = %s WHERE user_id = %s",
        (consolidated_at, error and error[:1000], user_id),
    )


@retried
def apply(user_id: str, claim_token: datetime, actions: list[tuple[str, UUID, list[UUID]]],
          snap: Snapshot, error: str | None = None, lease: datetime | None = None) -> Applied | None:
    """ONE transaction: apply the plan and stamp the user, only if the claim still holds.

    ``actions`` are (kind, survivor, targets) in order, kind ``duplicate`` (targets merged into the
    survivor, which is confirmed with their mentions) or ``changed`` (targets replaced by the
    survivor). Only the user's own active profile rows are touched; a survivor that is no longer
    active drops its action. The user is stamped consolidated as of ``snap.read_at``, or just before
    the change that moved ``changed_at`` since the rows were read, so that change makes the user due
    again. Returns None when the claim was lost (nothing written).
    """
    applied = Applied()
    with transaction() as conn:
        # The user's memory lock first (consolidation.hold_user), then the memory rows, then the user's row: the
        # order session-end dreaming takes them in (it supersedes rows, then marks the user changed).
        consolidation.hold_user(conn, user_id)
        ids = list({i for _, survivor, targets in actions for i in (survivor, *targets)})
        live = {r["id"]: r for r in conn.execute(
            "SELECT id, mention_count, importance, created_at, occurred_at, occurred_precision"
            " FROM engine.companion_memories"
            " WHERE id = ANY(%s) AND user_id = %s AND instance_id IS NULL AND superseded_at IS NULL"
            " ORDER BY id FOR UPDATE",
            (ids, user_id),
        ).fetchall()} if ids else {}
        state = claims.lock(conn, USERS, {"user_id": user_id, "lease": lease}, claim_token)
        if state is None:
            return None
        for kind, survivor, targets in actions:
            if survivor not in live:
                applied.ignored += len(targets)
                continue
            done = consolidation.supersede(conn, user_id, survivor, targets, kind)
            applied.ignored += len(targets) - len(done)
            if not done:
                continue
            conn.execute(
                "UPDATE engine.companion_memories SET metadata = metadata || %s WHERE id = ANY(%s) AND user_id = %s",
                (Jsonb({"superseded_in": "deep_pass"}), done, user_id),
            )
            gone = [live.pop(i) for i in done]
            if kind == "duplicate":
                applied.merged += len(done)
                importance = max((g["importance"] for g in gone if g["importance"] is not None), default=None)
                consolidation.confirm(conn, user_id, survivor, importance, sum(g["mention_count"] for g in gone),
                                      occurred=merged_event_time(live[survivor], gone))
            else:
                applied.superseded += len(done)
        consolidated_at = snap.read_at
        if snap.seen_changed_at is None or state["changed_at"] != snap.seen_changed_at:
            consolidated_at = min(snap.read_at, state["changed_at"] - _TICK)
        _stamp(conn, user_id, consolidated_at, error)
    return applied


def merged_event_time(survivor: dict, gone: list[dict]) -> EventTime | None:
    """The event time a kept row takes from the duplicates merged into it: every telling, oldest first, folded
    by ``eros.memory.later_telling`` (agreeing ones keep the most precise, else the newest wins); None when
    that is the time it has. The row (``survivor``, locked by the caller) is updated for the plan's next steps."""
    merged = None
    for row in sorted([survivor, *gone], key=lambda r: (r["created_at"], str(r["id"]))):
        merged = later_telling(merged, event_time(row["occurred_at"], row["occurred_precision"]))
    if merged == event_time(survivor["occurred_at"], survivor["occurred_precision"]):
        return None
    survivor["occurred_at"], survivor["occurred_precision"] = event_columns(merged)
    return merged
