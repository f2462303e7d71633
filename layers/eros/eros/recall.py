"""The recall use-case: what the persona is reminded of before it answers.

For one user message: the profile layer (who the user is) and the relationship layer (what
happened between the user and this persona instance), both ranked by the configured strategy in one
SQL statement, one round trip (``Settings.recall``; the formulas, the safety net's demotion and why each
term exists are written once, next to the statement, in ``eros/sql/functions/recall.sql``), then cross-layer
hygiene so that the prompt never carries the same thing twice. The defaults are the winners of
``bench/recall_eval.py`` (``bench/results/recall_summary.md``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, Field

from . import calibrated
from .config import RecallKnobs, settings
from .memory import CATEGORIES, MemoryLayer
from .store import recall as recall_store
from .store.rows import RecallCandidate, Scored

_SPACE = re.compile(r"\s+")
_PUNCT = re.compile(r"[^\w\s]")


class ScoreParts(BaseModel):
    """Why a ranked memory is where it is: its score is similarity + recency + importance + lexical - demotion."""
    similarity: float = Field(description="cosine similarity of the memory to the query")
    recency: float = Field(description="what its age adds (or, composite strategy, takes away)")
    importance: float = Field(description="what its importance adds")
    lexical: float = Field(description="what its words shared with the message add (names, numbers, rare words)")
    demotion: float = Field(description="taken away when a newer, similar memory of its category outranks it")

    @classmethod
    def of(cls, row: Scored) -> ScoreParts:
        return cls(similarity=row["similarity"], recency=row["recency_term"], importance=row["importance_term"],
                   lexical=row["lexical_term"], demotion=row["demotion"])


@dataclass
class Recalled:
    profile: list[RecallCandidate] = field(default_factory=list)
    relationship: list[RecallCandidate] = field(default_factory=list)


# --- hygiene ------------------------------------------------------------------------------------

def normalised(text: str) -> str:
    """The comparison key for "the same text": case, punctuation and spacing folded."""
    return _SPACE.sub(" ", _PUNCT.sub(" ", text.casefold())).strip()


class Hygiene:
    """Cross-layer hygiene: nothing is said twice in one prompt.

    ``take`` walks ranked rows and keeps one unless its normalised text is already in the prompt
    (``seen_texts``: the history and the message being answered) or was kept before, or it is a
    near-duplicate of a row kept before: its ``near`` names the rows placed before it whose embedding is
    within the configured cosine similarity of its own (near-identical text; the recall SQL computes them,
    ``store.recall.candidates``). Only the rows actually kept count as "said": a row dropped by a quota
    cannot shadow a later one. Take the profile before the relationship layer, so the distilled fact wins
    over the raw utterance; inside a layer the better-ranked row wins. Rows without ``near`` compare by text
    only.
    """

    def __init__(self, seen_texts: Iterable[str] = ()):
        self._texts = {normalised(t) for t in seen_texts}
        self._kept: set[Any] = set()

    def _repeats(self, row: Mapping[str, Any], key: str) -> bool:
        return not key or key in self._texts or not self._kept.isdisjoint(row.get("near") or ())

    def take[R: Mapping[str, Any]](self, rows: Iterable[R], k: int, cap: int | None = None) -> list[R]:
        """The first ``k`` non-repeating rows in order, at most ``cap`` per category."""
        out: list[R] = []
        per_category: dict[str | None, int] = {}
        for row in rows:
            if len(out) >= k:
                break
            n = per_category.get(row["category"], 0)
            key = normalised(row["content"])
            if (cap and n >= cap) or self._repeats(row, key):
                continue
            per_category[row["category"]] = n + 1
            self._texts.add(key)
            self._kept.add(row["id"])
            out.append(row)
        return out


# --- the use-case -------------------------------------------------------------------------------

def _quota(p: RecallKnobs) -> tuple[int, int]:
    """The profile rows a prompt gets, and at most how many of a category (0: no cap)."""
    if p.strategy == "grouped":
        return p.per_category * len(CATEGORIES), p.per_category
    return p.top_k, p.category_cap


def most_recalled(p: RecallKnobs) -> int:
    """The most memories a turn's prompt can carry, both layers (what a turn's reservation allows for)."""
    return _quota(p)[0] + p.relationship_top_k


def recall(user_id: str, instance_id: UUID | None, query: list[float], *, history: Iterable[Mapping[str, Any]] = (),
           message: str | None = None, now: datetime | None = None,
           knobs: RecallKnobs | None = None, model: str | None = None) -> Recalled:
    """The memories to put in front of the persona for this message.

    ``history`` are the prompt's history messages and ``message`` the one being answered: recalled
    text that repeats any of them is not injected again. ``now`` defaults to the database's time;
    rows created after it are not recalled. ``model`` embedded ``query`` (refused if the stored vectors are of another
    model: ``EmbedderMismatch``); the thresholds and weights the environment or ``knobs`` do not set are the stored
    vectors' model's (eros.calibrated).
    """
    if model is not None:
        calibrated.guard(model)
    p = calibrated.effective(settings(), knobs=knobs, model=model).recall
    k, cap = _quota(p)
    rel_k = p.relationship_top_k if instance_id is not None else 0
    # Over-fetch: hygiene may drop a few rows, and the prompt should still get its full quota.
    # The SQL's cost is the scan of the user's rows, not the length of the answer. Both layers, and the
    # near-duplicates among them, in one statement.
    rows = recall_store.candidates(p, user_id, query, k=2 * k, cap=2 * cap if cap else None, relationship_k=2 * rel_k,
                                   instance_id=instance_id, dedupe=p.dedupe_similarity, message=message, now=now,
                                   model=model)
    hygiene = Hygiene([m["content"] for m in history] + ([message] if message else []))
    return Recalled(profile=hygiene.take([r for r in rows if r["layer"] == MemoryLayer.PROFILE], k, cap),
                    relationship=hygiene.take([r for r in rows if r["layer"] == MemoryLayer.RELATIONSHIP], rel_k))
