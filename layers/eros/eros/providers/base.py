"""What the provider clients share: errors, a time budget, and one retrying POST."""

from __future__ import annotations

import datetime
import email.utils
import functools
import json
import math
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ..credentials import ConfigurationError
from ..observability import logger

# The clocks and the sleep of the retry loop, looked up at call time: tests replace them (a recording sleep
# that returns at once and moves the clocks on) instead of waiting for real backoffs and Retry-Afters.
sleep = time.sleep
monotonic = time.monotonic
wall_time = time.time  # Retry-After as an HTTP date counts from the wall clock


@functools.cache
def tls_context() -> ssl.SSLContext:
    """What every provider client verifies servers against: httpx's default (certifi's CA bundle, or
    SSL_CERT_FILE / SSL_CERT_DIR), made once per process. httpx builds a new one for each client it
    creates otherwise, and loading the bundle is ~30 ms (an SSLContext is safe to share between threads)."""
    return httpx.create_ssl_context()


def tokens(text: str) -> int:
    """About as many tokens as a provider would report for ``text``: a token per four characters of English, one per
    Chinese character (BPE tokenizers give a CJK character a token or more); never 0 for text. The offline
    stand-ins report these, and a streamed answer whose server sent no usage is estimated with it (providers.llm),
    so usage, the daily budget and the cost report can be seen working with no keys (the offline models are priced
    at 0)."""
    cjk = sum(1 for ch in text if ch >= "\u3400")
    return math.ceil((len(text) - cjk) / 4) + cjk


class ProviderError(Exception):
    """Base of provider failures. ``status`` is the provider's HTTP status (or the error code it sent
    inside a 200), when there was one: what logs and stored errors may name instead of the body."""

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after  # the provider's Retry-After hint in seconds, if it sent one


class ProviderUnavailable(ProviderError):
    """Timeouts, connection failures, 5xx, 408 and 429: worth retrying later (the dreaming failure policy)."""


class ProviderTimeout(ProviderUnavailable):
    """The provider did not answer within its timeout, or the caller's time budget ran out."""


class ProviderResponseError(ProviderError):
    """The provider answered, but not with something usable (4xx other than 408/429, a malformed body)."""


class ProviderConfigurationError(ProviderResponseError):
    """401, 402, 403: a bad or missing key, no credit, a forbidden model. Not the request's fault and not
    worth retrying until someone fixes the configuration (dreaming holds its work and says so in health)."""


class ProviderNotConfigured(ProviderConfigurationError, ConfigurationError):
    """A deployment's provider secret lacks a key: the offline stand-ins are for local runs only (they would write
    echo replies and hashing vectors into real memories). A request is answered 503 ``provider_not_configured``
    (eros.errors.ModelFailed) and dreaming holds its work (a configuration fault, counted against no session),
    as for a key the provider refuses; ``/v1/health`` says which key is missing."""


class EmbedderMismatch(ProviderConfigurationError):
    """The configured embedder is not the model that embedded the deployment's stored vectors (engine.embedding_space,
    migration 0032): a cosine between vectors of two models means nothing, so nothing is compared or written with
    it (eros.calibrated.guard). Like any configuration fault: a turn answers 503 ``provider_misconfigured``,
    dreaming holds its work, and ``/v1/health/deep`` and ``eros doctor`` name both models."""

    def __init__(self, stored: str, configured: str):
        super().__init__(f"the stored vectors were embedded by {stored!r}, but the configured embedder is"
                         f" {configured!r}: vectors of two models cannot be compared; set EMBED_MODEL back to"
                         f" {stored!r} (a re-embedding of the stored memories is not available yet)")
        self.stored, self.configured = stored, configured


class ModelNotFound(ProviderConfigurationError):
    """The provider does not serve the model we name: a 404 (Ollama's and vLLM's answer for an unknown model, OpenAI's
    and OpenRouter's for a model with no endpoint, and any server's for a base URL that is not its API), or a 400
    whose error is about the model (OpenRouter's "is not a valid model ID", OpenAI's ``model_not_found``). A setting
    is wrong (CHAT_MODEL, EXTRACT_MODEL, EMBED_MODEL or the base URL), not the request: dreaming holds and probes
    (counted against no session), a turn answers 503 ``provider_misconfigured``, and the message names the
    setting."""

    def __init__(self, message: str, *, status: int | None, model: str):
        super().__init__(message, status=status)
        self.model = model

    @property
    def settings_named(self) -> list[str]:
        """The variables whose value is this model (one model may be several settings' value)."""
        from ..config import settings

        cfg = settings()
        named = [name for name, value in (("CHAT_MODEL", cfg.chat_model), ("EXTRACT_MODEL", cfg.extract_model),
                                          ("EMBED_MODEL", cfg.embed_model)) if value == self.model]
        return named or ["the model settings"]

    def hint(self) -> str:
        """What to set, for logs, stored errors and health (a model name is configuration, never user content)."""
        return f"model {self.model!r} is not served there: set {' / '.join(self.settings_named)} to a model it serves"


CONFIGURATION_STATUSES = (401, 402, 403)
# How providers word an unknown model in a 400 (lower-cased); the model's own name must be in the text as well.
_UNKNOWN_MODEL_WORDS = ("not a valid model", "not found", "does not exist", "not supported", "unknown model",
                        "invalid model", "no endpoints")


def client_error(message: str, status: int | None, *, model: str | None = None, body: str = "",
                 code: object = None) -> ProviderResponseError:
    """The error for a provider's 4xx answer (or error code inside a 200) that is not 408/429: ``body`` is the
    answer's text (or the embedded error's message) and ``code`` the error code it carries, if any."""
    if model and _unknown_model(status, model, body, code):
        return ModelNotFound(message, status=status, model=model)
    kind = ProviderConfigurationError if status in CONFIGURATION_STATUSES else ProviderResponseError
    return kind(message, status=status)


def _unknown_model(status: int | None, model: str, body: str, code: object) -> bool:
    if status == 404 or code == "model_not_found":
        return True
    text = body.lower()
    return status == 400 and model.lower() in text and any(words in text for words in _UNKNOWN_MODEL_WORDS)


@dataclass
class Deadline:
    """An absolute time budget shared by every call of one unit of work (a chat turn, an extraction)."""

    expires_at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(monotonic() + seconds)

    def remaining(self) -> float:
        return self.expires_at - monotonic()


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:  # the HTTP-date form; an unparseable value means "no hint" (use our own backoff), not a crash
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if parsed.tzinfo is None:  # "-0000" dates come back naive; HTTP dates are always UTC
            parsed = parsed.replace(tzinfo=datetime.UTC)
        return max(0.0, parsed.timestamp() - wall_time())
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _json_object(response: httpx.Response, what: str) -> dict:
    try:
        body = response.json()
    except ValueError:
        raise ProviderResponseError(f"{what}: response is not JSON") from None
    if not isinstance(body, dict):
        raise ProviderResponseError(f"{what}: response is not a JSON object")
    return body


def _attempt(client: httpx.Client, url: str, payload: dict, *, headers: dict, timeout: float,
             what: str) -> dict | ProviderUnavailable:
    """One POST: the decoded JSON object, or the failure worth retrying (with the provider's Retry-After
    hint, if any). A failure not worth retrying (a 4xx, a malformed body) is raised."""
    try:
        response = client.post(url, json=payload, headers=headers, timeout=timeout)
    except httpx.TimeoutException as exc:
        return ProviderTimeout(f"{what}: timed out ({type(exc).__name__})")
    except httpx.TransportError as exc:
        return ProviderUnavailable(f"{what}: connection failed ({type(exc).__name__})")
    status = response.status_code
    if status in (408, 429) or status >= 500:
        return ProviderUnavailable(f"{what}: HTTP {status}", status=status, retry_after=_retry_after(response))
    if status >= 400:
        text = response.text[:2000]
        raise client_error(f"{what}: HTTP {status}: {text[:300]}", status, model=payload.get("model"), body=text,
                           code=_error_code(text))
    return _json_object(response, what)


def _error_code(text: str) -> object:
    """The ``error.code`` of an OpenAI-style error body, if the text is one."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


def backoff(attempt: int) -> float:
    """Our own wait before retry ``attempt + 1`` when the provider gave no Retry-After: 0.25 s doubling
    to 4 s at most, times a jitter in [0.5, 1)."""
    return min(4.0, 0.25 * 2**attempt) * (0.5 + random.random() / 2)


def post_json(client: httpx.Client, url: str, payload: dict, *, headers: dict, timeout: float,
              max_retries: int, deadline: Deadline | None, what: str) -> dict:
    """POST with retries on 408/429/5xx/timeouts (exponential backoff with jitter, Retry-After honoured),
    never past the deadline. Returns the decoded JSON object or raises a ProviderError."""
    return retrying(lambda budget: _attempt(client, url, payload, headers=headers, timeout=min(timeout, budget),
                                            what=what),
                    timeout=timeout, max_retries=max_retries, deadline=deadline, what=what)


def retrying[T](attempt: Callable[[float], T | ProviderUnavailable], *, timeout: float, max_retries: int,
                deadline: Deadline | None, what: str) -> T:
    """``attempt(budget)`` until it answers (what it returns that is not a ``ProviderUnavailable``), retried on
    such a failure with exponential backoff and jitter, the provider's Retry-After honoured, never past the
    deadline; what it raises is raised. A POST's answer (``post_json``) and a streamed answer's start share it."""
    deadline = deadline or Deadline.after(timeout * (max_retries + 1) + 10)
    attempt_no = 0
    while True:
        budget = deadline.remaining()
        if budget <= 0.05:
            raise ProviderTimeout(f"{what}: time budget exhausted")
        outcome = attempt(budget)
        if not isinstance(outcome, ProviderUnavailable):
            return outcome
        if attempt_no >= max_retries:
            raise outcome
        wait = outcome.retry_after if outcome.retry_after is not None else backoff(attempt_no)
        if wait >= deadline.remaining() - 0.05:
            raise outcome  # waiting would blow the budget: fail now and let the caller decide
        logger.info("provider retry", extra={"what": what, "attempt": attempt_no + 1, "wait_s": round(wait, 3),
                                             "reason": str(outcome)})
        sleep(wait)
        attempt_no += 1


def open_stream(client: httpx.Client, url: str, payload: dict, *, headers: dict, timeout: float,
                what: str) -> httpx.Response | ProviderUnavailable:
    """One POST whose answer is read as it comes (a streamed completion): the response, its status checked and its
    body not read yet (the caller closes it), or the failure worth retrying, as ``_attempt``'s; a 4xx is raised."""
    try:
        response = client.send(client.build_request("POST", url, json=payload, headers=headers, timeout=timeout),
                               stream=True)
    except httpx.TimeoutException as exc:
        return ProviderTimeout(f"{what}: timed out ({type(exc).__name__})")
    except httpx.TransportError as exc:
        return ProviderUnavailable(f"{what}: connection failed ({type(exc).__name__})")
    status = response.status_code
    if status < 400:
        return response
    try:
        text = response.read().decode("utf-8", "replace")[:2000]
    except httpx.HTTPError:
        text = ""
    finally:
        response.close()
    if status in (408, 429) or status >= 500:
        return ProviderUnavailable(f"{what}: HTTP {status}", status=status, retry_after=_retry_after(response))
    raise client_error(f"{what}: HTTP {status}: {text[:300]}", status, model=payload.get("model"), body=text,
                       code=_error_code(text))
