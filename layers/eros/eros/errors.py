"""Domain errors that more than one use-case raises. The chat function maps each to its HTTP answer;
nothing below the handler chooses a status code."""

from __future__ import annotations


class NotFound(LookupError):
    """No such thing of this user (a session, a memory, a persona). Another user's id is "not found"
    too, never a different answer: ids do not leak across users."""
