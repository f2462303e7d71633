"""Where the time of a chat turn goes: timers around the functions ``eros.chat.take_turn`` reaches, and a
recorder of the SQL statements a turn sends (bench/turn_overhead.py uses both; both undo themselves)."""

from __future__ import annotations

import contextlib
import functools
import time
import types
from collections.abc import Iterator
from typing import Any


class Stages:
    """Times the functions take_turn reaches: the public functions of the eros modules ``eros.chat``
    imports (store, recall, prompt, ...) and of the eros modules those import, found at run time so that
    a change of take_turn's collaborators needs no change here.

    Every call is timed under its own name (summed per turn); the stage totals count only the outermost
    timed calls, so nothing is counted twice. Stage of an outermost call: open (open_turn: the session, the
    turn id's earlier messages, the spend limits, the user's message stored before the model, the history;
    claim_turn and find_turn, which only a race between senders of one turn id calls), persist (record_turn),
    prompt (eros.prompt), recall (every other: both memory layers).

    ``with stages.installed():`` wraps the functions for the block and puts the originals back after it."""

    OPEN = {"open_turn", "claim_turn", "find_turn", "get_session"}
    PERSIST = {"record_turn"}
    SKIP = ("eros.config", "eros.observability", "eros.providers", "eros.db", "eros.credentials", "eros.migrate")

    def __init__(self):
        self.current: dict[str, float] = {}
        self.samples: dict[str, list[float]] = {}
        self._depth = 0

    def stage_of(self, module: str, name: str) -> str:
        if name in self.OPEN:
            return "open"
        if name in self.PERSIST:
            return "persist"
        if module == "eros.prompt":
            return "prompt"
        return "recall"

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stages]:
        import eros.chat

        def eros_modules(module) -> list:
            return [m for m in vars(module).values() if isinstance(m, types.ModuleType)
                    and m.__name__.startswith("eros.") and not m.__name__.startswith(self.SKIP)]

        modules: dict[str, types.ModuleType] = {}
        frontier = [eros.chat]
        for _ in range(2):  # what eros.chat uses, and what those use
            frontier = [m for parent in frontier for m in eros_modules(parent) if m.__name__ not in modules]
            modules.update((m.__name__, m) for m in frontier)
        originals = []
        try:
            for module in modules.values():
                for name, fn in list(vars(module).items()):
                    if (not name.startswith("_") and isinstance(fn, types.FunctionType)
                            and fn.__module__ == module.__name__):
                        originals.append((module, name, fn))
                        setattr(module, name, self._wrap(module.__name__, name, fn))
            yield self
        finally:
            for module, name, fn in originals:
                setattr(module, name, fn)

    def _wrap(self, module: str, name: str, fn):
        key = f"{module.removeprefix('eros.')}.{name}"
        stage = f"stage:{self.stage_of(module, name)}"
        stages = self

        def timed(*args, **kwargs):
            outermost = stages._depth == 0
            stages._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                stages._depth -= 1
                current = stages.current
                current[key] = current.get(key, 0.0) + elapsed
                if outermost:
                    current[stage] = current.get(stage, 0.0) + elapsed

        return functools.wraps(fn)(timed)

    def begin(self) -> None:
        self.current = {}

    def keep(self, total: float) -> None:
        self.current["stage:other"] = total - sum(v for k, v in self.current.items() if k.startswith("stage:"))
        for key, value in self.current.items():
            self.samples.setdefault(key, []).append(value)


@contextlib.contextmanager
def capture_statements() -> Iterator[list[tuple[str, object]]]:
    """Record (sql, params) of every statement a cursor executes during the block (Connection.execute
    goes through a cursor too)."""
    import psycopg
    from _common import patched

    seen: list[tuple[str, Any]] = []
    original = psycopg.Cursor.execute

    def execute(self, query, params=None, *args, **kwargs):
        seen.append((query, params))
        return original(self, query, params, *args, **kwargs)

    with patched((psycopg.Cursor, "execute", execute)):
        yield seen
