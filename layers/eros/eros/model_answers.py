"""Reading what a model answers: JSON found wherever it is in the text, and the local handles
(m1, m2, ...) that stand for stored memories in a prompt. Shared by extraction and the deep pass,
which both ask for JSON and both show memories under handles instead of database ids."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

_HANDLE = re.compile(r"^m([1-9][0-9]{0,2})$")
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)
_MAX_DECODE_STARTS = 64  # never try to decode from thousands of brackets in a garbage answer


def json_values(text: str) -> Iterator[Any]:
    """JSON values found in the text, most likely first: the whole text, fenced blocks, then objects
    and arrays that start anywhere within prose."""
    try:
        yield json.loads(text)
    except ValueError:
        pass
    for block in _FENCE.findall(text):
        try:
            yield json.loads(block)
        except ValueError:
            pass
    decoder = json.JSONDecoder()
    for start in [m.start() for m in re.finditer(r"[\[{]", text)][:_MAX_DECODE_STARTS]:
        try:
            yield decoder.raw_decode(text, start)[0]
        except ValueError:
            continue


def handle(value: Any) -> str | None:
    """A local handle as the prompt wrote it ("m7"), case and spaces forgiven; None for anything else."""
    if not isinstance(value, str):
        return None
    value = value.strip().lower()
    return value if _HANDLE.match(value) else None
