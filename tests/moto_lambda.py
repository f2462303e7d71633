"""Pytest plugin: the sweeper's fan-out against moto's Lambda (no Docker), recorded.

``sweeper`` is a fresh sweeper container (no cached Lambda client, a clean metrics buffer, an extract
function name and limits far above what the tests claim); ``aws`` adds moto's Lambda with a real extract
function to invoke and yields an ``Invocations``: what the sweeper sent and what moto received, recorded
with botocore event hooks on the boto3 session the handler's client comes from. boto3 and moto are
imported when a test asks for them, so the tiers that do not need them do not pay for the import.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import pytest

from eros_dev.lambda_runtime import load_function

FUNCTION = "eros-extract"


class Invocations:
    """Every lambda:Invoke the process makes: what was sent and what moto's Lambda received (its simple
    backend echoes the payload)."""

    def __init__(self, session: Any):
        self.calls: list[dict[str, Any]] = []
        self.fail: Any = None  # predicate(payload) -> True: raise a throttling error instead of invoking
        session.events.register("before-call.lambda.Invoke", self._before)
        session.events.register("after-call.lambda.Invoke", self._after)

    def _before(self, params: dict[str, Any], **_: Any) -> None:
        from botocore.exceptions import ClientError

        payload = json.loads(params["body"])
        if self.fail is not None and self.fail(payload):
            raise ClientError({"Error": {"Code": "TooManyRequestsException", "Message": "Rate exceeded"}},
                              "Invoke")
        self.calls.append({"function": params["url_path"].split("/")[-2],
                           "type": params["headers"].get("X-Amz-Invocation-Type"), "sent": payload})

    def _after(self, http_response: Any, parsed: dict[str, Any], **_: Any) -> None:
        from botocore.response import StreamingBody

        echoed = parsed["Payload"].read()
        parsed["Payload"] = StreamingBody(io.BytesIO(echoed), len(echoed))  # leave it readable
        self.calls[-1].update(status=http_response.status_code, received=json.loads(echoed))

    @property
    def received(self) -> list[dict[str, Any]]:
        return [c["received"] for c in self.calls]


@pytest.fixture
def sweeper(db, env):
    """A fresh sweeper container (no cached Lambda client) and a clean metrics buffer."""
    from eros.observability import metrics

    module = load_function("sweeper")
    module.invoker.cache_clear()
    metrics.clear_metrics()
    # An extract concurrency far above what these tests claim, so only the tick cap and batches bound them
    # (test_sweeper_fanout's test of the concurrency bound sets its own).
    env(EXTRACT_FUNCTION_NAME=FUNCTION, DREAMING_BATCH_SIZE=200, DREAMING_TICK_CAP=5000,
        DREAMING_EXTRACT_CONCURRENCY=1000)
    yield module
    metrics.clear_metrics()


@pytest.fixture
def aws(sweeper):
    """moto's Lambda without Docker, with a real extract function (zip, IAM role) to invoke."""
    import boto3
    from moto import mock_aws

    with mock_aws(config={"lambda": {"use_docker": False}}):
        role = boto3.client("iam").create_role(
            RoleName="eros-extract-role", AssumeRolePolicyDocument=json.dumps({
                "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                        "Principal": {"Service": "lambda.amazonaws.com"}}]}),
        )["Role"]["Arn"]
        code = io.BytesIO()
        with zipfile.ZipFile(code, "w") as archive:
            archive.writestr("app.py", "def lambda_handler(event, context):\n    return {'ok': True}\n")
        boto3.client("lambda").create_function(FunctionName=FUNCTION, Runtime="python3.12", Role=role,
                                               Handler="app.lambda_handler", Code={"ZipFile": code.getvalue()})
        boto3.setup_default_session()  # the session the handler's boto3.client("lambda") comes from
        yield Invocations(boto3.DEFAULT_SESSION)
