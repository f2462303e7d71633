"""The eros memory engine's HTTP API from Python: ``Client`` (sync) and ``AsyncClient`` (asyncio), one method per
operation, answers as the pydantic models of ``eros_client.models`` (generated from the API's OpenAPI document),
errors as ``ApiError`` with the API's stable ``code`` (``Unauthorized`` for every 401, whichever body it came
with), and retries that honour ``retryable`` and Retry-After."""

from . import models
from ._client import ApiError, AsyncClient, Client, Unauthorized
from ._operations import UNSET
from ._stream import AsyncTurnStream, TurnStream

__all__ = ["ApiError", "AsyncClient", "AsyncTurnStream", "Client", "TurnStream", "UNSET", "Unauthorized",
           "models"]
