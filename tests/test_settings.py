"""Settings read from the environment (issue 29): a bad value stops a command, or answers a request, with the
variable's name; the extraction model follows the chat model unless it is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eros.config import Settings, SettingsError
from eros_dev.lambda_runtime import LambdaContext, load_function

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env,says", [
    ({"DREAMING_IDLE_SECS": "abc"}, "DREAMING_IDLE_SECS='abc': Input should be a valid integer"),
    ({"PORT": "99999"}, "PORT='99999': Input should be less than or equal to 65535"),
    ({"RECALL_TOP_K": "0"}, "RECALL_TOP_K='0': Input should be greater than or equal to 1"),  # a nested knob
    ({"MODEL_PRICES": "{x"}, "MODEL_PRICES='{x': MODEL_PRICES is not JSON"),
    ({"RECALL_UTTERANCE_WINDOW": "3"}, "RECALL_UTTERANCE_WINDOW must be 0 (no bound) or at least 50, not 3"),
])
def test_a_bad_setting_is_named_as_the_environment_names_it(env, says):
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    assert str(caught.value).startswith(says) and "\n" not in str(caught.value)


def test_every_bad_setting_is_named_at_once_and_a_secrets_value_never():
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"DREAMING_TICK_SECS": "-1", "EROS_DEBUG": "maybe"}, local_jwt_secret=12345678)
    assert caught.value.variables == ["DREAMING_TICK_SECS", "LOCAL_JWT_SECRET", "EROS_DEBUG"]
    assert "LOCAL_JWT_SECRET: Input should be a valid string" in str(caught.value)
    assert "12345678" not in str(caught.value)


def test_the_extraction_model_follows_the_chat_model_unless_set():
    assert Settings.from_env({}).extract_model == Settings.from_env({}).chat_model == "anthropic/claude-haiku-4.5"
    assert Settings.from_env({"CHAT_MODEL": "llama3.1"}).extract_model == "llama3.1"
    assert Settings.from_env({"CHAT_MODEL": "llama3.1", "EXTRACT_MODEL": ""}).extract_model == "llama3.1"
    assert Settings.from_env({"CHAT_MODEL": "llama3.1", "EXTRACT_MODEL": "qwen2.5"}).extract_model == "qwen2.5"
    assert Settings(chat_model="a").extract_model == "a"  # built in code, as in the tests and benches


@pytest.mark.e2e
@pytest.mark.parametrize("debug", ["", "1"])
def test_a_command_with_a_bad_setting_says_which_in_one_line(tmp_path, debug):
    """`DREAMING_IDLE_SECS=abc make run` printed pydantic's ValidationError without the variable's name, even with
    EROS_DEBUG=1 (which itself could not be read)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PORT")}
    env |= {"DREAMING_IDLE_SECS": "abc", "EROS_DATA_DIR": str(tmp_path), "EROS_DEBUG": debug}
    done = subprocess.run([sys.executable, "-m", "eros_dev.cli", "serve"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "eros serve: bad setting: DREAMING_IDLE_SECS='abc': Input should be a valid integer, unable to parse string"
        " as an integer"]
    assert not (tmp_path / "pg").exists()  # stopped before it started anything


def test_a_request_to_a_deployment_with_a_bad_setting_is_a_503_that_names_no_setting(env, caplog):
    env(DREAMING_IDLE_SECS="abc")
    event = json.loads((ROOT / "events" / "chat_health.json").read_text())
    answer = load_function("chat", copy="bad-setting").lambda_handler(event, LambdaContext("chat"))
    body = json.loads(answer["body"])
    assert answer["statusCode"] == 503 and body["code"] == "service_misconfigured"
    assert "DREAMING_IDLE_SECS" not in answer["body"]
    assert any("DREAMING_IDLE_SECS='abc'" in str(r.__dict__.get("error")) for r in caplog.records)
