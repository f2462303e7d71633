"""Sweeper (EventBridge schedule -> this Lambda): claim idle sessions, fan out one extract invocation each."""

from __future__ import annotations

from dataclasses import asdict

from eros import dreaming
from eros.config import settings
from eros.observability import logger, metrics
from eros import tracing

_invoker: dreaming.LambdaInvoker | None = None  # one boto3 client per container


def invoker() -> dreaming.LambdaInvoker:
    global _invoker
    if _invoker is None:
        name = settings().extract_function_name
        if not name:
            raise RuntimeError("EXTRACT_FUNCTION_NAME is not set")
        _invoker = dreaming.LambdaInvoker(name)
    return _invoker


@logger.inject_lambda_context
@tracing.lambda_handler(tracing.sweeper_annotations)  # no response or error in traces
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    budget = max(1.0, context.get_remaining_time_in_millis() / 1000 - 10)  # leave time to report
    return asdict(dreaming.sweep(settings(), invoker(), time_budget_secs=budget))
