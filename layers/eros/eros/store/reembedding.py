"""A re-embedding's data access (migration 0033): starting one toward a new model, each user's job (its claim,
its rows without a vector of the new model, the guarded write of their vectors), the progress, and the switch.

A user's re-embedding is a dreaming job (``store.claims``): ``USERS`` says where its claim lives (the user's
``engine.user_reembedding`` row). Every statement names the user but ``begin``, ``progress`` and ``switch``,
which are the deployment's (tests/test_shard_ready.py lists them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from pgvector import Vector

from ..db import connection, one, transaction
from . import claims
from .rows import ClaimedJob, UserClaim

# Due: not done. The rest of the claim is every per-user kind's (store.claims.user_claim).
_CLAIM = claims.user_claim("engine.user_reembedding", due="done_at IS NULL", order="queued_at")
# A user given up on is stamped done with the error kept: the switch then waits for its rows (``progress`` counts
# them), and `eros reembed --redrive` (``redrive``) queues it again.
USERS = claims.JobTable("user_reembedding", _CLAIM, pending="done_at IS NULL", reads=("model", "rows_done"),
                        given_up="done_at = now()")


def claim_users(stale_before: datetime, limit: int, now: datetime | None = None) -> list[UserClaim]:
    return claims.claim(USERS, limit, now, stale_before=stale_before)  # type: ignore[return-value]


_BEGIN = """
WITH space AS (
    UPDATE engine.embedding_space
    SET next_model = %(model)s, next_dimension = %(dimension)s, next_since = now()
    WHERE next_model IS DISTINCT FROM %(model)s AND model <> %(model)s
    RETURNING next_model
), cleared AS (  -- the vectors of an earlier target that is no longer wanted
    UPDATE engine.companion_memories SET embedding_next = NULL
    WHERE embedding_next IS NOT NULL AND EXISTS (SELECT 1 FROM space)
    RETURNING 1
), queued AS (
    INSERT INTO engine.user_reembedding (user_id, model)
    SELECT DISTINCT m.user_id, %(model)s FROM engine.companion_memories m WHERE EXISTS (SELECT 1 FROM space)
    ON CONFLICT (user_id) DO UPDATE
    SET model = EXCLUDED.model, queued_at = now(), rows_done = 0, done_at = NULL, claimed_at = NULL,
        started_at = NULL, attempts = 0, retries = 0, retrying_since = NULL, error = NULL, next_attempt_at = NULL
    RETURNING user_id
)
SELECT (SELECT count(*) FROM space) AS started, (SELECT count(*) FROM queued) AS users,
       (SELECT count(*) FROM cleared) AS cleared
"""


def begin(model: str, dimension: int) -> int | None:
    """Start re-embedding every stored row with ``model``, unless it is the recorded model or already the target:
    one job per user that has rows. The number of users queued, or None when nothing was started."""
    row = one(connection().execute(_BEGIN, {"model": model, "dimension": dimension}))
    return row["users"] if row["started"] else None


def cancel(model: str) -> bool:
    """Stop a re-embedding whose target is no longer wanted (the configuration is back to the recorded ``model``):
    the jobs and the vectors of the target go. Whether there was one."""
    with transaction() as conn:
        stopped = conn.execute("UPDATE engine.embedding_space SET next_model = NULL, next_dimension = NULL,"
                               " next_since = NULL WHERE model = %s AND next_model IS NOT NULL RETURNING model",
                               (model,)).fetchone()
        if stopped:
            conn.execute("DELETE FROM engine.user_reembedding")
            conn.execute("UPDATE engine.companion_memories SET embedding_next = NULL WHERE embedding_next IS NOT NULL")
    return stopped is not None


def pending_rows(user_id: str, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` of the user's rows without a vector of the new model: id, content, source (every row, active
    or not: a restore brings a superseded one back)."""
    return connection().execute(
        "SELECT id, content, source FROM engine.companion_memories"
        " WHERE user_id = %s AND embedding_next IS NULL ORDER BY id LIMIT %s", (user_id, limit)).fetchall()


def write(job: ClaimedJob, claim_token: datetime, model: str, vectors: Sequence[tuple[UUID, list[float]]]) -> bool:
    """The rows' vectors of ``model``, if the claim still holds and ``model`` is still the target; the user's
    progress counted. False: the claim was lost (nothing written)."""
    with transaction() as conn:
        if claims.lock(conn, USERS, job, claim_token) is None:
            return False
        if conn.execute("SELECT 1 FROM engine.embedding_space WHERE next_model = %s", (model,)).fetchone() is None:
            return False
        with conn.cursor() as cur:
            cur.executemany("UPDATE engine.companion_memories SET embedding_next = %s WHERE user_id = %s AND id = %s",
                            [(Vector(v), job["user_id"], i) for i, v in vectors])
        conn.execute("UPDATE engine.user_reembedding SET rows_done = rows_done + %s WHERE user_id = %s",
                     (len(vectors), job["user_id"]))
    return True


def done(job: ClaimedJob, claim_token: datetime) -> bool:
    """Stamp the user's job done (its rows all have their vector), if the claim still holds."""
    with transaction() as conn:
        if claims.lock(conn, USERS, job, claim_token) is None:
            return False
        conn.execute("UPDATE engine.user_reembedding SET done_at = now(), claimed_at = NULL, started_at = NULL,"
                     " error = NULL WHERE user_id = %s", (job["user_id"],))
    return True


def pause(job: ClaimedJob, claim_token: datetime) -> bool:
    """Give the claim back with the progress kept (the invocation ran out of time), nothing counted: the next sweep
    claims the user again and goes on. False: the claim was lost."""
    with transaction() as conn:
        if claims.lock(conn, USERS, job, claim_token) is None:
            return False
        conn.execute("UPDATE engine.user_reembedding SET claimed_at = NULL, started_at = NULL WHERE user_id = %s",
                     (job["user_id"],))
    return True


def any_pending() -> bool:
    """Whether any user's job is not done yet."""
    return connection().execute("SELECT 1 FROM engine.user_reembedding WHERE done_at IS NULL LIMIT 1"
                                ).fetchone() is not None


_PROGRESS = """
SELECT s.model, s.next_model, s.next_since,
       (SELECT count(*) FROM engine.user_reembedding WHERE done_at IS NULL) AS users_pending,
       (SELECT count(*) FROM engine.user_reembedding) AS users,
       (SELECT count(*) FROM engine.user_reembedding WHERE error IS NOT NULL AND done_at IS NOT NULL) AS users_failed,
       (SELECT coalesce(sum(rows_done), 0) FROM engine.user_reembedding) AS rows_done,
       (SELECT count(*) FROM engine.companion_memories WHERE s.next_model IS NOT NULL AND embedding_next IS NULL)
           AS rows_pending
FROM engine.embedding_space s
"""


def progress() -> dict[str, Any] | None:
    """Where a re-embedding is (None: no vector stored yet): the recorded and the target model, users pending,
    rows re-embedded and rows still without a vector of the target."""
    return connection().execute(_PROGRESS).fetchone()


def late_rows(limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` rows of any user without a vector of the new model: written after their user's job was done
    (a turn's message, a new memory). The job that finds no user pending embeds them before the switch."""
    return connection().execute(
        "SELECT id, user_id, content, source FROM engine.companion_memories WHERE embedding_next IS NULL"
        " ORDER BY id LIMIT %s", (limit,)).fetchall()


def write_late(model: str, vectors: Sequence[tuple[UUID, str, list[float]]]) -> None:
    """Late rows' vectors of ``model`` (id, user, vector), if ``model`` is still the target."""
    with transaction() as conn:
        if conn.execute("SELECT 1 FROM engine.embedding_space WHERE next_model = %s", (model,)).fetchone() is None:
            return
        with conn.cursor() as cur:
            cur.executemany("UPDATE engine.companion_memories SET embedding_next = %s WHERE user_id = %s AND id = %s",
                            [(Vector(v), user, i) for i, user, v in vectors])


def switch(model: str, embed: Callable[[list[dict[str, Any]]], list[tuple[UUID, str, list[float]]]] | None = None,
           most: int = 1000) -> str:
    """ONE transaction: if ``model`` is still the target and no user's job is pending, the rows still without a
    vector of it (written since their user's job was done) are embedded with ``embed`` (at most ``most``), the
    recorded model becomes ``model`` and every row's vector its vector of ``model``. The table is locked against
    writes meanwhile (a turn waits, for one provider call at most), so no row is written with the old model after
    the check: the switch cannot be outrun by a busy deployment's turns. Returns 'switched', 'waiting' (jobs are
    pending, or more late rows than ``most`` or no ``embed``: their users are queued again) or 'stale' (another
    target, or switched already)."""
    with transaction() as conn:
        space = conn.execute("SELECT model, next_model, next_dimension FROM engine.embedding_space FOR UPDATE"
                             ).fetchone()
        if space is None or space["next_model"] != model:
            return "stale"
        conn.execute("LOCK TABLE engine.companion_memories IN SHARE ROW EXCLUSIVE MODE")
        if conn.execute("SELECT 1 FROM engine.user_reembedding WHERE done_at IS NULL LIMIT 1").fetchone():
            return "waiting"
        late = late_rows(most + 1)
        if late and (embed is None or len(late) > most):
            conn.execute(
                "INSERT INTO engine.user_reembedding (user_id, model)"
                " SELECT DISTINCT user_id, %s FROM engine.companion_memories WHERE embedding_next IS NULL"
                " ON CONFLICT (user_id) DO UPDATE SET done_at = NULL, claimed_at = NULL, started_at = NULL",
                (model,))
            return "waiting"
        if late and embed is not None:
            with conn.cursor() as cur:
                cur.executemany("UPDATE engine.companion_memories SET embedding_next = %s WHERE user_id = %s"
                                " AND id = %s", [(Vector(v), user, i) for i, user, v in embed(late)])
        conn.execute("UPDATE engine.embedding_space SET model = next_model, dimension = next_dimension,"
                     " recorded_at = now(), next_model = NULL, next_dimension = NULL, next_since = NULL")
        conn.execute("UPDATE engine.companion_memories SET embedding = embedding_next, embedding_next = NULL,"
                     " metadata = jsonb_set(metadata, '{embed_model}', to_jsonb(%s::text))", (model,))
        conn.execute("DELETE FROM engine.user_reembedding")
    return "switched"


def redrive() -> int:
    """Queue again the users whose re-embedding was given up on; how many."""
    return len(connection().execute(
        "UPDATE engine.user_reembedding SET done_at = NULL, attempts = 0, retries = 0, error = NULL,"
        " next_attempt_at = NULL WHERE done_at IS NOT NULL AND error IS NOT NULL RETURNING user_id").fetchall())
