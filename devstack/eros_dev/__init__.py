"""The Docker-free local stack (``eros serve``, ``make run``), the ``eros`` command and what the tests and the
benches run the functions with. Installed in the development virtualenv only: it is a package of its own, beside
``eros`` and not inside it, so the Lambda layer (``layers/eros/Makefile`` ships the ``eros`` package) cannot carry
it, and a module of the layer that imported it would fail at import (``tests/test_packaging.py`` checks).

* ``stack``: the embedded Postgres, and ``eros serve``'s pid file for ``eros stop``;
* ``tokens``: local JWTs, as the HTTP API's authorizer verifies them;
* ``lambda_runtime``: Lambda's side: a function's containers, its context, its module loaded as Lambda loads it;
* ``server``: API Gateway's side: the local HTTP API in front of the chat function, with the console;
* ``dreaming``: the schedule, the sweeper and its fan-out to extract containers;
* ``cli``: the ``eros`` command.
"""

from pathlib import Path

from eros.config import settings

ROOT = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """Where the local stack keeps its state: EROS_DATA_DIR, else .data/ in the checkout (never committed)."""
    folder = settings().eros_data_dir
    return Path(folder) if folder else ROOT / ".data"


def events_log() -> Path:
    """Where the local stack's sweeps publish memory events (eros.events, EVENTS_LOG), for `eros events` to read:
    EVENTS_LOG if set, else events.jsonl in the data folder. Sets EVENTS_LOG to it for this process's sweeps."""
    import os

    path = Path(os.environ.setdefault("EVENTS_LOG", str(data_dir() / "events.jsonl")))
    settings.cache_clear()
    return path


def logged_events(path: Path, offset: int = 0, seen: set[str] | None = None) -> tuple[list[dict], int]:
    """The events the log at ``path`` holds past ``offset`` (whole lines only: a line being written waits), each
    id once (a killed sweep's batch is logged twice): those not in ``seen``, which is updated; and the offset
    after them, to read on from (`eros events --follow`)."""
    import json

    seen = set() if seen is None else seen
    found: list[dict] = []
    if not path.exists():
        return found, offset
    with path.open(encoding="utf-8") as log:
        log.seek(offset)
        while (line := log.readline()).endswith("\n"):
            offset = log.tell()
            event = json.loads(line) if line.strip() else None
            if event and event["id"] not in seen:
                seen.add(event["id"])
                found.append(event)
    return found, offset
