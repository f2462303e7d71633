"""The two memory layers: listing and deletion. Recall ranking lives in ``eros.store.recall``."""

from __future__ import annotations

from uuid import UUID

from ..db import connection


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
