"""The session job's data access (a session's extraction): its claim, the transcript, the known memories it
touches, and the one guarded write of an extraction; retention and the sweep's load.

A session is a dreaming job (``store.claims``): ``SESSIONS`` says where its claim lives (the ``extraction_``
columns of ``engine.chat_sessions``); the claim's lease, backoff and give-up are written once, in ``store.claims``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from pgvector import Vector
from psycopg.types.json import Jsonb

from ..db import Connection, connection, one, retried, transaction
from ..memory import EventTime, event_columns, later_telling
from . import claims, consolidation
from .rows import Claim, ClaimedSession, EpisodeContext, KnownMemory, Message

# The SPEC's claim: one statement, FOR UPDATE SKIP LOCKED so concurrent
# sweepers take disjoint sets without blocking; cut-offs computed by the caller and bound.
# A session whose last failure set a backoff (extraction_next_attempt_at) waits it out.
# Taking a claim counts nothing by itself (a provider outage must not use up a session's attempts);
# re-taking a stale one says why it went stale: a worker had started it (the lease is set) and died
# mid-extraction -- the session's own attempt, since a poison transcript can kill its worker -- or no
# worker ever started it (our own backlog, the world's fault: a retry, never held against it).
# The claim is stamped with the same application clock the stale cut-off comes from: were it the
# database's now(), an application clock running ahead by more than the stale threshold would
# find every fresh claim already stale and re-claim the same sessions batch after batch.
# The picked rows are a MATERIALIZED CTE, not ``WHERE id IN (SELECT ... LIMIT ... SKIP LOCKED)``: with
# the IN form the planner may run the sub-select as the inner side of a nested-loop semi join (it does
# whenever the table's statistics say it is small, e.g. analysed while empty). Each rescan then skips
# the rows this statement has already updated (SKIP LOCKED skips self-modified rows) and locks the next,
# so one claim took every idle session whatever its limit: the batch size, the tick cap and the single
# probe of a provider block were all ignored (tests/test_claims.py reproduces it).
# An imported session (eros import, migration 0029) waits while an older imported session of its user is not
# extracted (waiting, claimed, retrying or deferred over the user's budget): an import makes a user's sessions
# quiet all at once, and each session's extraction consolidates against what the earlier ones wrote, so they are
# dreamt one at a time, oldest first, and a fact of 2024 is superseded by the one of 2025, never the reverse. A
# user chatting live has one quiet session at a time; those are claimed as before. (One index probe: migration 0031.)
_CLAIM_TEMPLATE = """
WITH picked AS MATERIALIZED (
    SELECT s.id FROM engine.chat_sessions s
    WHERE s.extracted_at IS NULL
      AND s.last_active_at < %(idle_before)s
      AND (s.extraction_claimed_at IS NULL
           OR s.extraction_claimed_at < %(stale_before)s)
      AND (s.extraction_next_attempt_at IS NULL
           OR s.extraction_next_attempt_at <= %(now)s)
      AND (s.external_id IS NULL
           OR NOT EXISTS (SELECT FROM engine.chat_sessions o
                          WHERE o.user_id = s.user_id AND o.external_id IS NOT NULL AND o.extracted_at IS NULL
                            AND o.last_active_at < s.last_active_at)){only}
    ORDER BY s.last_active_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE engine.chat_sessions s
SET extraction_claimed_at = %(now)s,
    extraction_started_at = NULL,
    extraction_attempts = s.extraction_attempts + (s.extraction_started_at IS NOT NULL)::int,
    extraction_retries = s.extraction_retries
        + (s.extraction_claimed_at IS NOT NULL AND s.extraction_started_at IS NULL)::int,
    extraction_error = CASE
        WHEN s.extraction_started_at IS NOT NULL THEN 'the worker did not finish (its claim went stale)'
        WHEN s.extraction_claimed_at IS NOT NULL THEN 'no worker started the claim before it went stale'
        ELSE s.extraction_error END
FROM picked
WHERE s.id = picked.id
RETURNING s.id, s.user_id, s.instance_id, s.extraction_claimed_at AS claim_token
"""
_CLAIM = _CLAIM_TEMPLATE.format(only="")
# The user's next imported session, for the extraction that just finished one of theirs (eros.dreaming.session:
# an invocation goes on through the user's imported history while it has time, instead of one session a sweep).
_CLAIM_NEXT_IMPORTED = _CLAIM_TEMPLATE.format(only="""
      AND s.user_id = %(user)s AND s.external_id IS NOT NULL""")
# The claim's cut-offs: idle_before (quiet since), stale_before (a claim older is presumed dead).
SESSIONS = claims.JobTable("chat_sessions", _CLAIM, key=("id",), prefix="extraction_", pending="extracted_at IS NULL",
                           reads=("instance_id", "extraction_watermark"),
                           given_up="extracted_at = now(), extraction_gave_up = %(why)s")


def claim_next_imported(user_id: str, now: datetime, **cutoffs: datetime) -> dict | None:
    """Claim the user's next imported session that is due (the claim's order: their oldest not extracted, one at a
    time), as the sweep would; None: there is none."""
    return connection().execute(_CLAIM_NEXT_IMPORTED, {**cutoffs, "user": user_id, "limit": 1, "now": now}).fetchone()



def claim(idle_before: datetime, stale_before: datetime, limit: int, now: datetime | None = None) -> list[Claim]:
    """Claim up to ``limit`` idle sessions; ``now`` (default: the application's clock) stamps the claim."""
    return claims.claim(SESSIONS, limit, now, idle_before=idle_before, stale_before=stale_before)  # type: ignore[return-value]



# Retention (TRANSCRIPT_RETENTION_DAYS): messages sent before the cut-off whose session has been extracted
# through them (id <= its extraction watermark) are deleted; memories keep their message ids (provenance) and
# work as before. Message ids follow the order they were sent in, so the old messages are the low end of the
# primary key: ``first_kept`` is found by walking that end (the messages still there: those of sessions not
# extracted yet, few), and the batch is read below it in id order (a message stored with an older time
# than one before it is taken on a later sweep, once the messages before it are gone). A session never
# extracted keeps its messages: they are what dreaming has not read.
_EXPIRE = """
WITH bound AS (
    SELECT coalesce((SELECT id FROM engine.chat_messages WHERE sent_at >= %(before)s ORDER BY id LIMIT 1),
                    9223372036854775807) AS first_kept
), old AS MATERIALIZED (
    SELECT m.id FROM bound, engine.chat_messages m JOIN engine.chat_sessions s ON s.id = m.session_id
    WHERE m.id < bound.first_kept AND m.sent_at < %(before)s AND m.id <= s.extraction_watermark
      AND engine.app_of(m.user_id) = %(app)s
    ORDER BY m.id
    LIMIT %(limit)s
)
DELETE FROM engine.chat_messages WHERE id IN (SELECT id FROM old)
"""


def expire_messages(app: str, sent_before: datetime, limit: int) -> int:
    """Delete up to ``limit`` of ``app``'s extracted messages sent before ``sent_before`` (each app keeps its
    transcripts as long as its settings say); returns how many went."""
    return connection().execute(_EXPIRE, {"app": app, "before": sent_before, "limit": limit}).rowcount


def load(stale_before: datetime, idle_before: datetime) -> tuple[int, float]:
    """What dreaming has on its hands, in one round trip: the jobs claimed and not stale yet (sessions and
    deep passes: both run on the extract function), and how long the oldest session due for extraction
    has waited since it went quiet, in seconds (0 when none waits): the backlog age an alarm watches."""
    row = one(connection().execute(
        "SELECT (SELECT count(*) FROM engine.chat_sessions WHERE extraction_claimed_at IS NOT NULL"
        "        AND extracted_at IS NULL AND extraction_claimed_at >= %(stale)s)"
        "     + (SELECT count(*) FROM engine.user_deep_pass WHERE claimed_at IS NOT NULL"
        "        AND claimed_at >= %(stale)s) AS n,"
        " coalesce(extract(epoch FROM %(idle)s::timestamptz - (SELECT min(last_active_at) FROM engine.chat_sessions"
        "        WHERE extracted_at IS NULL AND last_active_at < %(idle)s)), 0)::float8 AS backlog",
        {"stale": stale_before, "idle": idle_before},
    ))
    return row["n"], row["backlog"]


def transcript(user_id: str, session_id: UUID, after_id: int | None, context_messages: int, limit: int
               ) -> tuple[list[Message], list[Message]]:
    """(earlier messages given as context, new messages to extract), each oldest first, with when each was sent
    (what extraction resolves "last week" against)."""
    conn = connection()
    new = conn.execute(
        "SELECT id, role, content, sent_at FROM engine.chat_messages WHERE user_id = %s AND session_id = %s"
        " AND id > %s ORDER BY id LIMIT %s",
        (user_id, session_id, after_id or 0, limit),
    ).fetchall()
    earlier = []
    if after_id and context_messages > 0:
        earlier = conn.execute(
            "SELECT id, role, content, sent_at FROM engine.chat_messages WHERE user_id = %s AND session_id = %s"
            " AND id <= %s ORDER BY id DESC LIMIT %s",
            (user_id, session_id, after_id, context_messages),
        ).fetchall()[::-1]
    return earlier, new


# What a session's episode is written with: the persona's name (the episode names it), and the episode the
# session already has, if an earlier extraction of it wrote one (a resumed session rewrites it, migration 0021).
_EPISODE_CONTEXT = """
SELECT p.name AS persona_name, e.id AS episode_id, e.content AS episode, e.occurred_at, e.occurred_precision
FROM engine.chat_sessions s
JOIN engine.persona_instances i ON i.id = s.instance_id
JOIN engine.personas p ON p.id = i.persona_id
LEFT JOIN engine.companion_memories e ON e.session_id = s.id AND e.user_id = s.user_id AND e.source = 'episode'
WHERE s.id = %(session)s AND s.user_id = %(user)s
"""


def episode_context(user_id: str, session_id: UUID) -> EpisodeContext:
    """The persona of the session, and its episode so far (None: none written yet, or the user deleted it)."""
    return one(connection().execute(_EPISODE_CONTEXT, {"session": session_id, "user": user_id}))


# One episode per session (the unique index of migration 0021): the first extraction of a session inserts it, a
# resumed one rewrites that row in place -- its text, embedding and event time are the model's whole updated
# account, its range grows to the messages read since, its metadata names the model that wrote it last and
# counts the rewrites. In place, without a version chain: an episode is no fact that changes but one account
# that grows, and no one restores half of it (relationship rows have no versions, docs/DESIGN.md). created_at
# stays when it was first written. An UPDATE, then an INSERT when it found none, rather than INSERT ... ON
# CONFLICT: every writer of a session's episode holds the user's memory lock (and an extraction the session's
# claim), so nothing can come between the two, and the statements need no unique index to infer -- a database
# partitioned by user has the index with user_id in it (tests/partitioning.py), where ON CONFLICT (session_id)
# would find none. The index stays what makes a second episode an error.
_REWRITE_EPISODE = """
UPDATE engine.companion_memories m SET
    content = %(content)s, embedding = %(embedding)s,
    from_message_id = least(m.from_message_id, %(from)s),
    through_message_id = greatest(m.through_message_id, %(through)s),
    metadata = m.metadata || %(metadata)s
        || jsonb_build_object('rewrites', coalesce((m.metadata->>'rewrites')::int, 0) + 1),
    occurred_at = %(occurred_at)s, occurred_precision = %(precision)s
WHERE m.session_id = %(session)s AND m.user_id = %(user)s AND m.source = 'episode'
RETURNING m.id
"""
_INSERT_EPISODE = """
INSERT INTO engine.companion_memories (id, session_id, user_id, instance_id, content, embedding, source,
    from_message_id, through_message_id, metadata, occurred_at, occurred_precision)
VALUES (%(id)s, %(session)s, %(user)s, %(instance)s, %(content)s, %(embedding)s, 'episode', %(from)s, %(through)s,
        %(metadata)s, %(occurred_at)s, %(precision)s)
"""


def write_episode(conn: Connection, session: Mapping[str, Any], episode: Mapping[str, Any],
                  replace: bool = True) -> str | None:
    """Write the session's episode (inside the caller's transaction, under the user's memory lock): 'written'
    (a new row) or 'rewritten' (the session's episode, updated in place); with ``replace`` False, None when the
    session has an episode already (left as it is)."""
    occurred_at, precision = event_columns(episode.get("occurred"))
    values = {"id": episode.get("id") or uuid4(), "session": session["id"], "user": session["user_id"],
              "instance": session["instance_id"], "content": episode["content"],
              "embedding": Vector(episode["embedding"]), "from": episode["from_message_id"],
              "through": episode["through_message_id"], "metadata": Jsonb(episode["metadata"]),
              "occurred_at": occurred_at, "precision": precision}
    if replace and conn.execute(_REWRITE_EPISODE, values).fetchone() is not None:
        return "rewritten"
    if not replace and conn.execute("SELECT 1 FROM engine.companion_memories WHERE session_id = %(session)s"
                                    " AND user_id = %(user)s AND source = 'episode'", values).fetchone():
        return None
    conn.execute(_INSERT_EPISODE, values)
    return "written"


# Sessions extracted before episodes existed (the backfill, eros.dreaming.episodes): read by an extraction (a
# watermark), not claimed now, without an episode, oldest first. ``whole``: retention deleted none of the messages
# it read -- every utterance of the session up to the watermark still has its message (an utterance row keeps its
# message's id), and some message is left; a session without it is skipped (an episode of half a session would
# say less than it seems to).
_WITHOUT_EPISODE = """
SELECT s.id, s.user_id, s.instance_id, s.extraction_watermark FROM engine.chat_sessions s
WHERE s.extraction_watermark IS NOT NULL AND s.extraction_claimed_at IS NULL
  AND (%(user)s::text IS NULL OR s.user_id = %(user)s)
  AND (%(app)s::text IS NULL OR engine.app_of(s.user_id) = %(app)s)
  AND NOT EXISTS (SELECT 1 FROM engine.companion_memories e
                  WHERE e.session_id = s.id AND e.user_id = s.user_id AND e.source = 'episode')
  AND (EXISTS (SELECT 1 FROM engine.chat_messages m
               WHERE m.session_id = s.id AND m.user_id = s.user_id AND m.id <= s.extraction_watermark)
       AND NOT EXISTS (SELECT 1 FROM engine.companion_memories u
                       WHERE u.session_id = s.id AND u.user_id = s.user_id AND u.source = 'utterance'
                         AND u.from_message_id <= s.extraction_watermark
                         AND NOT EXISTS (SELECT 1 FROM engine.chat_messages m
                                         WHERE m.id = u.from_message_id AND m.user_id = u.user_id))) = %(whole)s
ORDER BY s.last_active_at, s.id
LIMIT %(limit)s
"""


def sessions_without_episode(user_id: str | None, limit: int, whole: bool = True, *,
                             app: str | None = None) -> list[dict]:
    """Up to ``limit`` extracted sessions without an episode (of one user, or everyone's: of ``app`` when one is
    named), oldest first: those with their transcript whole, or (``whole`` False) those retention cut."""
    return connection().execute(_WITHOUT_EPISODE, {"user": user_id, "app": app, "limit": limit,
                                                   "whole": whole}).fetchall()


@retried
def add_episode(session: Mapping[str, Any], episode: Mapping[str, Any]) -> str | None:
    """The backfill's one write: the session's episode, under the user's memory lock, unless the session is gone
    (erased meanwhile: None) or has an episode by now (None)."""
    with transaction() as conn:
        consolidation.hold_user(conn, session["user_id"])
        if conn.execute("SELECT 1 FROM engine.chat_sessions WHERE id = %s AND user_id = %s FOR KEY SHARE",
                        (session["id"], session["user_id"])).fetchone() is None:
            return None
        return write_episode(conn, session, episode, replace=False)


# The known memories a session touches, found with no provider call: each new user turn of the
# session already has its vector in the relationship layer (the chat turn paid for it), so the
# active profile rows nearest to those turns are what the session is likely to confirm or change.
# Per turn the nearest ``limit``, then the best of those overall. Rows at the same distance (a lexical
# embedder puts every row that shares no word with the session at one distance) go by importance, then
# the newest: the facts a change is most likely to touch ("lives in", "works at") are the important ones.
# Bounded like recall (issue 27; sql/functions/recall.sql): the user's active rows are read once, without
# their vectors (`profile`: id, ctid and sign bits, through the partial profile index); per turn the
# ``shortlist`` nearest by Hamming distance of the sign bits (migration 0023) are fetched by ctid and ranked
# exactly. So a turn costs one popcount per profile row and ``shortlist`` exact distances, not an exact
# distance per row (20 turns x 2,000 rows were 40,000 of them). A profile of at most ``shortlist`` rows is
# ranked exactly, as before.
_TOUCHED = """
WITH turns AS (
    SELECT embedding, signs FROM engine.companion_memories
    WHERE session_id = %(session)s AND instance_id IS NOT NULL AND from_message_id > %(after)s
    ORDER BY from_message_id DESC
    LIMIT %(turns)s
), profile AS MATERIALIZED (
    SELECT ctid, id, signs FROM engine.companion_memories
    WHERE user_id = %(user)s AND instance_id IS NULL AND superseded_at IS NULL AND category IS NOT NULL
), near AS (
    SELECT m.* FROM turns t CROSS JOIN LATERAL (
        SELECT c.id, c.content, c.category, c.importance, c.created_at, c.occurred_at, c.occurred_precision,
               c.embedding <=> t.embedding AS distance
        FROM (SELECT p.ctid FROM profile p
              ORDER BY coalesce(bit_count(p.signs # t.signs), 0), p.id
              LIMIT %(shortlist)s) s
        JOIN engine.companion_memories c ON c.ctid = s.ctid AND c.user_id = %(user)s
        ORDER BY distance, c.importance DESC NULLS LAST, c.created_at DESC, c.id
        LIMIT %(limit)s
    ) m
)
SELECT id, content, category, importance, created_at, occurred_at, occurred_precision, min(distance) AS distance
FROM near
GROUP BY id, content, category, importance, created_at, occurred_at, occurred_precision
ORDER BY min(distance), importance DESC NULLS LAST, created_at DESC, id
LIMIT %(limit)s
"""
TOUCHED_SHORTLIST = 150  # per turn: 5x the 30 rows extraction is shown (extraction.MAX_KNOWN)


def touched_memories(user_id: str, session_id: UUID, after_id: int | None, limit: int,
                     turns: int = 20) -> list[KnownMemory]:
    """The user's active profile memories nearest to this session's last ``turns`` new user turns,
    nearest first."""
    return connection().execute(_TOUCHED, {"session": session_id, "after": after_id or 0, "user": user_id,
                                           "turns": turns, "limit": limit,
                                           "shortlist": max(TOUCHED_SHORTLIST, limit)}).fetchall()


# What an extraction that found nothing worth remembering (no new messages, or only questions and small talk) stamps
# as the session's extraction_error: it is extracted all the same, and listed as "nothing" (store.chat's dreaming
# state), not as a session that has memories.
NOTHING_TO_REMEMBER = "nothing to remember in this session"


@retried
def finish(session: ClaimedSession, claim_token: datetime, memories: list[dict], watermark: int | None,
           error: str | None, confirm: Sequence[tuple[UUID, float]] = (), first_message_id: int | None = None,
           told: Mapping[UUID, EventTime] | None = None, episode: Mapping[str, Any] | None = None) -> dict | None:
    """ONE transaction: insert the profile rows, apply their consolidation, write the session's episode (if the
    answer had one: ``write_episode``), and stamp the session, only if the claim still holds.

    Each memory may carry ``id``, ``occurred`` (its ``EventTime``) and ``supersedes`` (ids of known rows it
    replaces); ``confirm`` are known rows the session repeated (noted with the message range read,
    ``first_message_id`` to ``watermark``), ``told`` the event times some of those repeats named (each merged
    with the row's own as it is when locked). Only the user's own active profile rows are touched; whatever
    else was asked is counted as ``ignored``. The session is stamped ``extracted_at`` unless
    messages beyond the new ``watermark`` exist (turns that arrived meanwhile, or windows not read
    yet): then it stays eligible for the next sweep, which starts from the new watermark.
    Returns the counts (``episode``: 'written', 'rewritten' or None), or None when the claim was lost (nothing
    written).
    """
    counts: dict[str, Any] = {"inserted": len(memories), "superseded": 0, "confirmed": 0, "ignored": 0,
                              "episode": None}
    user = session["user_id"]
    with transaction() as conn:
        consolidation.hold_user(conn, user)  # the lock order: the user's memory lock, then the session, then rows
        if claims.lock(conn, SESSIONS, session, claim_token) is None:
            return None
        held = consolidation.lock(conn, user, [i for m in memories for i in m.get("supersedes") or []]
                                  + [memory_id for memory_id, _ in confirm])
        if memories:
            rows = [m | {"id": m.get("id") or uuid4()} for m in memories]
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO engine.companion_memories (id, session_id, user_id, instance_id, content, embedding,"
                    " category, importance, source, from_message_id, through_message_id, metadata, occurred_at,"
                    " occurred_precision) VALUES (%s, %s, %s, NULL, %s, %s, %s, %s, 'dreaming', %s, %s, %s, %s, %s)",
                    [(m["id"], session["id"], user, m["content"], Vector(m["embedding"]), m["category"],
                      m["importance"], m.get("from_message_id"), m.get("through_message_id"), Jsonb(m["metadata"]),
                      *event_columns(m.get("occurred")))
                     for m in rows],
                )
            for m in rows:
                asked = m.get("supersedes") or []
                done = consolidation.supersede(conn, user, m["id"], asked, "changed") if asked else []
                counts["superseded"] += len(done)
                counts["ignored"] += len(asked) - len(done)
        said_in = (session["id"], first_message_id, watermark) if first_message_id and watermark else None
        for memory_id, importance in confirm:
            known = held.get(memory_id)
            merged = later_telling(known, (told or {}).get(memory_id))
            ok = consolidation.confirm(conn, user, memory_id, importance, said_in=said_in,
                                       occurred=merged if merged != known else None)
            counts["confirmed" if ok else "ignored"] += 1
        if memories or counts["superseded"]:
            consolidation.mark_changed(conn, user)
        if episode is not None:  # the relationship layer: nothing the deep pass reads, so no mark_changed
            counts["episode"] = write_episode(conn, session, episode)
        conn.execute(
            "UPDATE engine.chat_sessions SET"
            " extraction_watermark = coalesce(%(watermark)s, extraction_watermark),"
            " extracted_at = CASE WHEN EXISTS (SELECT 1 FROM engine.chat_messages WHERE user_id = %(user)s"
            "     AND session_id = %(id)s"
            "     AND id > coalesce(%(watermark)s, extraction_watermark, 0)) THEN NULL ELSE now() END,"
            " extraction_claimed_at = NULL, extraction_started_at = NULL, extraction_error = %(error)s,"
            " extraction_attempts = 0, extraction_retries = 0, extraction_retrying_since = NULL,"
            " extraction_next_attempt_at = NULL, extraction_gave_up = NULL"
            " WHERE id = %(id)s AND user_id = %(user)s",
            {"id": session["id"], "user": user, "watermark": watermark, "error": error},
        )
    return counts


def redrive(why: str = "retry-window", user_id: str | None = None) -> list[UUID]:
    """Make sessions that were given up on (``why``) eligible again with fresh counters: after an
    outage longer than the retry window, once the provider is back. Returns their ids."""
    rows = connection().execute(
        "UPDATE engine.chat_sessions SET extracted_at = NULL, extraction_gave_up = NULL,"
        " extraction_error = NULL, extraction_attempts = 0, extraction_retries = 0,"
        " extraction_retrying_since = NULL, extraction_next_attempt_at = NULL,"
        " extraction_claimed_at = NULL, extraction_started_at = NULL"
        " WHERE extraction_gave_up = %s AND (%s::text IS NULL OR user_id = %s) RETURNING id",
        (why, user_id, user_id),
    ).fetchall()
    return [r["id"] for r in rows]
