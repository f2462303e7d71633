"""The one failure policy of every dreaming job (``eros.dreaming.jobs``): whose fault a failure is, decided once,
and what follows it (hold, back off, give up), decided once, for a session and a deep pass alike. The real
lifecycle around it runs in test_fault_injection, test_claims, test_dreaming and test_deep_pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from eros.config import Settings
from eros.dreaming import jobs
from eros.providers import ProviderConfigurationError, ProviderUnavailable
from eros.providers.base import ProviderResponseError
from eros.store.rows import ClaimedJob

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 3, 12, tzinfo=UTC)


def row(attempts: int = 0, retries: int = 0, retrying_since: datetime | None = None) -> ClaimedJob:
    return {"user_id": "alice", "attempts": attempts, "retries": retries, "retrying_since": retrying_since,
            "error": None, "lease": NOW}


@pytest.fixture
def cfg() -> Settings:
    return Settings.from_env().model_copy(update={"dreaming_retry_window_secs": 3600, "dreaming_retry_base_secs": 10,
                                                  "dreaming_retry_max_delay_secs": 1000})


def test_whose_fault():
    assert jobs.classify(ProviderConfigurationError("no credit", status=402)) == "configuration"
    assert jobs.classify(ProviderUnavailable("down", status=503)) == "world"
    assert jobs.classify(ProviderResponseError("refused", status=400)) == "own"
    assert jobs.classify(RuntimeError("a bug")) == "own"


def test_configuration_holds_and_counts_nothing(cfg):
    step = jobs.next_step(cfg, 3, row(attempts=2), ProviderConfigurationError("bad key", status=401), "E", NOW)
    assert (step.action, step.fault, step.counts, step.error) == ("hold", "configuration", None, "E")


def test_the_world_backs_off_uncounted_until_its_window_closes(cfg):
    step = jobs.next_step(cfg, 3, row(attempts=2, retries=4), ProviderUnavailable("down", retry_after=500), "E", NOW)
    assert (step.action, step.fault, step.counts) == ("back off", "world", "retries")
    assert 500 <= step.delay <= 1000  # Retry-After is a floor, the maximum a cap
    since = NOW - timedelta(seconds=3600)
    step = jobs.next_step(cfg, 3, row(retries=7, retrying_since=since), ProviderUnavailable("down"), "E", NOW)
    assert (step.action, step.fault, step.why) == ("give up", "world", "retry-window")
    assert step.error == f"gave up after 8 retries since {since.isoformat()} (provider unavailable): E"


def test_its_own_failures_count_up_to_the_kinds_cap(cfg):
    step = jobs.next_step(cfg, 3, row(attempts=1), RuntimeError("a bug"), "E", NOW)
    assert (step.action, step.fault, step.counts) == ("back off", "own", "attempts")
    assert 10 <= step.delay <= 20  # the second attempt's backoff: base * 2, half of it jittered
    step = jobs.next_step(cfg, 3, row(attempts=2), RuntimeError("a bug"), "E", NOW)
    assert (step.action, step.fault, step.why) == ("give up", "own", "attempts")
    assert step.error == "gave up after 3 attempts: E"
