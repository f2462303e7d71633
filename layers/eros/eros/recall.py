"""The recall use-case: what the persona is reminded of before it answers.

For one user message: the profile layer (who the user is) and the relationship layer (what
happened between the user and this persona instance), each ranked in one SQL round trip by the
configured strategy (``Settings.recall``; the formulas, the safety net's demotion and why each
term exists are documented once, next to the SQL, in ``eros.store.recall``), then cross-layer
hygiene so that the prompt never carries the same thing twice. The defaults are the winners of
``bench/recall_eval.py`` (``bench/results/recall_summary.md``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from .config import RecallParams, settings
from .memory import CATEGORIES, MemoryLayer
from .store import recall as recall_store
from .store.rows import RankedMemory

_SPACE = re.compile(r"\s+")
_PUNCT = re.compile(r"[^\w\s]")


@dataclass
class Recalled:
    profile: list[RankedMemory] = field(default_factory=list)
    relationship: list[RankedMemory] = field(default_factory=list)


# --- hygiene ------------------------------------------------------------------------------------

def normalised(text: str) -> str:
    """The comparison key for "the same text": case, punctuation and spacing folded."""
    return _SPACE.sub(" ", _PUNCT.sub(" ", text.casefold())).strip()


def _with_norm(vector) -> tuple[list[float], float] | None:
    """The vector as Python floats (math.sumprod is fast on those) and its norm; None when zero."""
    values = vector.to_list() if hasattr(vector, "to_list") else [float(v) for v in vector]
    norm = math.sqrt(math.sumprod(values, values))
    return (values, norm) if norm > 0 else None


class Hygiene:
    """Cross-layer hygiene: nothing is said twice in one prompt.

    ``take`` walks ranked rows and keeps one unless its normalised text is already in the prompt
    (``seen_texts``: the history and the message being answered) or was kept before, or its
    embedding is within ``similarity`` cosine of a row kept before (near-identical text). Only the
    rows actually kept count as "said": a row dropped by a quota cannot shadow a later one. Take
    the profile before the relationship layer, so the distilled fact wins over the raw utterance;
    inside a layer the better-ranked row wins. Rows without an ``embedding`` compare by text only.
    """

    def __init__(self, seen_texts: Iterable[str] = (), similarity: float = 0.95):
        self.similarity = similarity
        self._texts = {normalised(t) for t in seen_texts}
        self._vectors: list[tuple[list[float], float]] = []

    def _check(self, row: Mapping[str, Any]) -> tuple[bool, str, tuple[list[float], float] | None]:
        key = normalised(row["content"])
        if not key or key in self._texts:
            return True, key, None
        vector = _with_norm(row["embedding"]) if row.get("embedding") is not None else None
        if vector is not None:
            values, norm = vector
            if any(math.sumprod(values, other) >= self.similarity * norm * other_norm
                   for other, other_norm in self._vectors if len(other) == len(values)):
                return True, key, vector
        return False, key, vector

    def take[R: Mapping[str, Any]](self, rows: Iterable[R], k: int, cap: int | None = None) -> list[R]:
        """The first ``k`` non-repeating rows in order, at most ``cap`` per category."""
        out: list[R] = []
        per_category: dict[str | None, int] = {}
        for row in rows:
            if len(out) >= k:
                break
            n = per_category.get(row["category"], 0)
            if cap and n >= cap:
                continue
            repeated, key, vector = self._check(row)
            if repeated:
                continue
            per_category[row["category"]] = n + 1
            self._texts.add(key)
            if vector is not None:
                self._vectors.append(vector)
            out.append(row)
        return out


# --- the use-case -------------------------------------------------------------------------------

def recall(user_id: str, instance_id: UUID | None, query: list[float], *, history: Iterable[Mapping[str, Any]] = (),
           message: str | None = None, now: datetime | None = None,
           params: RecallParams | None = None) -> Recalled:
    """The memories to put in front of the persona for this message.

    ``history`` are the prompt's history messages and ``message`` the one being answered: recalled
    text that repeats any of them is not injected again. ``now`` defaults to the database's time;
    rows created after it are not recalled.
    """
    p = params or settings().recall
    if p.strategy == "grouped":
        k, cap = p.per_category * len(CATEGORIES), p.per_category
    else:
        k, cap = p.top_k, p.category_cap  # 0: no cap
    rel_k = p.relationship_top_k if instance_id is not None else 0
    # Over-fetch: hygiene may drop a few rows, and the prompt should still get its full quota.
    # The SQL's cost is the scan of the user's rows, not the length of the answer.
    profile = recall_store.ranked(MemoryLayer.PROFILE, p, user_id, query, k=2 * k, cap=2 * cap if cap else None,
                                  now=now)
    relationship = recall_store.ranked(MemoryLayer.RELATIONSHIP, p, user_id, query, k=2 * rel_k, cap=None,
                                       instance_id=instance_id, now=now) if rel_k > 0 else []
    hygiene = Hygiene([m["content"] for m in history] + ([message] if message else []), p.dedupe_similarity)
    return Recalled(profile=hygiene.take(profile, k, cap), relationship=hygiene.take(relationship, rel_k))
