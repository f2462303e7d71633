"""A completion streamed over the OpenAI-compatible wire (``ChatClient.stream``, issue 31): Server-Sent Events as
OpenRouter, Ollama and vLLM send them, from a fake server on loopback. Its start is retried as a completion's is;
once a piece has come, a failure is the reader's, with what was streamed counted."""
from __future__ import annotations

import pytest
from fakes import BreakStream, Disconnect, Raw, Status

from eros.providers import ModelNotFound, ProviderResponseError, ProviderTimeout, ProviderUnavailable
from eros.providers.llm import ChatClient
from eros.providers.offline import OfflineChat

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "system", "content": "You are Mira."}, {"role": "user", "content": "hello there"}]


def client(fake, *, max_retries: int = 2, timeout: float = 2.0) -> ChatClient:
    return ChatClient(fake.url, "sk-test", timeout=timeout, max_retries=max_retries)


def sse(*lines: str) -> bytes:
    return "".join(f"{line}\n\n" for line in lines).encode()


def chunk(content: str | None = None, **extra) -> str:
    import json

    body = {"model": "served/model", "choices": [{"index": 0, "delta": {} if content is None else {"content": content},
                                                  "finish_reason": extra.pop("finish", None)}]} | extra
    return "data: " + json.dumps(body)


def test_the_pieces_come_as_the_model_writes_them_and_the_completion_is_their_whole(fake_llm):
    fake_llm.responder = lambda request: "Hello there, friend."
    stream = client(fake_llm).stream("m", MESSAGES, max_tokens=50, temperature=0.1)
    assert stream.completion is None
    pieces = list(stream)
    assert pieces == ["Hello ", "there, ", "friend."]
    assert stream.completion.text == "Hello there, friend." and stream.completion.model == "m"
    assert stream.completion.usage["completion_tokens"] > 0 and stream.completion.usage == stream.paid()
    [request] = fake_llm.requests
    assert request["json"] == {"model": "m", "messages": MESSAGES, "max_tokens": 50, "temperature": 0.1,
                               "stream": True, "stream_options": {"include_usage": True}}


def test_comments_roles_and_servers_without_a_usage_chunk(fake_llm):
    """OpenRouter's keep-alive comments are skipped; a server that sends no usage (older vLLM) is estimated."""
    fake_llm.push(Raw(sse(": OPENROUTER PROCESSING", chunk(""), chunk("Olá "), chunk("你好"),
                          chunk(None, finish="stop"), "data: [DONE]"), headers={"Content-Type": "text/event-stream"}))
    stream = client(fake_llm).stream("m", MESSAGES)
    assert list(stream) == ["Olá ", "你好"]
    completion = stream.completion
    assert completion.text == "Olá 你好" and completion.model == "served/model"
    assert completion.usage["completion_tokens"] == 3 and completion.usage["prompt_tokens"] > 0


def test_a_failure_before_the_first_piece_is_retried_as_a_completions_is(fake_llm, skipped_sleeps):
    fake_llm.push(Status(503), Disconnect())
    assert "".join(client(fake_llm).stream("m", MESSAGES)) == "fake reply"
    assert fake_llm.calls == 3


def test_a_refused_start_is_not_retried_and_keeps_its_kind(fake_llm):
    fake_llm.served = {"llama3.1"}
    with pytest.raises(ModelNotFound):
        list(client(fake_llm).stream("claude", MESSAGES))
    fake_llm.push(Status(400))
    with pytest.raises(ProviderResponseError):
        list(client(fake_llm).stream("llama3.1", MESSAGES))
    assert fake_llm.calls == 2


@pytest.mark.parametrize("failure", [BreakStream(after=2), BreakStream(after=2, error={"code": 400, "message": "x"})])
def test_a_failure_mid_stream_is_raised_to_the_reader_never_retried_and_what_was_streamed_is_paid(fake_llm, failure):
    fake_llm.responder = lambda request: "one two three four"
    fake_llm.push(failure)
    stream, read = client(fake_llm).stream("m", MESSAGES), []
    with pytest.raises(ProviderUnavailable):
        for piece in stream:
            read.append(piece)
    assert read == ["one ", "two "] and stream.completion is None and fake_llm.calls == 1
    assert stream.paid()["completion_tokens"] == 2  # "one two " estimated: the server sent no usage before it broke


@pytest.mark.parametrize("body", [sse(chunk("half"), "data: {not json"), sse(chunk("half"), "data: [1, 2]")],
                         ids=["not JSON", "not an object"])
def test_a_malformed_chunk_is_a_response_error(fake_llm, body):
    fake_llm.push(Raw(body, headers={"Content-Type": "text/event-stream"}))
    with pytest.raises(ProviderResponseError):
        list(client(fake_llm).stream("m", MESSAGES))


def test_a_stream_that_ends_before_the_answer_does_is_unavailable(fake_llm):
    fake_llm.push(Raw(sse(chunk("cut "), chunk("off")), headers={"Content-Type": "text/event-stream"}))
    with pytest.raises(ProviderUnavailable, match="ended before the answer did"):
        list(client(fake_llm).stream("m", MESSAGES))


def test_a_stream_slower_than_its_budget_times_out(fake_llm):
    from eros.providers import Deadline

    fake_llm.responder = lambda request: "a b c d e f g h"
    fake_llm.first_token_delay, fake_llm.token_interval = 0.0, 0.2
    with pytest.raises(ProviderTimeout):
        list(client(fake_llm).stream("m", MESSAGES, deadline=Deadline.after(0.5)))


def test_the_offline_model_streams_its_answer_a_word_at_a_time():
    model = OfflineChat()
    model.stream_interval = 0
    stream = model.stream("offline/echo", MESSAGES)
    pieces = list(stream)
    assert len(pieces) > 5 and "".join(pieces) == model.complete("offline/echo", MESSAGES).text
    assert stream.completion.offline and stream.completion.usage == model.complete("offline/echo", MESSAGES).usage
