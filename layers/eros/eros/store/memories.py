"""The two memory layers: recall, listing, deletion (and, for dreaming, the profile writes)."""

from __future__ import annotations

from uuid import UUID

from pgvector import Vector

from ..db import connection

# Profile recall, "grouped": the nearest rows per category, categorised profile rows only.
_PROFILE_GROUPED = """
SELECT id, content, category, importance, created_at, distance FROM (
    SELECT id, content, category, importance, created_at, embedding <=> %(q)s AS distance,
           row_number() OVER (PARTITION BY category ORDER BY embedding <=> %(q)s, id) AS rank
    FROM engine.companion_memories
    WHERE user_id = %(user)s AND instance_id IS NULL AND category IS NOT NULL
) ranked
WHERE rank <= %(per_category)s
ORDER BY category, distance, id
"""

_RELATIONSHIP = """
SELECT id, content, category, importance, created_at, embedding <=> %(q)s AS distance
FROM engine.companion_memories
WHERE user_id = %(user)s AND instance_id = %(instance)s
ORDER BY distance, id
LIMIT %(k)s
"""


def recall_profile(user_id: str, query: list[float], per_category: int) -> list[dict]:
    return connection().execute(_PROFILE_GROUPED, {"q": Vector(query), "user": user_id,
                                                    "per_category": per_category}).fetchall()


def recall_relationship(user_id: str, instance_id: UUID, query: list[float], k: int) -> list[dict]:
    if k <= 0:
        return []
    return connection().execute(_RELATIONSHIP, {"q": Vector(query), "user": user_id, "instance": instance_id,
                                                "k": k}).fetchall()


def list_memories(user_id: str, layer: str | None, category: str | None, limit: int,
                  before: UUID | None = None) -> list[dict]:
    """The user's own memories, newest first, without embeddings."""
    return connection().execute(
        "SELECT m.id, CASE WHEN m.instance_id IS NULL THEN 'profile' ELSE 'relationship' END AS layer,"
        " m.category, m.content, m.importance, m.session_id, i.persona_id, m.created_at"
        " FROM engine.companion_memories m LEFT JOIN engine.persona_instances i ON i.id = m.instance_id"
        " WHERE m.user_id = %(user)s"
        "   AND (%(layer)s::text IS NULL OR (%(layer)s = 'profile') = (m.instance_id IS NULL))"
        "   AND (%(category)s::text IS NULL OR m.category = %(category)s)"
        "   AND (%(before)s::uuid IS NULL OR (m.created_at, m.id) <"
        "        (SELECT created_at, id FROM engine.companion_memories WHERE id = %(before)s AND user_id = %(user)s))"
        " ORDER BY m.created_at DESC, m.id DESC LIMIT %(limit)s",
        {"user": user_id, "layer": layer, "category": category, "limit": limit, "before": before},
    ).fetchall()


def delete_memory(user_id: str, memory_id: UUID) -> bool:
    row = connection().execute(
        "DELETE FROM engine.companion_memories WHERE id = %s AND user_id = %s RETURNING id", (memory_id, user_id)
    ).fetchone()
    return row is not None
