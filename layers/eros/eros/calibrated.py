"""The similarity thresholds and score weights the engine uses, for the embedding model of the vectors it compares
(issue 30), and the guard that keeps vectors of two models from being compared.

Each of the five knobs (``KNOBS``) comes from, in this order:

1. its environment variable, when set (``RECALL_DEDUPE_SIMILARITY``, ``RECALL_DEMOTE_SIMILARITY``,
   ``RECALL_LEXICAL_WEIGHT``, ``RECALL_IMPORTANCE_WEIGHT``, ``DEEP_PASS_SIMILARITY``; or a value the code passes
   explicitly, as a bench sweep does): "env";
2. the newest calibration ``eros calibrate`` stored for the model (engine.embedding_calibrations): "calibrated";
3. the calibration the code ships for it (eros.calibration.SHIPPED): "shipped";
4. the defaults of eros.config, tuned on e5: "default" -- the model is uncalibrated, and health says so.

The model is the one the stored vectors came from (engine.embedding_space, migration 0032): the thresholds are
on the scale of the vectors compared. Before any vector is stored, it is the configured embedder's.

``guard(model)`` is called before a vector of the configured embedder is compared with stored ones or written:
another model than the recorded one raises ``EmbedderMismatch`` (a configuration fault: a turn answers 503
``provider_misconfigured``, dreaming holds). Migration 0032's trigger refuses such a write too, on every path.

What the database says is kept per process for ``TTL_SECS``: a container pays one round trip for it a minute, not
one a turn, and uses a calibration ``eros calibrate`` stored within that time. (A container that read "no vector
stored yet" keeps that as long; if another container meanwhile records another model, this one's writes are
refused by the trigger: what it may compare meanwhile is a misconfigured deploy's first minute.)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from . import calibration
from .config import EMBED_DIM, RecallKnobs, Settings, settings
from .observability import logger
from .providers.base import EmbedderMismatch

Source = Literal["env", "calibrated", "shipped", "default"]

# The knobs a calibration sets, and the environment variable that overrides each.
RECALL_KNOBS = ("dedupe_similarity", "demote_similarity", "lexical_weight", "importance_weight", "demote_penalty",
                "recency_weight", "lexical_year_weight")
KNOBS = (*RECALL_KNOBS, "deep_pass_similarity")
# A calibration's name for a knob -> RecallKnobs' field, where they differ.
FIELDS = {name: {"recency_weight": "lam"}.get(name, name) for name in RECALL_KNOBS}
ENV_NAMES = {name: RecallKnobs.model_fields[FIELDS[name]].alias or name for name in RECALL_KNOBS} | {
    "deep_pass_similarity": "DEEP_PASS_SIMILARITY"}
SCALED = ("demote_penalty", "recency_weight", "lexical_year_weight")  # the weights migration 0034 added

TTL_SECS = 60.0  # what a container keeps of the database's answer
# ... while a re-embedding is under way (migration 0033): its switch changes the model every container embeds with,
# and a container must learn that within a turn or two (a write of the old model's vector after the switch is
# refused by the trigger; a read-only comparison would be of two models for as long as this).
SWITCHING_TTL_SECS = 1.0


class Thresholds(BaseModel):
    """A calibration's values, validated as the engine would use them: the ranges of eros.config's knobs, and the
    order every model's cosines keep (a cluster cut no higher than the demotion, which is no higher than the
    near-duplicate cut; a demotion above 1 is the safety net turned off)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    dedupe_similarity: float = Field(gt=0, le=1)
    demote_similarity: float = Field(gt=0, le=2)
    deep_pass_similarity: float = Field(gt=0, le=1)
    lexical_weight: float = Field(ge=0, le=1)
    importance_weight: float = Field(ge=0, le=1)
    demote_penalty: float = Field(calibration.REFERENCE.demote_penalty, ge=0, le=1)
    recency_weight: float = Field(calibration.REFERENCE.recency_weight, ge=0, le=10)
    lexical_year_weight: float = Field(calibration.REFERENCE.lexical_year_weight, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> Thresholds:
        if self.deep_pass_similarity > self.dedupe_similarity:
            raise ValueError(f"deep_pass_similarity {self.deep_pass_similarity} is above dedupe_similarity"
                             f" {self.dedupe_similarity}: every cluster would be near-duplicates")
        if self.demote_similarity <= 1 and not (
                self.deep_pass_similarity <= self.demote_similarity <= self.dedupe_similarity):
            raise ValueError(f"demote_similarity {self.demote_similarity} is not between deep_pass_similarity"
                             f" {self.deep_pass_similarity} and dedupe_similarity {self.dedupe_similarity}")
        return self


def validated(values: Any) -> Thresholds:
    """``values`` (a Calibration, or a mapping) as thresholds the engine can use; ValueError says why not."""
    data = values.as_dict() if isinstance(values, calibration.Calibration) else dict(values)
    try:
        return Thresholds.model_validate(data)
    except ValidationError as exc:
        raise ValueError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'calibration'}: "
                                   f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())) from None


@dataclass(frozen=True)
class Effective:
    """What the engine uses for one model: the values, where each came from, and what the database said."""

    model: str  # the model the thresholds are for (the stored vectors')
    base: Source  # where the values not set in the environment come from
    values: dict[str, float]
    sources: dict[str, Source]
    recall: RecallKnobs
    deep_pass_similarity: float
    space: dict[str, Any] | None = None  # engine.embedding_space's row (None: no vector stored yet)
    stored: dict[str, Any] | None = None  # the stored calibration used (its row), when base is "calibrated"
    refused: str | None = None  # a stored calibration that failed validation, and why (then not used)
    sample: int = 0

    @property
    def source(self) -> Source:
        """One word for all five: "env" when the environment sets every knob, else the base's."""
        return "env" if all(s == "env" for s in self.sources.values()) else self.base

    @property
    def calibrated(self) -> bool:
        """Whether the values are meant for this model (not e5's defaults applied to another model)."""
        return self.source != "default" or self.model == calibration.REFERENCE_MODEL

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "source": self.source, "base": self.base, "values": dict(self.values),
                "sources": dict(self.sources), "sample": self.sample, "refused": self.refused,
                "calibrated_at": self.stored["created_at"] if self.stored else None}


@dataclass
class _Kept:
    at: float
    state: dict[str, Any]


_lock = threading.Lock()
_kept: dict[str, _Kept] = {}


def reset() -> None:
    """Forget what the database said (tests; a calibration just stored by this process)."""
    with _lock:
        _kept.clear()


def _state(model: str | None) -> dict[str, Any]:
    """engine.embedding_space and the newest stored calibration of ``model`` (None: of the stored vectors' model),
    as kept for TTL_SECS."""
    from .store import embedding as embedding_store

    now = time.monotonic()
    key = model or ""
    with _lock:
        kept = _kept.get(key)
        switching = bool(kept and kept.state["space"] and kept.state["space"].get("next_model"))
        if kept and now - kept.at < (SWITCHING_TTL_SECS if switching else TTL_SECS):
            return kept.state
    state = embedding_store.state(model)
    with _lock:
        _kept[key] = _Kept(now, state)
    return state


def configured_model() -> str:
    """The model of the configured embedder (the offline stand-in's when no embedder is configured)."""
    from . import providers

    return providers.embedder().model


def embedder() -> Any:
    """The embedder to embed with now, for a vector that is compared with the stored ones or stored beside them:
    the configured one, or, while the stored vectors are of another model (a re-embedding toward the configured
    model is under way: eros.dreaming.reembedding), a client of that model, so that recall keeps working and never
    compares two models. ``EmbedderMismatch`` when no client of the stored model can be made (another provider)."""
    from . import providers

    configured = providers.embedder()
    recorded = mismatch(configured.model)
    if recorded is None:
        stored = _state(configured.model)["space"]  # what mismatch read: no round trip more
        if stored and stored.get("next_model") and stored["model"] == configured.model:
            stop_reembedding(configured.model)  # the configuration is back to the stored vectors' model
        return configured
    if recorded.get("next_model") != configured.model:
        start_reembedding(configured.model)  # the first container that embeds with the new configuration starts it
    previous = providers.embedder_of(recorded["model"])
    if previous is None:
        raise EmbedderMismatch(recorded["model"], configured.model)
    return previous


def start_reembedding(model: str) -> int | None:
    """Start re-embedding every stored row with ``model`` (eros.dreaming.reembedding does it, user by user): the
    users queued, or None when it was started already (by another container) or ``model`` is the stored one."""
    from .store import reembedding as reembedding_store

    users = reembedding_store.begin(model, EMBED_DIM)
    reset()
    if users is not None:
        logger.warning("re-embedding started: the configured embedder is not the stored vectors' model",
                       extra={"to": model, "users": users})
    return users


def stop_reembedding(model: str) -> None:
    """Stop a re-embedding toward a model no longer configured (the configuration is back to ``model``, the stored
    vectors')."""
    from .store import reembedding as reembedding_store

    if reembedding_store.cancel(model):
        logger.warning("re-embedding stopped: the configured embedder is the stored vectors' model again",
                       extra={"model": model})
    reset()


def target_embedder(model: str) -> Any:
    """The configured embedder, if it is of ``model`` (a re-embedding's target); None if the configuration changed."""
    from . import providers

    configured = providers.embedder()
    return configured if configured.model == model else None


def space() -> dict[str, Any] | None:
    """The model and dimension the deployment's stored vectors came from (None before the first is written)."""
    return _state(None)["space"]


def mismatch(model: str) -> dict[str, Any] | None:
    """The recorded embedding space, if vectors of another model than ``model`` are stored (once none of the
    recorded model is left, the next vector written is recorded instead: nothing to mix with)."""
    from .store import embedding as embedding_store

    recorded = _state(model)["space"]
    if not recorded or recorded["model"] == model:
        return None
    key = f"held:{recorded['model']}"
    now = time.monotonic()
    with _lock:
        kept = _kept.get(key)
        if kept and now - kept.at < TTL_SECS:
            return recorded if kept.state["held"] else None
    held = embedding_store.holds(recorded["model"])
    with _lock:
        _kept[key] = _Kept(now, {"held": held})
    return recorded if held else None


def guard(model: str) -> None:
    """Raise ``EmbedderMismatch`` if the stored vectors came from another model than ``model`` (the configured
    embedder's, about to embed something that is compared with them or stored beside them)."""
    recorded = mismatch(model)
    if recorded:
        raise EmbedderMismatch(recorded["model"], model)


def effective(cfg: Settings | None = None, *, knobs: RecallKnobs | None = None, model: str | None = None) -> Effective:
    """The thresholds and weights for the stored vectors' model (``model``: for these, whatever is stored), over
    ``knobs`` (default: the settings' ``recall``): a knob the environment (or the caller) set explicitly is kept."""
    cfg = cfg or settings()
    knobs = knobs or cfg.recall
    state = _state(model)  # model None: the stored vectors' (no embedder needed, as in the deep pass)
    if model:
        target = model
    elif state["space"]:
        target = state["space"]["model"]
    else:  # nothing stored yet: the configured embedder's, whose vectors will be
        target = configured_model()
        state = _state(target)
    base, chosen, stored, refused = _base(target, state["calibration"])
    explicit = {name for name in RECALL_KNOBS if FIELDS[name] in knobs.model_fields_set}
    if "deep_pass_similarity" in cfg.model_fields_set:
        explicit.add("deep_pass_similarity")
    values = {name: (getattr(knobs, FIELDS[name]) if name in RECALL_KNOBS else cfg.deep_pass_similarity)
                    if name in explicit else getattr(chosen, name) for name in KNOBS}
    sources: dict[str, Source] = {name: "env" if name in explicit else base for name in KNOBS}
    # Validated by Thresholds already (a caller's explicit knobs, as a bench sweep's, are kept as given).
    recall = knobs if all(values[n] == getattr(knobs, FIELDS[n]) for n in RECALL_KNOBS) else \
        knobs.model_copy(update={FIELDS[n]: values[n] for n in RECALL_KNOBS})
    return Effective(target, base, values, sources, recall, values["deep_pass_similarity"], space=state["space"],
                     stored=stored, refused=refused, sample=chosen.sample)


def _base(model: str, row: dict[str, Any] | None) -> tuple[Source, calibration.Calibration, dict | None, str | None]:
    """The calibration under the environment: the stored one (if it validates), the shipped one, or the defaults."""
    refused = None
    if row is not None:
        try:
            ratio = float(row["lexical_weight"]) / calibration.REFERENCE.lexical_weight
            full = {**row, **{n: getattr(calibration.REFERENCE, n) * ratio for n in SCALED if row.get(n) is None}}
            validated(full)  # a row stored before migration 0034: its three weights scaled as its lexical one
            return "calibrated", calibration.Calibration(
                model, **{n: float(full[n]) for n in KNOBS}, source="calibrated", sample=int(row["sample"])), row, None
        except (ValueError, KeyError, TypeError) as exc:
            refused = f"the calibration stored for {model!r} (id {row.get('id')}) is not used: {exc}"
            logger.error("a stored calibration is refused", extra={"model": model, "error": refused})
    if model in calibration.SHIPPED:
        return "shipped", calibration.SHIPPED[model], None, refused
    return "default", calibration.REFERENCE, None, refused


# --- `eros calibrate` -----------------------------------------------------------------------------------------

SAMPLE_LIMIT = 3000  # the most memories whose nearest neighbour `eros calibrate` reads


class TooFew(ValueError):
    """Not enough memories with a neighbour of their user and category to say anything about the model's scale."""


@dataclass
class Calibrated:
    """What ``calibrate`` chose for a model, beside what the engine used before."""

    calibration: calibration.Calibration
    before: Effective
    pairs: int
    stored: dict[str, Any] | None = None  # the stored row (None: a dry run)
    notes: list[str] = field(default_factory=list)


def calibrate(*, dry_run: bool = False, limit: int = SAMPLE_LIMIT, model: str | None = None) -> Calibrated:
    """Derive the thresholds for the stored vectors' model from the deployment's own active profile memories
    (eros.calibration.calibrate: their nearest-neighbour cosines, label-free), validate them and, unless
    ``dry_run``, store them. ``TooFew`` when the memories are too few; ``ValueError`` when the values would be
    nonsense (nothing stored then either)."""
    from .store import embedding as embedding_store

    configured = configured_model()
    recorded = _state(None)["space"]
    target = model or (recorded["model"] if recorded else configured)
    before = effective(model=target)
    cosines = embedding_store.neighbour_cosines(target, limit)
    if len(cosines) < calibration.MIN_SAMPLE:
        raise TooFew(f"calibrating {target!r} needs at least {calibration.MIN_SAMPLE} active profile memories that"
                     f" have a neighbour of the same user and category; this deployment has {len(cosines)}")
    chosen = calibration.calibrate(target, cosines)
    validated(chosen)  # ValueError: nothing is stored
    notes = []
    if recorded and configured != recorded["model"]:
        notes.append(f"the configured embedder is {configured!r}, not the stored vectors' model: calibrated"
                     f" {target!r}, the model of the vectors compared")
    dimension = int(recorded["dimension"]) if recorded else EMBED_DIM
    stored = None if dry_run else embedding_store.save_calibration(chosen, dimension)
    reset()
    return Calibrated(chosen, before, len(cosines), stored, notes)
