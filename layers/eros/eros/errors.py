"""Errors a client is told about. Each is a ``ClientError``: its HTTP ``status``, a stable ``code`` (clients
branch on it), a message for people and the fields a client acts on (``extra``: ``retryable``,
``retry_after``, ...). The chat function answers every one the same way, from these; the modules that raise
them choose what went wrong, never how the answer is written."""

from __future__ import annotations

from typing import Any

from .providers.base import (
    EmbedderMismatch,
    ModelNotFound,
    ProviderConfigurationError,
    ProviderError,
    ProviderNotConfigured,
    ProviderTimeout,
    ProviderUnavailable,
)


class ClientError(Exception):
    """The base of every error a client is told about; a subclass (or, where it depends on what failed, an
    instance) sets ``status`` and ``code``. The answer is ``{"statusCode", "code", "message", **extra}``."""

    status: int
    code: str

    def __init__(self, message: str, **extra: Any):
        super().__init__(message)
        self.extra = extra


class NotFound(ClientError):
    """No such thing of this user (a session, a memory, a persona). Another user's id is "not found"
    too, never a different answer: ids do not leak across users."""
    status, code = 404, "not_found"


class Unauthorized(ClientError):
    """A verified token (or an API key) that does not name a caller the API can serve: a subject it cannot use, an
    app that does not exist here or is being deleted, a key that is not live."""
    status, code = 401, "unauthorized"


class Forbidden(ClientError):
    """A verified caller without the right to this route (an operator route without the operator scope)."""
    status, code = 403, "forbidden"


# A model that timed out is a gateway timeout, one that is down is unavailable, one that refused is a bad gateway.
# A deployment whose provider configuration is wrong is unavailable until its operator fixes it (never a 500).
_MODEL_FAILURE_STATUS = {"model_timeout": 504, "model_unavailable": 503, "model_error": 502,
                         "provider_not_configured": 503, "provider_misconfigured": 503}
# What a misconfigured provider is told as: what its operator fixes (the status the provider answered).
_MISCONFIGURED = {401: "the model provider refuses the service's key", 402: "the model provider account has no credit"}


class ModelFailed(ClientError):
    """A provider (the chat model or the embedder) failed a request a person is waiting for.

    What an API client sees is stable and never the provider's text (which can echo the user's
    content): ``code`` (model_timeout, model_unavailable, model_error, provider_not_configured,
    provider_misconfigured), a fixed message, and
    ``retryable``, true only for availability failures (timeouts, the provider's 5xx, 408 and 429): a
    retry of a request the provider refused (400, 401, 402, 403, a malformed answer) fails the same way."""

    def __init__(self, cause: ProviderError, **extra: Any):
        status = provider_status(cause)
        refused = status is not None and 400 <= status < 500 and status not in (408, 429)
        if isinstance(cause, ProviderNotConfigured):  # the deployment has no key for it
            code, message, retryable = ("provider_not_configured", "the service has no model provider configured: "
                                        "its operator must set the provider keys", False)
        elif isinstance(cause, EmbedderMismatch):  # the operator changed EMBED_MODEL under stored vectors
            code, message, retryable = ("provider_misconfigured", "the configured embedder is not the model the "
                                        "stored memories were embedded with: its operator must fix it", False)
        elif isinstance(cause, ModelNotFound) or (isinstance(cause, ProviderConfigurationError)
                                                  and status in _MISCONFIGURED):
            # A 403 stays a model_error: OpenRouter also answers 403 to a message its moderation flags.
            what = (f"the model provider does not serve the configured {' / '.join(cause.settings_named)}"
                    if isinstance(cause, ModelNotFound) else _MISCONFIGURED[status or 0])
            code, message, retryable = "provider_misconfigured", f"{what}: its operator must fix it", False
        elif isinstance(cause, ProviderTimeout) and not refused:
            code, message, retryable = "model_timeout", "the model did not answer in time", True
        elif isinstance(cause, ProviderUnavailable) and not refused:
            code, message, retryable = "model_unavailable", "the model is unavailable", True
        else:
            code, message, retryable = "model_error", "the model could not answer this message", False
        self.code, self.status, self.retryable = code, _MODEL_FAILURE_STATUS[code], retryable
        super().__init__(f"{message}; {self.outcome()}", **extra, retryable=retryable)

    def outcome(self) -> str:
        """What became of the request, for the message."""
        return "nothing was stored"


def provider_status(exc: BaseException) -> int | None:
    """The provider's HTTP status (or the error code it sent inside a 200), when the error carries one."""
    value = getattr(exc, "status", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
