"""Chat completions over the OpenAI-compatible wire (OpenRouter by default; Ollama, vLLM, ... by base URL)."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from .base import Deadline, ProviderResponseError, ProviderUnavailable, client_error, post_json, tls_context


@dataclass
class Completion:
    text: str
    model: str
    usage: dict = field(default_factory=dict)
    offline: bool = False


class ChatClient:
    def __init__(self, base_url: str, api_key: str | None, *, timeout: float, max_retries: int,
                 transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self._headers = {"Content-Type": "application/json", "X-Title": "eros"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(transport=transport, verify=tls_context())

    def describe(self) -> str:
        return f"openai-compatible chat at {self.base_url}"

    def complete(self, model: str, messages: list[dict], *, max_tokens: int = 600, temperature: float = 0.7,
                 deadline: Deadline | None = None, json_mode: bool = False) -> Completion:
        payload: dict = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        if json_mode:
            payload["response_format"] = {"type": "json_object"}
        body = post_json(self._client, f"{self.base_url}/chat/completions", payload, headers=self._headers,
                         timeout=self.timeout, max_retries=self.max_retries, deadline=deadline,
                         what=f"chat completion ({model})")
        _raise_embedded_error(body, model)
        try:
            message = body["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise ProviderResponseError("chat completion: no choices[0].message in the response") from None
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # some servers send content parts
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if not isinstance(content, str):
            raise ProviderResponseError("chat completion: message content is missing")
        usage = body.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return Completion(text=content, model=str(body.get("model") or model), usage=usage)


def _raise_embedded_error(body: dict, model: str) -> None:
    """OpenRouter answers HTTP 200 with ``{"error": {"code", "message"}}`` when the upstream model fails after
    the request was accepted; a 408/429/5xx code there is an availability failure (retry later), not a
    malformed answer."""
    error = body.get("error")
    if not isinstance(error, dict) or body.get("choices"):
        return
    code = error.get("code")
    message = str(error.get("message") or "")[:300]
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if isinstance(code, int) and (code in (408, 429) or code >= 500):
        raise ProviderUnavailable(f"chat completion ({model}): upstream error {code}: {message}", status=code)
    raise client_error(f"chat completion ({model}): error {code}: {message}", code if isinstance(code, int) else None,
                       model=model, body=message, code=code)
