"""Chat completions over the OpenAI-compatible wire (OpenRouter by default; Ollama, vLLM, ... by base URL)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import httpx

from .base import (
    Deadline,
    ProviderResponseError,
    ProviderTimeout,
    ProviderUnavailable,
    client_error,
    open_stream,
    post_json,
    retrying,
    tls_context,
    tokens,
)


@dataclass
class Completion:
    text: str
    model: str
    usage: dict = field(default_factory=dict)
    offline: bool = False


class CompletionStream:
    """A completion as the model writes it. Iterating gives the pieces of its text as they come; after the last,
    ``completion`` is the whole answer (its text the pieces joined, its usage the provider's report, or, from a
    server that sends none, an estimate). A failure mid-stream raises from the iteration (a ``ProviderError``);
    ``paid()`` is then what the pieces streamed so far cost, which the provider bills all the same.

    Built from OpenAI-compatible stream chunks (``{"model", "choices": [{"delta": {"content"}}], "usage"}``): the
    HTTP client's, parsed from Server-Sent Events, or the offline model's own."""

    def __init__(self, chunks: Iterable[dict], model: str, messages: list[dict], *, offline: bool = False):
        self._chunks, self._model, self._messages, self._offline = chunks, model, messages, offline
        self._pieces: list[str] = []
        self._usage: dict = {}
        self.completion: Completion | None = None

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks:
            _raise_embedded_error(chunk, self._model, streaming=True)
            if isinstance(chunk.get("model"), str) and chunk["model"]:
                self._model = chunk["model"]
            if isinstance(chunk.get("usage"), dict):
                self._usage = chunk["usage"]
            choices = chunk.get("choices")
            delta = choices[0].get("delta") if isinstance(choices, list) and choices and isinstance(
                choices[0], dict) else None
            piece = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(piece, str) and piece:
                self._pieces.append(piece)
                yield piece
        self.completion = Completion(text="".join(self._pieces), model=self._model,
                                     usage=self._usage or self.paid(), offline=self._offline)

    def paid(self) -> dict:
        """The usage of what was streamed: the provider's report when it sent one, else an estimate of the prompt
        and of the pieces so far (~4 characters a token, a token per CJK character: eros.providers.base.tokens)."""
        if self._usage:
            return self._usage
        prompt = sum(tokens(str(m.get("content") or "")) for m in self._messages)
        completion = tokens("".join(self._pieces))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


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

    def stream(self, model: str, messages: list[dict], *, max_tokens: int = 600, temperature: float = 0.7,
               deadline: Deadline | None = None) -> CompletionStream:
        """The completion as the model writes it (``"stream": true``: Server-Sent Events, which OpenRouter, Ollama,
        vLLM and OpenAI all send), with the usage asked for in its last chunk. Its start is retried as
        ``complete`` is (a 429, a 5xx, a refused connection: nothing was streamed yet); once a piece has come, a
        failure is raised to the reader, never retried (the reader has shown the pieces)."""
        payload = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                   "stream": True, "stream_options": {"include_usage": True}}
        deadline = deadline or Deadline.after(self.timeout * (self.max_retries + 1) + 10)
        return CompletionStream(self._chunks(payload, deadline), model, messages)

    def _chunks(self, payload: dict, deadline: Deadline) -> Iterator[dict]:
        what = f"chat completion ({payload['model']}, streamed)"
        response = retrying(lambda budget: open_stream(self._client, f"{self.base_url}/chat/completions", payload,
                                                       headers=self._headers, timeout=min(self.timeout, budget),
                                                       what=what),
                            timeout=self.timeout, max_retries=self.max_retries, deadline=deadline, what=what)
        finished = False
        try:
            for line in response.iter_lines():
                if deadline.remaining() <= 0:
                    raise ProviderTimeout(f"{what}: time budget exhausted mid-stream")
                if not line.startswith("data:"):
                    continue  # blank lines end events; ":" lines are comments (OpenRouter's keep-alives)
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise ProviderResponseError(f"{what}: a chunk is not JSON") from None
                if not isinstance(chunk, dict):
                    raise ProviderResponseError(f"{what}: a chunk is not a JSON object")
                choices = chunk.get("choices")
                finished = finished or bool(isinstance(choices, list) and choices and isinstance(choices[0], dict)
                                            and choices[0].get("finish_reason"))
                yield chunk
        except httpx.TimeoutException as exc:
            raise ProviderTimeout(f"{what}: timed out mid-stream ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise ProviderUnavailable(f"{what}: the stream broke ({type(exc).__name__})") from None
        finally:
            response.close()
        if not finished:  # the server closed the stream before the answer ended
            raise ProviderUnavailable(f"{what}: the stream ended before the answer did")


def _raise_embedded_error(body: dict, model: str, *, streaming: bool = False) -> None:
    """OpenRouter answers HTTP 200 with ``{"error": {"code", "message"}}`` when the upstream model fails after
    the request was accepted (in a stream: as a chunk, after pieces were sent); a 408/429/5xx code there is an
    availability failure (retry later), not a malformed answer, and so is any error that breaks a stream."""
    error = body.get("error")
    if not isinstance(error, dict) or body.get("choices"):
        return
    code = error.get("code")
    message = str(error.get("message") or "")[:300]
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    if streaming or (isinstance(code, int) and (code in (408, 429) or code >= 500)):
        raise ProviderUnavailable(f"chat completion ({model}): upstream error {code}: {message}",
                                  status=code if isinstance(code, int) else None)
    raise client_error(f"chat completion ({model}): error {code}: {message}", code if isinstance(code, int) else None,
                       model=model, body=message, code=code)
