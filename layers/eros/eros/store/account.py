"""Everything the engine holds about one user, as one unit: erasure (``DELETE /v1/me``, ``eros forget``).

``erase`` runs in one transaction and locks before it deletes, so that no dreaming work in flight can
write after it:

* the user's sessions (``FOR UPDATE``): an extraction's final transaction locks its session row and
  re-checks its claim (``store.dreaming.finish``), so it either committed before the erasure (and its
  rows are deleted below, in later statements that see them) or finds no session and writes nothing;
  a chat turn's message insert needs the session row too and fails on the missing key;
* the user's deep-pass row (``user_consolidation``, ``FOR UPDATE``): a deep pass applies its plan only
  while it holds that row with its claim token (``store.deep_pass``), so the same holds for it.

Then everything keyed by the user goes: both memory layers with their superseded history, messages
(with their sessions, ON DELETE CASCADE), sessions (and with them any dreaming claim on them), persona
instances, the deep-pass row and usage. Erasing a user with nothing stored erases nothing and succeeds.
"""

from __future__ import annotations

from ..db import transaction

# Children before parents; each statement sees what was committed before it started (READ COMMITTED),
# so memories a finishing extraction committed while the locks were awaited are in the first DELETE.
_ERASE = (
    ("memories", "DELETE FROM engine.companion_memories WHERE user_id = %(user)s"),
    ("messages", "DELETE FROM engine.chat_messages m USING engine.chat_sessions s"
                 " WHERE m.session_id = s.id AND s.user_id = %(user)s"),
    ("sessions", "DELETE FROM engine.chat_sessions WHERE user_id = %(user)s"),
    ("persona_instances", "DELETE FROM engine.persona_instances WHERE user_id = %(user)s"),
    ("deep_pass", "DELETE FROM engine.user_consolidation WHERE user_id = %(user)s"),
    ("usage_days", "DELETE FROM engine.user_usage WHERE user_id = %(user)s"),
)


def erase(user_id: str) -> dict[str, int]:
    """Delete every row of ``user_id``; returns how many of each kind went (all 0 the second time)."""
    with transaction() as conn:
        conn.execute("SELECT id FROM engine.chat_sessions WHERE user_id = %s ORDER BY id FOR UPDATE", (user_id,))
        conn.execute("SELECT user_id FROM engine.user_consolidation WHERE user_id = %s FOR UPDATE", (user_id,))
        return {kind: conn.execute(statement, {"user": user_id}).rowcount for kind, statement in _ERASE}
