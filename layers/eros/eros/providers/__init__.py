"""Model providers: the chat/extraction LLM and the embedder, real or offline.

``chat_client()`` and ``embedder()`` pick real HTTP clients when keys (or explicit base URLs)
are configured and the offline, deterministic ones otherwise -- but never in a deployment that
names a provider secret: there a missing key is a configuration error, not a reason to write
echo replies and hashing vectors into production memories. They are built once per
container, so warm invocations reuse HTTP connections.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from ..config import settings
from ..credentials import with_provider_keys
from ..observability import logger
from .base import (
    Deadline,
    EmbedderMismatch,
    ModelNotFound,
    ProviderConfigurationError,
    ProviderError,
    ProviderNotConfigured,
    ProviderResponseError,
    ProviderTimeout,
    ProviderUnavailable,
)
from .embed import VoyageEmbedder
from .llm import ChatClient

if TYPE_CHECKING:  # imported where chosen: a deployed container never runs the offline models
    from .offline import HashingEmbedder, OfflineChat

__all__ = ["Deadline", "EmbedderMismatch", "ModelNotFound", "ProviderConfigurationError", "ProviderError",
           "ProviderNotConfigured", "ProviderResponseError", "ProviderTimeout", "ProviderUnavailable", "chat_client",
           "embedder", "describe", "running_offline"]


@lru_cache(maxsize=1)
def chat_client() -> ChatClient | OfflineChat:
    s = with_provider_keys(settings())
    if s.llm_online:
        key = s.openrouter_api_key.get_secret_value() if s.openrouter_api_key else None
        return ChatClient(s.llm_url, key, timeout=s.llm_timeout_secs, max_retries=s.provider_max_retries)
    _refuse_offline_in_deployment(s, "OPENROUTER_API_KEY")
    logger.warning("no LLM key or base URL configured: using the OFFLINE chat and extraction model")
    from .offline import OfflineChat

    return OfflineChat()


@lru_cache(maxsize=1)
def embedder() -> VoyageEmbedder | HashingEmbedder:
    s = with_provider_keys(settings())
    if s.embed_online:
        key = s.voyage_api_key.get_secret_value() if s.voyage_api_key else None
        return VoyageEmbedder(s.embed_url, key, model=s.embed_model, timeout=s.embed_timeout_secs,
                              max_retries=s.provider_max_retries)
    _refuse_offline_in_deployment(s, "VOYAGE_API_KEY")
    logger.warning("no Voyage key or base URL configured: using the OFFLINE lexical hashing embedder")
    from .offline import HashingEmbedder

    return HashingEmbedder()


def embedder_of(model: str) -> VoyageEmbedder | HashingEmbedder | None:
    """A client of ``model`` like the configured embedder (the same server and key) or, for the offline stand-in's
    model, the stand-in (local runs only): what embeds with the stored vectors' model while a re-embedding toward
    the configured one is under way. None when neither fits."""
    configured = embedder()
    if model == configured.model:
        return configured
    from .offline import HashingEmbedder

    if model == HashingEmbedder.model:
        return None if with_provider_keys(settings()).provider_secret_arn else HashingEmbedder()
    if isinstance(configured, VoyageEmbedder):
        return configured.of(model)
    return None


def _refuse_offline_in_deployment(s, key: str) -> None:
    if s.provider_secret_arn:
        raise ProviderNotConfigured(f"the provider secret has no {key}: put it in (docs/DEPLOY.md); offline "
                                    "providers are for local runs only")


def describe() -> dict[str, str]:
    """What the process runs on, for start-up banners and /v1/health."""
    return {"llm": chat_client().describe(), "embedder": embedder().describe()}


def running_offline() -> list[str]:
    """Which of "llm" and "embedder" this process runs the offline stand-ins for (no key or base URL set), for
    /v1/health: a client (the console) can say why replies are echoes and memories crude."""
    return [name for name, client in (("llm", chat_client()), ("embedder", embedder()))
            if getattr(client, "offline", False)]


def reset() -> None:
    chat_client.cache_clear()
    embedder.cache_clear()
