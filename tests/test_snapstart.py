"""SnapStart hooks (eros.snapstart): the snapshot gets the first request's imports and nothing of one
container's own; every restored copy gets its own connection, clients, TLS context and random state."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import snapshot_restore_py

from eros import db, providers, snapstart
from eros.providers.base import tls_context
from eros_dev.lambda_runtime import load_function

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def registries(monkeypatch):
    monkeypatch.setattr(snapshot_restore_py, "_before_snapshot_registry", [])
    monkeypatch.setattr(snapshot_restore_py, "_after_restore_registry", [])
    return snapshot_restore_py


def test_the_chat_handler_registers_warm_before_and_renew_after(registries, database_url):
    load_function("chat", copy="snapstart-registration")
    assert (snapstart.warm, (), {}) in registries.get_before_snapshot()
    assert (snapstart.renew, (), {}) in registries.get_after_restore()


_WARM = """
import json, sys
from eros import db, snapstart
snapstart.warm()
from aws_xray_sdk.core import patcher
print(json.dumps({"modules": sorted(m for m in ("boto3", "botocore", "aws_lambda_powertools.utilities.parameters")
                                    if m in sys.modules),
                  "patched": sorted(patcher._PATCHED_MODULES), "connection": getattr(db._local, "conn", None)}))
"""


def test_warm_imports_the_secrets_path_traced_and_opens_nothing(tmp_path):
    """In a fresh process laid out like Lambda, tracing on, with secret ARNs that no AWS endpoint will answer
    here: warming must not try them (it would fail), nor connect anywhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POWERTOOLS_TRACE", "DATABASE_URL"))} | {
        "PYTHONPATH": str(ROOT / "layers" / "eros"), "AWS_LAMBDA_FUNCTION_NAME": "eros-chat",
        "LAMBDA_TASK_ROOT": str(tmp_path), "AWS_XRAY_CONTEXT_MISSING": "IGNORE_ERROR",
        "DATABASE_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:db-AbCdEf",
        "PROVIDER_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:keys-AbCdEf"}
    done = subprocess.run([sys.executable, "-c", _WARM], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["modules"] == ["aws_lambda_powertools.utilities.parameters", "boto3", "botocore"]
    assert "botocore" in seen["patched"] and "httpx" in seen["patched"]
    assert seen["connection"] is None


def test_renew_gives_a_restored_copy_its_own_connection_clients_tls_and_randomness(database_url):
    before = db.connection()
    client, context = providers.chat_client(), tls_context()
    state = random.getstate()
    snapstart.renew()
    first = random.random()
    assert before.closed and db.connection() is not before
    assert providers.chat_client() is not client and tls_context() is not context
    random.setstate(state)  # a second copy of the same snapshot
    snapstart.renew()
    assert random.random() != first, "two restored copies drew the same random numbers"


def test_registering_outside_the_runtime_does_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # not importable, as off Lambda
    assert snapstart.register() is False
