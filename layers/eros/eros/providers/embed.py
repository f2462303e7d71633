"""Voyage embeddings (``/v1/embeddings``): batched inputs, query|document input type, 512 dimensions."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Literal

import httpx

from ..config import EMBED_DIM
from .base import Deadline, ProviderResponseError, post_json, tls_context

InputType = Literal["query", "document"]
MAX_BATCH = 128  # Voyage accepts up to 1,000 inputs a request; smaller batches keep each call quick


@dataclass
class Embeddings:
    vectors: list[list[float]]
    model: str
    usage: dict = field(default_factory=dict)
    offline: bool = False


class VoyageEmbedder:
    def __init__(self, base_url: str, api_key: str | None, *, model: str, timeout: float, max_retries: int,
                 transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(transport=transport, verify=tls_context())

    def of(self, model: str) -> VoyageEmbedder:
        """A client of another model on the same server, with the same key and connections."""
        twin = copy.copy(self)
        twin.model = model
        return twin

    def describe(self) -> str:
        return f"voyage embeddings ({self.model}, {EMBED_DIM}-d) at {self.base_url}"

    def embed(self, texts: list[str], input_type: InputType, *, deadline: Deadline | None = None) -> Embeddings:
        vectors: list[list[float]] = []
        usage_tokens = 0
        for start in range(0, len(texts), MAX_BATCH):
            batch = texts[start:start + MAX_BATCH]
            body = post_json(self._client, f"{self.base_url}/embeddings",
                             {"input": batch, "model": self.model, "input_type": input_type,
                              "output_dimension": EMBED_DIM},
                             headers=self._headers, timeout=self.timeout, max_retries=self.max_retries,
                             deadline=deadline, what=f"embeddings ({self.model})")
            vectors.extend(_vectors(body, len(batch)))
            usage = body.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
                usage_tokens += usage["total_tokens"]
        return Embeddings(vectors=vectors, model=self.model, usage={"total_tokens": usage_tokens})


def _vectors(body: dict, expected: int) -> list[list[float]]:
    data = body.get("data")
    if not isinstance(data, list) or len(data) != expected:
        raise ProviderResponseError(f"embeddings: expected {expected} items in data")
    try:
        ordered = sorted(data, key=lambda item: item["index"])
        if [item["index"] for item in ordered] != list(range(expected)):
            # duplicate or missing indices would silently pair vectors with the wrong texts
            raise ProviderResponseError(f"embeddings: data indices are not 0..{expected - 1}")
        vectors = [[float(x) for x in item["embedding"]] for item in ordered]
    except (KeyError, TypeError, ValueError):
        raise ProviderResponseError("embeddings: malformed data items") from None
    if any(not math.isfinite(x) for v in vectors for x in v):  # Python's json accepts NaN/Infinity
        raise ProviderResponseError("embeddings: vectors contain non-finite numbers")
    if any(len(v) != EMBED_DIM for v in vectors):
        raise ProviderResponseError(f"embeddings: vectors are not {EMBED_DIM}-dimensional")
    return vectors
