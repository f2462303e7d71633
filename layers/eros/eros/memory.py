"""The memory domain's vocabulary: the two memory layers, the profile categories, where a memory came from
and why one stopped being current. Routes, stores, recall and the prompt all speak these names."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal


class MemoryLayer(StrEnum):
    """Which of the two memory layers a memory is in (not to be confused with the Lambda layer)."""

    PROFILE = "profile"  # who the user is: distilled facts, the user's across every persona
    RELATIONSHIP = "relationship"  # what the user said to one persona instance: raw utterances


# The profile layer's categories, in the order the prompt shows them.
CATEGORIES = ("fact", "preference", "event", "emotion", "relation")
Category = Literal["fact", "preference", "event", "emotion", "relation"]

# What wrote a memory: a chat utterance, session-end extraction (dreaming), the per-user deep pass, the user.
Source = Literal["utterance", "dreaming", "deep_pass", "user"]

# Why a memory stopped being current (migration 0004; docs/CONSOLIDATION.md).
SupersededReason = Literal["changed", "duplicate", "reverted", "edited", "outdated"]


_SAID = re.compile(r"^the user said:\s*", re.I)
_KEY_DROP = re.compile(r"[^\w\s]")


def statement_key(text: str) -> str:
    """Two memories with the same key say the same thing (case, punctuation, the offline prefix folded)."""
    return " ".join(_KEY_DROP.sub(" ", _SAID.sub("", text.strip()).casefold()).split())
