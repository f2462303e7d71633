"""The recall use-case: what the persona is reminded of before it answers.

For one user message: the profile layer (who the user is) and the relationship layer (what
happened between the user and this persona instance), each ranked by the configured strategy in
one SQL round trip (``eros.store.recall``), then cross-layer hygiene so that the prompt never
carries the same thing twice.

Strategies (``RECALL_STRATEGY``), with ``s`` the cosine similarity to the message, ``d =
exp(-age_days / tau)`` and importance 0.5 where a row has none:

* ``grouped``   -- the original behaviour: the ``RECALL_PER_CATEGORY`` nearest profile rows of
  each category; the ``RELATIONSHIP_TOP_K`` nearest relationship rows.
* ``recency``   -- ``s + lambda * d``; a global top ``RECALL_TOP_K`` across categories.
* ``composite`` -- ``s * (floor + (1 - floor) * d) * (ifloor + (1 - ifloor) * importance)``;
  likewise. ``floor`` is what a very old row keeps of its score: an old but still-true fact ("has
  a daughter") fades to the floor, never to nothing. ``ifloor`` (``RECALL_IMPORTANCE_FLOOR``)
  does the same for importance; 0 gives the plain ``s x decay x importance``. It exists because
  real embedders compress cosine similarity into a narrow band (unrelated texts already score
  ~0.75 with e5, well above 0 with Voyage): multiplied by a raw importance in [0, 1], importance
  then outweighs relevance and the important-but-unrelated fact wins every query
  (bench/results/recall_eval_e5.md measures it).

``RECALL_CATEGORY_CAP`` (0: none) optionally caps any one category in the global strategies. The
defaults are the winners of ``bench/recall_eval.py`` (see ``bench/results/recall_summary.md``).

Every strategy then adds a small importance term, ``w * importance`` (``RECALL_IMPORTANCE_WEIGHT``),
and subtracts ``RECALL_DEMOTE_PENALTY`` from an older profile row when a newer active row of the
same category is at least ``RECALL_DEMOTE_SIMILARITY`` cosine-similar to it (checked among the
``RECALL_DEMOTE_POOL`` best rows only): the read-time safety net for an update that write-time
consolidation did not catch. It demotes, never hides; the relationship layer is not demoted.
``eros.store.recall`` has the SQL and the exact rule. With e5 embeddings a memory's cosine to a
newer one does not tell an update from a related-but-true fact, so the default penalty is small
(bench/results/recall_summary.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable
from uuid import UUID

from .config import CATEGORIES, Settings, settings
from .store import recall as recall_store

_SPACE = re.compile(r"\s+")
_PUNCT = re.compile(r"[^\w\s]")
_MAX_EXPONENT = 700.0  # the SQL clamps exp()'s argument the same way (Postgres raises on underflow)


@dataclass(frozen=True)
class RecallParams:
    strategy: str = "recency"
    per_category: int = 2
    top_k: int = 10
    category_cap: int = 0  # 0: no cap
    relationship_top_k: int = 5
    lam: float = 0.002
    tau_days: float = 365.0
    floor: float = 0.9
    importance_floor: float = 0.9
    dedupe_similarity: float = 0.97  # >= this cosine between two recalled rows: the same thing
    importance_weight: float = 0.05  # score += w * importance (0.5 where missing)
    demote_similarity: float = 0.84  # an older profile row this close to a newer one of its category...
    demote_penalty: float = 0.01  # ...loses this much score (above 1 or 0: off)
    demote_pool: int = 32  # ...checked among this many best rows only

    @classmethod
    def from_settings(cls, cfg: Settings) -> "RecallParams":
        return cls(strategy=cfg.recall_strategy, per_category=cfg.recall_per_category, top_k=cfg.recall_top_k,
                   category_cap=cfg.recall_category_cap, relationship_top_k=cfg.relationship_top_k,
                   lam=cfg.recall_decay_lambda, tau_days=cfg.recall_decay_tau_days, floor=cfg.recall_decay_floor,
                   importance_floor=cfg.recall_importance_floor,
                   dedupe_similarity=cfg.recall_dedupe_similarity,
                   importance_weight=cfg.recall_importance_weight, demote_similarity=cfg.recall_demote_similarity,
                   demote_penalty=cfg.recall_demote_penalty, demote_pool=cfg.recall_demote_pool)


@dataclass
class Recalled:
    profile: list[dict] = field(default_factory=list)
    relationship: list[dict] = field(default_factory=list)


# --- the ranking math, in Python: the twin of the SQL in eros.store.recall ------------------------

def decay(age_days: float, tau_days: float) -> float:
    return math.exp(-min(max(age_days, 0.0) / tau_days, _MAX_EXPONENT))


def score(strategy: str, similarity: float, age_days: float, importance: float | None,
          params: RecallParams) -> float:
    """A row's undemoted score: the strategy's base score plus the additive importance term."""
    weight = 0.5 if importance is None else importance
    if strategy == "grouped":
        base = similarity
    elif strategy == "recency":
        base = similarity + params.lam * decay(age_days, params.tau_days)
    elif strategy == "composite":
        base = (similarity * (params.floor + (1 - params.floor) * decay(age_days, params.tau_days))
                * (params.importance_floor + (1 - params.importance_floor) * weight))
    else:
        raise ValueError(f"unknown recall strategy {strategy!r}")
    return base + params.importance_weight * weight


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

    def _check(self, row: dict) -> tuple[bool, str, tuple[list[float], float] | None]:
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

    def take(self, rows: Iterable[dict], k: int, cap: int | None = None) -> list[dict]:
        """The first ``k`` non-repeating rows in order, at most ``cap`` per category."""
        out: list[dict] = []
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

def recall(user_id: str, instance_id: UUID | None, query: list[float], *, history: Iterable[dict] = (),
           message: str | None = None, now: datetime | None = None,
           params: RecallParams | None = None) -> Recalled:
    """The memories to put in front of the persona for this message.

    ``history`` are the prompt's history messages and ``message`` the one being answered: recalled
    text that repeats any of them is not injected again. ``now`` defaults to the database's time;
    rows created after it are not recalled.
    """
    p = params or RecallParams.from_settings(settings())
    if p.strategy not in ("grouped", "recency", "composite"):
        raise ValueError(f"unknown recall strategy {p.strategy!r}")
    if p.strategy == "grouped":
        k, cap = p.per_category * len(CATEGORIES), p.per_category
    else:
        k, cap = p.top_k, (p.category_cap or None)
    rel_k = p.relationship_top_k if instance_id is not None else 0
    # Over-fetch: hygiene may drop a few rows, and the prompt should still get its full quota.
    # The SQL's cost is the scan of the user's rows, not the length of the answer.
    common = {"now": now, "lam": p.lam, "tau_days": p.tau_days, "floor": p.floor,
              "importance_floor": p.importance_floor, "importance_weight": p.importance_weight}
    profile = recall_store.ranked("profile", p.strategy, user_id, query, k=2 * k,
                                  cap=2 * cap if cap else None, demote_similarity=p.demote_similarity,
                                  demote_penalty=p.demote_penalty, demote_pool=p.demote_pool, **common)
    relationship = recall_store.ranked("relationship", p.strategy, user_id, query, k=2 * rel_k,
                                       instance_id=instance_id, **common) if rel_k > 0 else []
    hygiene = Hygiene([m["content"] for m in history] + ([message] if message else []), p.dedupe_similarity)
    return Recalled(profile=hygiene.take(profile, k, cap), relationship=hygiene.take(relationship, rel_k))
