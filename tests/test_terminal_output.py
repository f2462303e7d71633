"""What a person sees at a terminal (issue 29): LOG_FORMAT=text, a terminal's default, is one readable line per
log record and no CloudWatch metric blob; Lambda keeps Powertools' JSON; `eros doctor --json` is JSON alone on
stdout; `make run` starts with a short banner, not a log line per migration; the access log has the time."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest
from apiclient import Api
from helpers import ROOT, go_idle

from eros.config import Settings, SettingsError

TIME = r"\d\d:\d\d:\d\d"


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """The service's log records at INFO, through its own formatter, into a buffer."""
    from eros.observability import SERVICE, logger

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logger.registered_formatter)
    level = logger.log_level
    logger.clear_state()  # keys an earlier test's invocation left on this thread (user_id) are not this test's
    logging.getLogger(SERVICE).addHandler(handler)  # the standard logger Powertools' wraps
    logger.setLevel("INFO")
    yield stream
    logging.getLogger(SERVICE).removeHandler(handler)
    logger.setLevel(level)


# --- the setting -----------------------------------------------------------------------------------------------------

def test_log_format_is_json_in_lambda_and_text_elsewhere_unless_set():
    assert Settings.from_env({}).log_format == "text"
    assert Settings.from_env({"AWS_LAMBDA_FUNCTION_NAME": "eros-chat"}).log_format == "json"
    assert Settings.from_env({"AWS_LAMBDA_FUNCTION_NAME": "eros-chat", "LOG_FORMAT": "Text"}).log_format == "text"
    assert Settings.from_env({"LOG_FORMAT": "json"}).log_format == "json"
    with pytest.raises(SettingsError, match=r"^LOG_FORMAT='xml': Input should be 'json' or 'text'$"):
        Settings.from_env({"LOG_FORMAT": "xml"})


# --- the two forms ---------------------------------------------------------------------------------------------------

def test_text_logs_are_one_readable_line_per_record(env, log_lines):
    from eros.observability import logger

    env(LOG_FORMAT="text", EROS_DEBUG=None)
    logger.append_keys(session_id="s-1", function_arn="arn:aws:lambda:local:0:function:extract")
    try:
        logger.warning("provider refused", extra={"fault": "config\nwith a second line", "attempts": 0,
                                                  "detail": {"status": 401}, "long": "x" * 300})
        try:
            raise RuntimeError("the disk is full")
        except RuntimeError:
            logger.exception("sweep failed")
    finally:
        logger.remove_keys(["session_id", "function_arn"])
    first, second = log_lines.getvalue().splitlines()
    assert re.fullmatch(rf"{TIME} WARNING provider refused  session=s-1 fault=config with a second line"
                        rf' detail={{"status":401}} long=x{{119}}…', first), first
    assert "arn:" not in first and "attempts" not in first  # the invocation's context and empty values: not shown
    assert re.fullmatch(rf"{TIME} ERROR   sweep failed  session=s-1  ! RuntimeError: the disk is full", second), second


def test_json_logs_stay_powertools_json(env, log_lines):
    from eros.observability import logger

    env(LOG_FORMAT="json")
    logger.warning("provider refused", extra={"fault": "config"})
    [line] = log_lines.getvalue().splitlines()
    record = json.loads(line)
    assert (record["level"], record["message"], record["fault"], record["service"]) == (
        "WARNING", "provider refused", "config", "eros")
    assert {"location", "timestamp"} <= set(record)


def test_metric_blobs_are_for_cloudwatch_only(env, capsys):
    from aws_lambda_powertools.metrics import MetricUnit

    from eros.observability import metrics

    @metrics.log_metrics
    def handler(event, context):
        if event:
            metrics.add_metric(name="Turns", unit=MetricUnit.Count, value=1)
        return "done"

    env(LOG_FORMAT="text")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        assert handler({"turn": 1}, None) == handler({}, None) == "done"
    assert capsys.readouterr().out == "" and not warned  # no blob, and no "No application metrics" warning

    env(LOG_FORMAT="json")
    assert handler({"turn": 1}, None) == "done"
    [blob] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert blob["Turns"] == [1.0]  # only this invocation's: the text-mode one was not kept for later


# --- the commands, as a person runs them -----------------------------------------------------------------------------

def terminal_env(database_url: str) -> dict[str, str]:
    """A shell's environment: no LOG_FORMAT (the terminal's default), Powertools at its default level."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOG_FORMAT", "POWERTOOLS_LOG_LEVEL")}
    return env | {"DATABASE_URL": database_url}


def eros(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eros_dev.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.e2e
def test_doctor_json_is_json_alone_on_stdout(db, database_url):
    """Issue 29: `eros doctor --json` printed the offline providers' warnings (JSON log lines) on stdout."""
    done = eros("doctor", "--json", env=terminal_env(database_url))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "ok" and set(report["checks"]) >= {"database", "schema", "chat", "embedder"}
    assert re.search(rf"^{TIME} WARNING no LLM key or base URL configured", done.stderr, re.M), done.stderr


@pytest.mark.e2e
def test_a_sweep_at_a_terminal_says_what_it_did_without_json_or_metric_blobs(db, database_url):
    api = Api()
    sid = api.session()
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "I grow tomatoes on my balcony"})[0] == 200
    go_idle(db)
    done = eros("sweep", env=terminal_env(database_url))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith(f"  session {sid} of alice: extracted")
    assert not [line for line in (done.stdout + done.stderr).splitlines() if line.lstrip().startswith("{")], done
    assert "sweep done" not in done.stderr  # the answer says it: the INFO lines are EROS_DEBUG=1's

    api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "and basil"})
    go_idle(db)
    done = eros("sweep", env=terminal_env(database_url) | {"EROS_DEBUG": "1"})
    assert re.search(rf"^{TIME} INFO    sweep done  claimed=1", done.stderr, re.M), done.stderr


def test_the_access_log_has_the_time(local_server, capsys):
    assert local_server.client("alice").get("/v1/personas").status_code == 200
    assert re.search(rf"^{TIME} GET /v1/personas -> 200$", capsys.readouterr().err, re.M)
