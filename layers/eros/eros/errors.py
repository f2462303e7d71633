"""Domain errors that more than one use-case raises. The chat function maps each to its HTTP answer;
nothing below the handler chooses a status code."""

from __future__ import annotations

from .providers.base import ProviderError, ProviderTimeout, ProviderUnavailable


class NotFound(LookupError):
    """No such thing of this user (a session, a memory, a persona). Another user's id is "not found"
    too, never a different answer: ids do not leak across users."""


class ModelFailed(Exception):
    """A provider (the chat model or the embedder) failed a request a person is waiting for.

    What an API client sees is stable and never the provider's text (which can echo the user's
    content): ``code`` (model_timeout, model_unavailable, model_error), a fixed message, and
    ``retryable``, true only for availability failures (timeouts, the provider's 5xx, 408 and 429): a
    retry of a request the provider refused (400, 401, 402, 403, a malformed answer) fails the same way."""

    def __init__(self, cause: ProviderError):
        status = provider_status(cause)
        refused = status is not None and 400 <= status < 500 and status not in (408, 429)
        if isinstance(cause, ProviderTimeout) and not refused:
            code, message, retryable = "model_timeout", "the model did not answer in time", True
        elif isinstance(cause, ProviderUnavailable) and not refused:
            code, message, retryable = "model_unavailable", "the model is unavailable", True
        else:
            code, message, retryable = "model_error", "the model could not answer this message", False
        super().__init__(message)
        self.code, self.retryable = code, retryable


def provider_status(exc: BaseException) -> int | None:
    """The provider's HTTP status (or the error code it sent inside a 200), when the error carries one."""
    value = getattr(exc, "status", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
