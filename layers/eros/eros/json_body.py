"""Whether a request's JSON body can be read at all: the chat function's pre-routing guard and the local
stack's own routes (``/local/token``, ``/local/sweep``) refuse, with the same 400 message, what Python's
parser cannot read without failing the request (nesting that exhausts its recursion, a number with more
digits than it converts) and what is not JSON. Request bodies are flat objects; deeper JSON is refused before
it is parsed (the parser recurses once per level). And whether a text read from one can be stored
(``unstorable``, ``storable``): what every request model and the history import check their text with."""

from __future__ import annotations

import json
import re

MAX_DEPTH = 32
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string, escapes included


def nested_deeper_than(text: str, limit: int) -> bool:
    """Whether the JSON text opens more than ``limit`` arrays/objects inside each other (strings skipped)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for char in _STRINGS.sub('""', text):  # brackets inside strings do not nest
        if char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def unreadable(body: str | bytes) -> str | None:
    """Why the body cannot be read as JSON (the message of a 400), or None when ``json.loads`` reads it."""
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            return "the body is not UTF-8 JSON"
    if nested_deeper_than(body, MAX_DEPTH):
        return f"the JSON body is nested deeper than {MAX_DEPTH} levels"
    try:
        json.loads(body)
    except json.JSONDecodeError as exc:
        return f"the body is not valid JSON: {exc.msg} (character {exc.pos})"
    except (ValueError, RecursionError):
        return "the body is not JSON this API can read (a number with too many digits)"
    return None


def unstorable(text: str) -> str | None:
    """Why Postgres cannot store this text (a NUL character, a lone surrogate), or None if it can."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (\\ud800-\\udfff): not valid Unicode text"
    return None


def storable(value):
    """A pydantic validator: refuses text Postgres cannot store, before pydantic's own string check (whose message
    names neither); anything else passes to the type check."""
    problem = unstorable(value) if isinstance(value, str) else None
    if problem:
        raise ValueError(f"must be text that can be stored: it {problem}")
    return value
