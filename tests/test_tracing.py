"""No content in X-Ray (issue 8, item 11): a chat turn, a history page, a memory listing and an extraction run
through the real handlers with a live X-Ray recorder; every entity it would send to the daemon is captured
and searched for the message, the reply and the memories. The annotations (ids, counts, outcomes) are there."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import aws_xray_sdk
import pytest
from apiclient import Api
from aws_xray_sdk.core import xray_recorder

from eros import tracing
from eros.dreaming import session
from eros.observability import tracer
from eros_dev.lambda_runtime import LambdaContext, load_function

SECRET = "my sister Ines-Quarzo is moving to Porto and I feel lost"


class Capture:
    """Stands in for the UDP emitter: keeps each entity as the JSON the daemon would receive."""

    def __init__(self):
        self.sent: list[str] = []

    def send_entity(self, entity) -> None:
        self.sent.append(entity.serialize())

    def set_daemon_address(self, address) -> None:
        pass


@pytest.fixture
def xray(monkeypatch):
    """Tracing on (tests/conftest.py turns it off) inside one sampled segment; yields the captured entities
    once the segment has ended."""
    monkeypatch.delenv("POWERTOOLS_TRACE_DISABLED", raising=False)
    monkeypatch.delenv("AWS_XRAY_SDK_ENABLED", raising=False)
    # The production path (importing the handlers) put the redacting emitter in place: only its sink changes.
    for name in ("chat", "extract", "sweeper"):
        load_function(name)
    assert isinstance(xray_recorder.emitter, tracing.RedactingEmitter)
    capture = Capture()
    monkeypatch.setattr(xray_recorder.emitter, "inner", capture)
    monkeypatch.setattr(tracer, "disabled", False)
    aws_xray_sdk.global_sdk_config.set_sdk_enabled(True)
    xray_recorder.clear_trace_entities()
    xray_recorder.begin_segment("eros-test", sampling=1)

    def finish() -> list[dict]:
        if xray_recorder.current_segment() is not None:
            xray_recorder.end_segment()
        return [json.loads(text) for text in capture.sent]

    try:
        yield finish
    finally:
        xray_recorder.clear_trace_entities()
        aws_xray_sdk.global_sdk_config.set_sdk_enabled(False)


def entities(entity: dict):
    yield entity
    for child in entity.get("subsegments", []):
        yield from entities(child)


def handler_annotations(sent: list[dict]) -> list[dict]:
    return [e.get("annotations", {}) for top in sent for e in entities(top) if e["name"] == "## lambda_handler"]


def assert_no_content(sent: list[dict], *texts: str) -> None:
    dump = json.dumps(sent, ensure_ascii=False)
    for text in texts:
        assert text and text not in dump, f"content in a trace: {text!r}"
    for top in sent:
        for entity in entities(top):
            metadata = json.dumps(entity.get("metadata", {}))
            assert "response" not in metadata and "error" not in metadata, entity["name"]


def test_a_chat_turn_history_page_and_memory_listing_leave_no_content_in_traces(db, xray):
    api = Api()
    sid = api.session()
    status, turn = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": SECRET})
    assert status == 200, turn
    status, page = api.call("GET", f"/v1/sessions/{sid}/messages")
    assert status == 200 and len(page["messages"]) == 2
    status, listing = api.call("GET", "/v1/memories")
    assert status == 200 and listing["memories"]
    sent = xray()

    assert sent, "nothing was traced: the test would prove nothing"
    assert_no_content(sent, SECRET, "Ines-Quarzo", turn["reply"], *[m["content"] for m in listing["memories"]])
    turn_note, page_note, listing_note = handler_annotations(sent)[-3:]
    assert turn_note["route"] == "/v1/sessions/{session_id}/turns" and turn_note["session_id"] == sid
    assert turn_note["recalled"] == len(turn["recalled"]) and turn_note["model"] == turn["model"]
    assert (turn_note["status_code"], turn_note["outcome"], turn_note["replayed"]) == (200, "ok", False)
    assert (page_note["route"], page_note["session_id"], page_note["items"]) == (
        "/v1/sessions/{session_id}/messages", sid, 2)
    assert (listing_note["route"], listing_note["items"]) == ("/v1/memories", len(listing["memories"]))
    # the use-case's own subsegment is there too, without its result
    assert any(e["name"].endswith("take_turn") and "metadata" not in e for top in sent for e in entities(top))


def test_an_extraction_leaves_no_content_in_traces(db, xray):
    from eros.store import dreaming as store

    api = Api()
    sid = api.session()
    assert api.call("POST", f"/v1/sessions/{sid}/turns", {"content": SECRET})[0] == 200
    db.execute("UPDATE engine.chat_sessions SET last_active_at = now() - interval '2 hours'")
    now = datetime.now(UTC)
    [row] = store.claim(now, now - timedelta(seconds=600), 10)
    result = load_function("extract").lambda_handler(session.event(row), LambdaContext("extract"))
    assert result["memories"] >= 1
    sent = xray()

    written = [r["content"] for r in db.execute("SELECT content FROM engine.companion_memories")]
    assert_no_content(sent, SECRET, "Ines-Quarzo", *written)
    note = handler_annotations(sent)[-1]
    assert (note["kind"], note["session_id"], note["outcome"]) == ("session", sid, result["outcome"])
    assert note["memories"] == result["memories"] and note["llm_calls"] == result["llm_calls"]


def test_a_failing_handler_records_the_error_type_not_its_message(db, xray):
    from pydantic import ValidationError

    event = {"session_id": SECRET, "user_id": "u", "instance_id": "x", "claim_token": "soon"}
    with pytest.raises(ValidationError):  # the message quotes the input
        load_function("extract").lambda_handler(event, LambdaContext("extract"))
    sent = xray()

    assert_no_content(sent, SECRET, "Ines-Quarzo")
    [handler] = [e for top in sent for e in entities(top) if e["name"] == "## lambda_handler"]
    assert handler["fault"] is True
    assert [x["type"] for x in handler["cause"]["exceptions"]] == ["ValidationError"]
    assert (handler["annotations"]["outcome"], handler["annotations"]["error_type"]) == ("error", "ValidationError")


def test_exception_messages_of_any_subsegment_are_dropped_before_they_leave(xray):
    """A patched client's subsegment (a database cursor, an HTTP call) records the exceptions that cross it."""
    with (pytest.raises(RuntimeError), xray_recorder.in_subsegment("## cursor"),
          xray_recorder.in_subsegment("## nested")):
        raise RuntimeError(f'duplicate key value\nDETAIL:  Key (content)=({SECRET}) already exists.')
    sent = xray()

    assert_no_content(sent, SECRET)
    # (a parent whose child recorded the same exception keeps only that record's id as its cause)
    recorded = [x for top in sent for e in entities(top) if isinstance(e.get("cause"), dict)
                for x in e["cause"].get("exceptions", [])]
    assert recorded and {x["type"] for x in recorded} == {"RuntimeError"}
    assert all("stack" in x for x in recorded)
