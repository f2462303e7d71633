"""The provider clients (chat LLM, Voyage embeddings) against real loopback fakes, the offline providers,
and how ``eros.providers`` picks between them."""

from __future__ import annotations

import email.utils
import math
import threading
import time

import httpx
import pytest
from fakes import Delay, Disconnect, FakeOpenRouter, FakeVoyage, Malformed, Raw, Reply, Status
from helpers import cosine

from eros import providers
from eros.config import EMBED_DIM
from eros.providers import Deadline, ProviderResponseError, ProviderUnavailable, base
from eros.providers.base import _retry_after, post_json
from eros.providers.embed import MAX_BATCH, VoyageEmbedder
from eros.providers.llm import ChatClient
from eros.providers.offline import HashingEmbedder, OfflineChat, hash_embed

MESSAGES = [{"role": "system", "content": "You are Mira."}, {"role": "user", "content": "hello there"}]


def chat(fake, key: str | None = "sk-test", *, timeout: float = 2.0, max_retries: int = 2) -> ChatClient:
    return ChatClient(fake.url, key, timeout=timeout, max_retries=max_retries)


def voyage(fake, key: str | None = "pa-test", *, timeout: float = 2.0, max_retries: int = 2) -> VoyageEmbedder:
    return VoyageEmbedder(fake.url, key, model="voyage-3.5-lite", timeout=timeout, max_retries=max_retries)


def completion_body(content) -> dict:
    return {"id": "gen-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}


# --- chat completions: the happy path ---------------------------------------------------------------------

def test_completion_returns_text_model_and_usage(fake_llm):
    fake_llm.responder = lambda req: "echo: " + req["messages"][-1]["content"]
    result = chat(fake_llm).complete("anthropic/claude-haiku-4.5", MESSAGES, max_tokens=123, temperature=0.2)

    assert result.text == "echo: hello there"
    assert result.model == "anthropic/claude-haiku-4.5"
    assert result.offline is False
    usage = result.usage
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    [request] = fake_llm.requests
    assert request["method"] == "POST" and request["path"] == "/v1/chat/completions"
    assert request["json"] == {"model": "anthropic/claude-haiku-4.5", "messages": MESSAGES, "max_tokens": 123,
                               "temperature": 0.2}
    assert request["headers"]["authorization"] == "Bearer sk-test"
    assert request["headers"]["content-type"] == "application/json"
    assert request["headers"]["x-title"] == "eros"


def test_json_mode_asks_for_a_json_object(fake_llm):
    fake_llm.responder = lambda req: '{"memories": []}'
    result = chat(fake_llm).complete("m", MESSAGES, json_mode=True)
    assert result.text == '{"memories": []}'
    assert fake_llm.requests[0]["json"]["response_format"] == {"type": "json_object"}


def test_default_reply_and_one_shot_reply(fake_llm):
    client = chat(fake_llm)
    fake_llm.push(Reply("first, specific"))
    assert client.complete("m", MESSAGES).text == "first, specific"
    assert client.complete("m", MESSAGES).text == "fake reply"
    assert fake_llm.pending == 0 and fake_llm.calls == 2


def test_connections_are_kept_alive(fake_llm):
    client = chat(fake_llm)
    for _ in range(3):
        client.complete("m", MESSAGES)
    assert len({r["client"] for r in fake_llm.requests}) == 1  # one TCP connection served all three


def test_content_parts_are_joined(fake_llm):
    fake_llm.push(Raw(completion_body([{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}])))
    assert chat(fake_llm).complete("m", MESSAGES).text == "Hello"


def test_model_falls_back_to_the_requested_one_and_usage_to_empty(fake_llm):
    body = completion_body("hi")
    del body["model"]
    fake_llm.push(Raw(body))
    result = chat(fake_llm).complete("my/model", MESSAGES)
    assert (result.text, result.model, result.usage) == ("hi", "my/model", {})


@pytest.mark.parametrize("make", [chat, voyage], ids=["llm", "voyage"])
def test_authorization_header_only_with_a_key(make, fake_llm, fake_voyage):
    fake = fake_llm if make is chat else fake_voyage
    call = (lambda c: c.complete("m", MESSAGES)) if make is chat else (lambda c: c.embed(["x"], "query"))
    call(make(fake, "secret-key"))
    call(make(fake, None))
    call(make(fake, ""))
    with_key, without, empty = fake.requests
    assert with_key["headers"]["authorization"] == "Bearer secret-key"
    assert "authorization" not in without["headers"]
    assert "authorization" not in empty["headers"]


@pytest.mark.integration
def test_fake_enforces_its_api_key_and_the_client_reports_401_without_retry():
    with FakeOpenRouter(api_key="right") as fake:
        assert chat(fake, "right").complete("m", MESSAGES).text == "fake reply"
        with pytest.raises(ProviderResponseError, match="401"):
            chat(fake, "wrong").complete("m", MESSAGES)
        assert fake.calls == 2


# --- retries, timeouts and the deadline -------------------------------------------------------------------

# The retry loop's waits are skipped and recorded (fakes.skipped_sleeps): what it waited is asserted exactly,
# and the next request follows at once.

def test_the_retry_loop_waits_on_the_real_clock_unless_a_test_says_otherwise():
    assert (base.sleep, base.monotonic, base.wall_time) == (time.sleep, time.monotonic, time.time)


def test_a_skipped_sleep_moves_the_deadline_on(skipped_sleeps):
    deadline = Deadline.after(10)
    base.sleep(4)
    assert 5 < deadline.remaining() <= 6
    assert skipped_sleeps.sleeps == [4]


def test_429_retry_after_is_honoured(fake_llm, skipped_sleeps):
    fake_llm.push(Status(429, retry_after=1))
    assert chat(fake_llm).complete("m", MESSAGES).text == "fake reply"
    assert fake_llm.calls == 2
    assert skipped_sleeps.sleeps == [1.0]


def test_retry_after_as_an_http_date_is_honoured(fake_llm, skipped_sleeps):
    # The wall clock stands at a whole second + 0.25; the date (whole seconds) says 2 s later: 1.75 s to wait.
    fake_llm.push(Status(503, retry_after=email.utils.formatdate(skipped_sleeps.time() + 2, usegmt=True)))
    assert chat(fake_llm).complete("m", MESSAGES).text == "fake reply"
    assert fake_llm.calls == 2
    assert skipped_sleeps.sleeps == [pytest.approx(1.75)]


def test_unparseable_retry_after_falls_back_to_backoff(fake_llm, skipped_sleeps):
    fake_llm.push(Status(503, retry_after="soon, maybe"))
    assert chat(fake_llm).complete("m", MESSAGES).text == "fake reply"
    [wait] = skipped_sleeps.sleeps
    assert 0.125 <= wait <= 0.25  # the first backoff step, not a crash and not a long sleep


@pytest.mark.parametrize("code", [500, 502, 503, 504, 408, 429])
def test_retryable_status_then_success(fake_llm, skipped_sleeps, code):
    fake_llm.push(Status(code, retry_after=0))
    assert chat(fake_llm).complete("m", MESSAGES).text == "fake reply"
    assert fake_llm.calls == 2
    assert skipped_sleeps.sleeps == [0.0]


def test_backoff_without_retry_after_grows_exponentially_with_jitter(fake_llm, skipped_sleeps):
    fake_llm.push(Status(500), Status(500))
    assert chat(fake_llm, max_retries=2).complete("m", MESSAGES).text == "fake reply"
    assert fake_llm.calls == 3
    first, second = skipped_sleeps.sleeps
    assert 0.125 <= first < 0.25  # 0.25 s x [0.5, 1)
    assert 0.25 <= second < 0.5  # 0.5 s x [0.5, 1)


@pytest.mark.parametrize("jitter, waits", [(0.0, [0.125, 0.25, 0.5, 1.0, 2.0, 2.0]),
                                           (0.999999, [0.25, 0.5, 1.0, 2.0, 4.0, 4.0])])
def test_backoff_doubles_up_to_four_seconds_times_a_jitter_of_a_half_to_one(monkeypatch, jitter, waits):
    monkeypatch.setattr(base.random, "random", lambda: jitter)
    assert [base.backoff(attempt) for attempt in range(6)] == [pytest.approx(w, abs=1e-5) for w in waits]


def test_retries_exhausted_raise_provider_unavailable(fake_llm):
    fake_llm.push(*[Status(503, retry_after=0)] * 3)
    with pytest.raises(ProviderUnavailable, match="503"):
        chat(fake_llm, max_retries=2).complete("m", MESSAGES)
    assert fake_llm.calls == 3
    assert fake_llm.pending == 0


def test_no_retries_means_one_attempt(fake_llm):
    fake_llm.push(Status(500))
    with pytest.raises(ProviderUnavailable):
        chat(fake_llm, max_retries=0).complete("m", MESSAGES)
    assert fake_llm.calls == 1


def test_timeouts_are_retried_then_provider_unavailable(fake_llm, skipped_sleeps):
    fake_llm.push(Delay(3), Delay(3))
    started = time.monotonic()
    with pytest.raises(ProviderUnavailable, match="timed out"):
        chat(fake_llm, timeout=0.3, max_retries=1).complete("m", MESSAGES)
    elapsed = time.monotonic() - started
    assert fake_llm.calls == 2
    assert 0.6 <= elapsed < 2.0  # two 0.3 s timeouts (the backoff between them skipped), never the 3 s delay
    [wait] = skipped_sleeps.sleeps
    assert 0.125 <= wait < 0.25


def test_a_timeout_then_success(fake_voyage, skipped_sleeps):
    fake_voyage.push(Delay(2))
    result = voyage(fake_voyage, timeout=0.3, max_retries=1).embed(["late"], "query")
    assert result.vectors == [pytest.approx(hash_embed("late"))]
    assert fake_voyage.calls == 2


def test_a_dropped_connection_is_retried(fake_llm, skipped_sleeps):
    fake_llm.push(Disconnect())
    assert chat(fake_llm).complete("m", MESSAGES).text == "fake reply"
    assert fake_llm.calls == 2


def test_dropped_connections_exhaust_into_provider_unavailable(fake_llm, skipped_sleeps):
    fake_llm.push(Disconnect(), Disconnect())
    with pytest.raises(ProviderUnavailable, match="connection failed"):
        chat(fake_llm, max_retries=1).complete("m", MESSAGES)
    assert fake_llm.calls == 2 and len(skipped_sleeps.sleeps) == 1


@pytest.mark.integration
def test_connection_refused_is_provider_unavailable():
    fake = FakeVoyage()
    client = voyage(fake, max_retries=0)
    fake.close()
    with pytest.raises(ProviderUnavailable, match="connection failed"):
        client.embed(["x"], "query")


def test_retry_after_longer_than_the_deadline_fails_fast(fake_llm, skipped_sleeps):
    fake_llm.push(Status(429, retry_after=5))
    with pytest.raises(ProviderUnavailable, match="429"):
        chat(fake_llm, max_retries=3).complete("m", MESSAGES, deadline=Deadline.after(1.0))
    assert skipped_sleeps.sleeps == []  # no sleep at all (Retry-After asked for 5 s)
    assert fake_llm.calls == 1


def test_a_wait_that_fits_the_deadline_is_taken_and_counts_against_it(fake_llm, skipped_sleeps):
    fake_llm.push(Status(429, retry_after=3), Status(429, retry_after=3))
    with pytest.raises(ProviderUnavailable, match="429"):
        chat(fake_llm, max_retries=3).complete("m", MESSAGES, deadline=Deadline.after(5.0))
    assert skipped_sleeps.sleeps == [3.0]  # the second 3 s no longer fits what is left of the 5 s
    assert fake_llm.calls == 2


def test_an_exhausted_deadline_makes_no_request(fake_llm):
    with pytest.raises(ProviderUnavailable, match="budget"):
        chat(fake_llm).complete("m", MESSAGES, deadline=Deadline.after(0))
    assert fake_llm.calls == 0


def test_the_deadline_caps_the_request_timeout(fake_voyage):
    fake_voyage.push(Delay(3), Delay(3))
    started = time.monotonic()
    with pytest.raises(ProviderUnavailable):
        voyage(fake_voyage, timeout=10, max_retries=3).embed(["x"], "query", deadline=Deadline.after(0.5))
    assert time.monotonic() - started < 1.2


def test_the_deadline_is_shared_across_batches(fake_voyage):
    client = voyage(fake_voyage)
    deadline = Deadline.after(4.0)
    # Each batch alone fits, both together do not; the margin (1.5 s) is what a first batch's overhead may take on
    # a loaded machine (with 1.0 and 0.5 it overran there, and the second batch was never sent).
    fake_voyage.push(Delay(2.5), Delay(2.5))
    with pytest.raises(ProviderUnavailable):
        client.embed(["t"] * (MAX_BATCH + 1), "document", deadline=deadline)
    assert fake_voyage.calls == 2
    assert deadline.remaining() < 0.3


def test_deadline_remaining_counts_down():
    deadline = Deadline.after(10)
    first = deadline.remaining()
    time.sleep(0.01)
    assert 9 < deadline.remaining() < first <= 10
    assert Deadline.after(-1).remaining() < 0


# --- client errors and malformed answers (never retried) --------------------------------------------------

@pytest.mark.parametrize("code", [400, 401, 402, 403, 404, 422])
def test_client_errors_raise_response_error_without_retry(fake_llm, code):
    fake_llm.push(Status(code, body={"error": {"message": "context_length_exceeded", "code": code}}))
    with pytest.raises(ProviderResponseError, match=str(code)) as caught:
        chat(fake_llm, max_retries=3).complete("m", MESSAGES)
    assert "context_length_exceeded" in str(caught.value)
    assert fake_llm.calls == 1


def test_client_errors_are_provider_errors_but_not_unavailable():
    assert issubclass(ProviderResponseError, providers.ProviderError)
    assert issubclass(ProviderUnavailable, providers.ProviderError)
    assert not issubclass(ProviderResponseError, ProviderUnavailable)


@pytest.mark.parametrize("code", [401, 402, 403])
@pytest.mark.parametrize("make", [chat, voyage], ids=["llm", "voyage"])
def test_bad_key_no_credit_and_forbidden_are_configuration_errors_with_their_status(make, code, fake_llm,
                                                                                     fake_voyage):
    # Dreaming holds its work on these (not the session's fault, not worth a retry until fixed).
    fake = fake_llm if make is chat else fake_voyage
    fake.push(Status(code))
    call = (lambda c: c.complete("m", MESSAGES)) if make is chat else (lambda c: c.embed(["x"], "query"))
    with pytest.raises(providers.ProviderConfigurationError) as caught:
        call(make(fake, max_retries=3))
    assert caught.value.status == code and fake.calls == 1
    assert isinstance(caught.value, ProviderResponseError)


@pytest.mark.parametrize("code", [400, 413, 422])
def test_other_client_errors_are_not_configuration_errors(fake_llm, code):
    fake_llm.push(Status(code))
    with pytest.raises(ProviderResponseError) as caught:
        chat(fake_llm).complete("m", MESSAGES)
    assert not isinstance(caught.value, providers.ProviderConfigurationError) and caught.value.status == code


# Issue 29: how the servers people point the engine at answer a model they do not serve. Each is a configuration
# fault naming the setting (dreaming holds instead of counting it against sessions), never the session's.
UNKNOWN_MODEL_ANSWERS = {
    "ollama": Status(404, body={"error": {"message": 'model "llama3.1" not found, try pulling it first',
                                          "type": "api_error", "param": None, "code": None}}),
    "vllm": Status(404, body={"object": "error", "message": "The model `llama3.1` does not exist.",
                              "type": "NotFoundError", "param": None, "code": 404}),
    "openai": Status(404, body={"error": {"message": "The model `llama3.1` does not exist or you do not have access"
                                          " to it.", "type": "invalid_request_error", "code": "model_not_found"}}),
    "openrouter": Status(400, body={"error": {"message": "llama3.1 is not a valid model ID", "code": 400}}),
    "openrouter-no-endpoint": Raw({"error": {"message": "No endpoints found for llama3.1.", "code": 404}}),
    "a base URL that is not the API": Raw("404 page not found", status=404),
}


@pytest.mark.parametrize("answer", UNKNOWN_MODEL_ANSWERS.values(), ids=UNKNOWN_MODEL_ANSWERS.keys())
def test_a_model_the_server_does_not_serve_is_a_configuration_error_naming_the_setting(fake_llm, env, answer):
    env(CHAT_MODEL="llama3.1")
    fake_llm.push(answer)
    with pytest.raises(providers.ModelNotFound) as caught:
        chat(fake_llm, max_retries=3).complete("llama3.1", MESSAGES)
    assert isinstance(caught.value, providers.ProviderConfigurationError) and fake_llm.calls == 1  # not retried
    assert caught.value.model == "llama3.1" and caught.value.settings_named == ["CHAT_MODEL", "EXTRACT_MODEL"]
    assert caught.value.hint() == ("model 'llama3.1' is not served there: set CHAT_MODEL / EXTRACT_MODEL to a model"
                                   " it serves")


def test_an_embedding_model_voyage_does_not_serve_names_embed_model(fake_voyage, env):
    env(EMBED_MODEL="voyage-9")
    fake_voyage.served = {"voyage-3.5-lite"}
    with pytest.raises(providers.ModelNotFound) as caught:
        VoyageEmbedder(fake_voyage.url, "k", model="voyage-9", timeout=2, max_retries=2).embed(["x"], "query")
    assert caught.value.status == 400 and caught.value.settings_named == ["EMBED_MODEL"]


@pytest.mark.parametrize("body", [
    {"error": {"message": "messages: content not found in item 2", "code": 400}},  # about the request, not the model
    {"error": {"message": "'llama3.1' prompt is too long: 300000 tokens > 128000", "code": 400}},
])
def test_a_400_about_the_request_stays_the_requests_fault(fake_llm, body):
    fake_llm.push(Status(400, body=body))
    with pytest.raises(ProviderResponseError) as caught:
        chat(fake_llm).complete("llama3.1", MESSAGES)
    assert not isinstance(caught.value, providers.ProviderConfigurationError)


@pytest.mark.parametrize("code", [402, "401"])
def test_no_credit_inside_a_200_is_a_configuration_error(fake_llm, code):
    fake_llm.push(Raw({"error": {"code": code, "message": "Insufficient credits"}}))
    with pytest.raises(providers.ProviderConfigurationError) as caught:
        chat(fake_llm).complete("m", MESSAGES)
    assert caught.value.status == int(code)


def test_unavailable_carries_the_status_and_the_retry_after_hint(fake_llm):
    fake_llm.push(Status(429, retry_after=120))
    with pytest.raises(ProviderUnavailable) as caught:
        chat(fake_llm, max_retries=0).complete("m", MESSAGES)
    assert (caught.value.status, caught.value.retry_after) == (429, 120.0)


@pytest.mark.parametrize("behaviour, message", [
    (Malformed(), "not JSON"),
    (Malformed("<html>502 Bad Gateway</html>"), "not JSON"),
    (Malformed(["a", "list"]), "not a JSON object"),
    (Malformed({"id": "x", "object": "chat.completion"}), "choices"),
    (Malformed({"choices": []}), "choices"),
    (Malformed({"choices": "nope"}), "choices"),
    (Malformed({"choices": [{"index": 0}]}), "choices"),
    (Malformed(completion_body(None)), "content"),
    (Malformed(completion_body(42)), "content"),
    (Malformed({"choices": [{"message": None}]}), "content"),
], ids=["text", "html", "array", "no-choices", "empty-choices", "choices-str", "no-message", "null-content",
        "number-content", "null-message"])
def test_malformed_completions_raise_response_error_without_retry(fake_llm, behaviour, message):
    fake_llm.push(behaviour)
    with pytest.raises(ProviderResponseError, match=message):
        chat(fake_llm, max_retries=3).complete("m", MESSAGES)
    assert fake_llm.calls == 1


@pytest.mark.parametrize("code", [502, 429, 408, "503"])
def test_an_upstream_error_inside_a_200_is_unavailable(fake_llm, code):
    # OpenRouter answers 200 with {"error": ...} when the model fails after the request was accepted
    fake_llm.push(Raw({"error": {"code": code, "message": "upstream model is down"}}))
    with pytest.raises(ProviderUnavailable, match="upstream model is down"):
        chat(fake_llm).complete("m", MESSAGES)


def test_a_client_error_inside_a_200_is_a_response_error(fake_llm):
    fake_llm.push(Raw({"error": {"code": 400, "message": "invalid prompt"}}))
    with pytest.raises(ProviderResponseError, match="invalid prompt"):
        chat(fake_llm).complete("m", MESSAGES)


# --- Retry-After parsing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("header, expected", [
    (None, None), ("", None), ("3", 3.0), ("0.5", 0.5), ("-4", 0.0), ("soon", None), ("inf", None), ("nan", None),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past: retry now
])
def test_retry_after_parsing(header, expected):
    headers = {} if header is None else {"Retry-After": header}
    assert _retry_after(httpx.Response(429, headers=headers)) == expected


def test_retry_after_future_date():
    value = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= _retry_after(httpx.Response(503, headers={"Retry-After": value})) <= 30


def test_post_json_is_usable_directly(fake_llm):
    with httpx.Client() as client:
        body = post_json(client, f"{fake_llm.url}/chat/completions", {"model": "m", "messages": MESSAGES},
                         headers={}, timeout=2, max_retries=0, deadline=None, what="direct")
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "fake reply"


# --- embeddings -------------------------------------------------------------------------------------------

def test_embed_sends_the_voyage_request_and_returns_vectors(fake_voyage):
    texts = ["I love hiking in the mountains", "我喜欢吃火锅"]
    result = voyage(fake_voyage).embed(texts, "document")

    assert result.model == "voyage-3.5-lite" and result.offline is False
    assert [len(v) for v in result.vectors] == [EMBED_DIM, EMBED_DIM]
    assert result.vectors == [pytest.approx(hash_embed(t)) for t in texts]
    assert result.usage["total_tokens"] > 0

    [request] = fake_voyage.requests
    assert request["path"] == "/v1/embeddings"
    assert request["json"] == {"input": texts, "model": "voyage-3.5-lite", "input_type": "document",
                               "output_dimension": 512}
    assert request["headers"]["authorization"] == "Bearer pa-test"


@pytest.mark.parametrize("input_type", ["query", "document"])
def test_input_type_is_sent(fake_voyage, input_type):
    voyage(fake_voyage).embed(["x"], input_type)
    assert fake_voyage.requests[0]["json"]["input_type"] == input_type
    assert fake_voyage.requests[0]["json"]["output_dimension"] == EMBED_DIM


def test_embeddings_are_batched_in_order(fake_voyage):
    texts = [f"memory number {i} about topic {i % 7}" for i in range(2 * MAX_BATCH + 3)]
    result = voyage(fake_voyage).embed(texts, "document")

    assert [len(r["json"]["input"]) for r in fake_voyage.requests] == [MAX_BATCH, MAX_BATCH, 3]
    assert [t for r in fake_voyage.requests for t in r["json"]["input"]] == texts
    assert len(result.vectors) == len(texts)
    for text, vector in zip(texts, result.vectors, strict=True):
        assert vector == pytest.approx(hash_embed(text))
    per_batch = [sum(max(1, math.ceil(len(t) / 4)) for t in r["json"]["input"]) for r in fake_voyage.requests]
    assert result.usage == {"total_tokens": sum(per_batch)}


def test_exactly_one_batch(fake_voyage):
    voyage(fake_voyage).embed(["t"] * MAX_BATCH, "query")
    assert fake_voyage.calls == 1


def test_nothing_to_embed_makes_no_request(fake_voyage):
    result = voyage(fake_voyage).embed([], "document")
    assert result.vectors == [] and fake_voyage.calls == 0


def test_a_failing_batch_is_retried_and_order_kept(fake_voyage):
    texts = [f"text {i}" for i in range(MAX_BATCH + 5)]
    client = voyage(fake_voyage)
    # the first batch goes through, the second meets a 429 and then succeeds
    fake_voyage.push(Delay(0))  # first batch: a normal answer
    fake_voyage.push(Status(429, retry_after=0))
    result = client.embed(texts, "document")
    assert fake_voyage.calls == 3
    assert [len(r["json"]["input"]) for r in fake_voyage.requests] == [MAX_BATCH, 5, 5]
    for text, vector in zip(texts, result.vectors, strict=True):
        assert vector == pytest.approx(hash_embed(text))


def test_out_of_order_items_are_put_back_in_input_order(fake_voyage):
    texts = ["alpha", "beta", "gamma"]
    data = [{"object": "embedding", "embedding": hash_embed(t), "index": i} for i, t in enumerate(texts)]
    fake_voyage.push(Raw({"object": "list", "data": data[::-1], "model": "voyage-3.5-lite",
                          "usage": {"total_tokens": 3}}))
    result = voyage(fake_voyage).embed(texts, "query")
    assert result.vectors == [pytest.approx(hash_embed(t)) for t in texts]
    assert result.usage == {"total_tokens": 3}


def _voyage_body(vectors, indices=None) -> dict:
    indices = list(range(len(vectors))) if indices is None else indices
    return {"object": "list", "model": "voyage-3.5-lite", "usage": {"total_tokens": 1},
            "data": [{"object": "embedding", "embedding": v, "index": i}
                     for v, i in zip(vectors, indices, strict=True)]}


GOOD = [0.0] * (EMBED_DIM - 1) + [1.0]


@pytest.mark.parametrize("behaviour, message", [
    (Malformed(), "not JSON"),
    (Malformed([1, 2]), "not a JSON object"),
    (Malformed({"object": "list"}), "expected 2 items"),
    (Malformed({"data": "oops"}), "expected 2 items"),
    (Malformed(_voyage_body([GOOD])), "expected 2 items"),
    (Malformed(_voyage_body([GOOD, GOOD, GOOD])), "expected 2 items"),
    (Malformed(_voyage_body([[0.1] * 3, [0.1] * 3])), "dimensional"),
    (Malformed(_voyage_body([GOOD, [0.1] * 1024])), "dimensional"),
    (Malformed(_voyage_body([GOOD, GOOD], indices=[0, 0])), "indices"),
    (Malformed(_voyage_body([GOOD, GOOD], indices=[1, 2])), "indices"),
    (Malformed({"data": [{"embedding": GOOD}, {"embedding": GOOD}]}), "malformed"),
    (Malformed(_voyage_body([GOOD, "not a vector"])), "malformed"),
    (Malformed(_voyage_body([GOOD, [None] * EMBED_DIM])), "malformed"),
    (Malformed(_voyage_body([GOOD, GOOD], indices=["0", 1])), "malformed"),
], ids=["text", "array", "no-data", "data-str", "too-few", "too-many", "3-d", "1024-d", "dup-index",
        "bad-index", "no-index", "vector-str", "null-floats", "str-index"])
def test_malformed_embeddings_raise_response_error_without_retry(fake_voyage, behaviour, message):
    fake_voyage.push(behaviour)
    with pytest.raises(ProviderResponseError, match=message):
        voyage(fake_voyage, max_retries=3).embed(["one", "two"], "document")
    assert fake_voyage.calls == 1


def test_non_finite_vectors_are_rejected(fake_voyage):
    vector = ", ".join(["0.0"] * (EMBED_DIM - 1) + ["NaN"])
    fake_voyage.push(Raw('{"data": [{"embedding": [' + vector + '], "index": 0}]}'))
    with pytest.raises(ProviderResponseError, match="non-finite"):
        voyage(fake_voyage).embed(["x"], "query")


def test_embedding_client_errors_are_not_retried(fake_voyage):
    fake_voyage.push(Status(400, body={"detail": "input_type is invalid"}))
    with pytest.raises(ProviderResponseError, match="input_type is invalid"):
        voyage(fake_voyage).embed(["x"], "query")
    assert fake_voyage.calls == 1


def test_embeddings_retry_exhaustion(fake_voyage):
    fake_voyage.push(*[Status(500, retry_after=0)] * 2)
    with pytest.raises(ProviderUnavailable, match="500"):
        voyage(fake_voyage, max_retries=1).embed(["x"], "query")
    assert fake_voyage.calls == 2


def test_similarity_survives_the_round_trip(fake_voyage):
    client = voyage(fake_voyage)
    [query] = client.embed(["does she like hiking?"], "query").vectors
    related, unrelated = client.embed(["she loves hiking in the mountains", "the tax report is due friday"],
                                      "document").vectors
    assert cosine(query, related) > cosine(query, unrelated)


# --- the fakes themselves ---------------------------------------------------------------------------------

def test_fake_routes_and_methods(fake_voyage):
    with httpx.Client() as client:
        wrong_path = client.post(f"{fake_voyage.url}/chat/completions", json={})
        wrong_method = client.get(f"{fake_voyage.url}/embeddings")
        bad_json = client.post(f"{fake_voyage.url}/embeddings", content=b"{nope",
                               headers={"Content-Type": "application/json"})
        no_dimension = client.post(f"{fake_voyage.url}/embeddings", json={"input": "x", "model": "v"})
    assert (wrong_path.status_code, wrong_method.status_code, bad_json.status_code) == (404, 405, 400)
    assert len(no_dimension.json()["data"][0]["embedding"]) == 1024  # Voyage's default, not 512
    assert no_dimension.headers["content-length"] == str(len(no_dimension.content))
    assert fake_voyage.calls == 4


def test_fake_rejects_behaviours_it_cannot_perform(fake_voyage):
    with pytest.raises(TypeError):
        fake_voyage.push(Reply("embeddings have no text"))


@pytest.mark.integration
def test_fake_close_is_quick_even_with_a_pending_delay_and_an_idle_connection():
    fake = FakeOpenRouter()
    client = chat(fake)
    client.complete("m", MESSAGES)  # leaves an idle keep-alive connection open
    fake.push(Delay(30))

    errors: list[BaseException] = []

    def call():
        try:
            chat(fake, timeout=30, max_retries=0).complete("m", MESSAGES)
        except BaseException as exc:  # noqa: BLE001 - record whatever the client saw
            errors.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    while fake.pending:
        time.sleep(0.01)
    started = time.monotonic()
    fake.close()
    fake.close()  # idempotent
    worker.join(5)
    assert time.monotonic() - started < 3
    assert not worker.is_alive()
    assert errors and isinstance(errors[0], ProviderUnavailable)


# --- offline providers ------------------------------------------------------------------------------------

def test_hashing_embedder_is_deterministic_unit_norm_and_marked_offline():
    embedder = HashingEmbedder()
    texts = ["I love hiking", "我喜欢吃火锅", "", "the and of"]
    first = embedder.embed(texts, "document")
    second = embedder.embed(texts, "query")
    assert first.vectors == second.vectors
    assert first.offline is True and first.model.startswith("offline/")
    for vector in first.vectors:
        assert len(vector) == EMBED_DIM
        assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-9)
    assert "OFFLINE" in embedder.describe()


@pytest.mark.parametrize("anchor, near, far", [
    ("I love hiking in the mountains", "hiking mountains every weekend", "the quarterly tax report is due"),
    ("She adopted two cats last spring", "her cats are called Mochi and Tofu", "he drives a red truck to work"),
    ("我喜欢吃火锅", "她最喜欢火锅了", "明天要下雨"),
    ("妈妈一直催我结婚", "她妈妈催婚很厉害", "我在上海工作"),
], ids=["en-hiking", "en-cats", "zh-hotpot", "zh-marriage"])
def test_hashing_embedder_ranks_word_overlap_higher(anchor, near, far):
    a, n, f = HashingEmbedder().embed([anchor, near, far], "document").vectors
    assert cosine(a, n) > cosine(a, f)
    assert cosine(a, n) > 0.1
    assert cosine(a, a) == pytest.approx(1.0)


def test_hash_embed_folds_case_and_plurals_and_ignores_stop_words():
    assert hash_embed("HIKING") == hash_embed("hiking")
    assert hash_embed("the hiking") == hash_embed("hiking")
    assert hash_embed("bridges") == hash_embed("bridge")


def test_offline_chat_is_deterministic_and_marked():
    model = OfflineChat()
    messages = [{"role": "system", "content": "Known:\n- lives in Shanghai\n- has a cat"},
                {"role": "user", "content": "what do you remember?"}]
    first = model.complete("ignored/model", messages)
    second = model.complete("ignored/model", messages)
    assert first == second
    assert first.offline is True and first.model.startswith("offline/")
    assert "what do you remember?" in first.text
    assert "2 memory line" in first.text
    assert "OFFLINE" in model.describe()


# --- choosing real or offline providers -------------------------------------------------------------------

def test_no_keys_means_offline_providers(env):
    env()
    assert isinstance(providers.chat_client(), OfflineChat)
    assert isinstance(providers.embedder(), HashingEmbedder)
    described = providers.describe()
    assert "OFFLINE" in described["llm"] and "OFFLINE" in described["embedder"]
    assert providers.running_offline() == ["llm", "embedder"]


def test_a_key_and_base_url_give_the_real_chat_client(env, fake_llm):
    env(OPENROUTER_API_KEY="x", LLM_BASE_URL=fake_llm.url)
    client = providers.chat_client()
    assert isinstance(client, ChatClient)
    assert providers.chat_client() is client  # built once per container
    assert client.complete("m", MESSAGES).text == "fake reply"
    assert fake_llm.requests[0]["headers"]["authorization"] == "Bearer x"
    assert isinstance(providers.embedder(), HashingEmbedder)  # the embedder is configured separately
    assert fake_llm.url in providers.describe()["llm"]
    assert providers.running_offline() == ["embedder"]


def test_a_base_url_alone_gives_a_keyless_real_client(env, fake_llm, fake_voyage):
    env(LLM_BASE_URL=fake_llm.url, EMBED_BASE_URL=fake_voyage.url)
    assert providers.chat_client().complete("m", MESSAGES).text == "fake reply"
    assert providers.embedder().embed(["x"], "query").vectors == [pytest.approx(hash_embed("x"))]
    assert "authorization" not in fake_llm.requests[0]["headers"]
    assert "authorization" not in fake_voyage.requests[0]["headers"]
    assert providers.running_offline() == []


def test_a_key_alone_points_at_the_public_providers(env):
    env(OPENROUTER_API_KEY="x", VOYAGE_API_KEY="y")
    llm, emb = providers.chat_client(), providers.embedder()
    assert isinstance(llm, ChatClient) and llm.base_url == "https://openrouter.ai/api/v1"
    assert isinstance(emb, VoyageEmbedder) and emb.base_url == "https://api.voyageai.com/v1"


def test_settings_reach_the_real_clients(env, fake_voyage):
    env(VOYAGE_API_KEY="vk", EMBED_BASE_URL=fake_voyage.url + "/", EMBED_MODEL="voyage-3.5",
        EMBED_TIMEOUT_SECS="1.5", PROVIDER_MAX_RETRIES="0")
    emb = providers.embedder()
    assert (emb.model, emb.timeout, emb.max_retries) == ("voyage-3.5", 1.5, 0)
    fake_voyage.push(Status(503))
    with pytest.raises(ProviderUnavailable):
        emb.embed(["x"], "query")
    assert fake_voyage.calls == 1  # PROVIDER_MAX_RETRIES=0: no retry
    emb.embed(["x"], "query")
    request = fake_voyage.requests[-1]
    assert request["path"] == "/v1/embeddings"  # the trailing slash of the base URL is not doubled
    assert request["json"]["model"] == "voyage-3.5"
    assert request["headers"]["authorization"] == "Bearer vk"


def test_changing_the_environment_rebuilds_the_clients(env, fake_llm):
    env(LLM_BASE_URL=fake_llm.url)
    assert isinstance(providers.chat_client(), ChatClient)
    env(LLM_BASE_URL=None)
    assert isinstance(providers.chat_client(), OfflineChat)
