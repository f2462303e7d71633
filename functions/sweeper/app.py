"""Sweeper (EventBridge schedule -> this Lambda): claim idle sessions, fan out one extract invocation each."""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import lru_cache

from eros import dreaming, tracing
from eros.config import settings
from eros.observability import logger, metrics, time_left, trace_aws_calls


class LambdaInvoker:
    """The fan-out in AWS: one asynchronous invocation of the extract function per job (Lambda delivers
    it at least once; the claim token makes a second delivery harmless)."""

    def __init__(self, function_name: str, client=None):
        import boto3  # the runtime's, imported on the first sweep rather than at cold start

        trace_aws_calls()
        self.function_name = function_name
        self.client = client or boto3.client("lambda")

    def __call__(self, payload: dict) -> None:
        response = self.client.invoke(FunctionName=self.function_name, InvocationType="Event",
                                      Payload=json.dumps(payload).encode())
        if response.get("StatusCode") != 202:
            raise RuntimeError(f"async invoke answered {response.get('StatusCode')}")


@lru_cache(maxsize=1)
def invoker() -> dreaming.Invoker:
    """One boto3 client per container. The local stack replaces this function (eros_dev.dreaming.sweeper)."""
    name = settings().extract_function_name
    if not name:
        raise RuntimeError("EXTRACT_FUNCTION_NAME is not set")
    return LambdaInvoker(name)


@logger.inject_lambda_context
@tracing.lambda_handler(tracing.sweeper_annotations)  # no response or error in traces
@metrics.log_metrics
def lambda_handler(event: dict, context) -> dict:
    return asdict(dreaming.sweep(settings(), invoker(), time_budget_secs=time_left(context, reserve_secs=10)))
