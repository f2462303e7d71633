"""Dreaming locally: the EventBridge schedule (``run_local_sweeper``), the sweeper function, and its fan-out
(``InProcessInvoker``): every job an asynchronous invocation of the extract function in a local container.
``sweep_locally`` is one sweep now (``eros sweep``, the console's "sweep now")."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future
from types import ModuleType

from eros.config import Settings, settings

from .lambda_runtime import Function


def scheduled_event() -> dict:
    """What the schedule sends the sweeper (it reads nothing from it)."""
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event", "source": "aws.scheduler",
            "account": "000000000000", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "region": "local", "resources": [], "detail": {}}


class InProcessInvoker:
    """The sweeper's fan-out locally: every job is an asynchronous invocation of the extract function in
    a container of its own, ``workers`` at once (Lambda's concurrency). A failed invocation is logged:
    Lambda would retry it; locally the claim goes stale and a later sweep takes the session again."""

    def __init__(self, workers: int = 4, *, keep_outcomes: bool = False):
        self.extract = Function("extract", concurrency=workers, timeout_secs=120)  # template.yaml: Timeout 120
        self._jobs: list[tuple[dict, Future]] | None = [] if keep_outcomes else None

    def __call__(self, payload: dict) -> None:
        done = self.extract.submit(dict(payload))
        done.add_done_callback(self._report)
        if self._jobs is not None:
            self._jobs.append((payload, done))

    def outcomes(self) -> list[dict]:
        """What each job did (``keep_outcomes``; after ``wait``): the extract function's answer, or the
        exception it raised as ``outcome: crashed``."""
        outcomes = []
        for payload, done in self._jobs or []:
            job = {"kind": payload.get("kind", "session"), "user_id": payload.get("user_id"),
                   "session_id": payload.get("session_id")}
            error = done.exception()
            outcomes.append(job | ({"outcome": "crashed", "error": repr(error)[:300]} if error else done.result()))
        return outcomes

    @staticmethod
    def _report(done: Future) -> None:
        from eros.observability import logger

        if not done.cancelled() and done.exception() is not None:
            logger.warning("local extract failed", extra={"error": repr(done.exception())[:300]})

    def wait(self) -> None:
        self.extract.close(wait=True)


def sweeper(invoker: InProcessInvoker, cfg: Settings | None = None) -> Function:
    """The sweeper function in a container whose fan-out is ``invoker`` instead of the Lambda client (and,
    with ``cfg``, whose settings are those)."""
    def prepare(module: ModuleType) -> None:
        module.invoker = lambda: invoker  # type: ignore[attr-defined]
        if cfg is not None:
            module.settings = lambda: cfg  # type: ignore[attr-defined]

    return Function("sweeper", concurrency=1, timeout_secs=240, prepare=prepare)  # template.yaml: Timeout 240


def sweep_locally(workers: int = 4, *, idle_now: bool = False, event: dict | None = None) -> dict:
    """`eros sweep` and the console's "sweep now": one invocation of the sweeper function now (on ``event``,
    default a scheduled one), waiting for the jobs it started; its answer with ``jobs``, what each did.
    ``idle_now``: every session with new messages counts as idle (DREAMING_IDLE_SECS 0 for this sweep),
    everyone's, not only the caller's."""
    invoker = InProcessInvoker(workers, keep_outcomes=True)
    function = sweeper(invoker, settings().model_copy(update={"dreaming_idle_secs": 0}) if idle_now else None)
    try:
        result = function.invoke(event or scheduled_event())
    finally:
        function.close()
        invoker.wait()
    # The memory events its jobs wrote, now (in AWS the next sweep publishes them: eros.events), so that a person
    # who pressed "sweep now" sees them at once.
    from eros import events, webhooks

    published = result.get("events_published", 0) + events.publish_pending(settings())
    delivered = result.get("webhooks_delivered", 0) + webhooks.deliver(settings())
    return result | {"jobs": invoker.outcomes(), "events_published": published, "webhooks_delivered": delivered}


def run_local_sweeper(cfg: Settings, workers: int = 4) -> threading.Thread:
    """The local EventBridge schedule: the sweeper function every DREAMING_TICK_SECS, from a daemon thread."""
    from eros.observability import logger

    invoker = InProcessInvoker(workers)
    function = sweeper(invoker)

    def loop():
        while True:
            time.sleep(cfg.dreaming_tick_secs)
            try:
                result = function.invoke(scheduled_event())
            except Exception as exc:
                logger.exception("local sweep failed", extra={"error": repr(exc)[:300]})
                continue
            if result.get("claimed"):
                print(f"[dreaming] claimed {result['claimed']} idle session(s), extracting", flush=True)
            if result.get("users_claimed"):
                print(f"[dreaming] claimed {result['users_claimed']} user(s) for a deep pass", flush=True)

    thread = threading.Thread(target=loop, name="schedule", daemon=True)
    thread.start()
    return thread
