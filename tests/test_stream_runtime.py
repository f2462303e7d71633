"""The stream function's runtime loop (eros.stream_runtime) against a fake Lambda Runtime API on loopback
(tests/fake_runtime_api.py): the streaming response's wire format (its headers, the JSON prelude, the eight NUL
bytes, one HTTP chunk per body chunk, each sent as it is produced), init and invocation errors, an error in the
body mid-stream (Lambda's trailers), and a stream that breaks mid-way (the body is still finished: the turn stores
its reply). The last test runs the exec wrapper (functions/chat/stream-bootstrap) as Lambda would."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_runtime_api import FakeRuntimeApi
from helpers import ROOT

from eros import stream_runtime
from eros.stream_runtime import DELIMITER, PRELUDE_CONTENT_TYPE, RuntimeApi, invoke_once
from eros.streaming import STREAM_HEADERS, Streamed, sse

EVENT = {"version": "2.0", "rawPath": "/v1/sessions/s/turns/stream", "body": "{}"}


def prelude_and_body(response: dict) -> tuple[dict, bytes, list[bytes]]:
    """The prelude, the body after the eight NULs, and the body's HTTP chunks (the first chunk is the prelude's)."""
    first, *rest = [data for _, data in response["chunks"]]
    assert first.endswith(DELIMITER) and b"\0" not in first[:-8]
    return json.loads(first[:-8]), b"".join(rest), rest


@pytest.mark.integration
def test_a_streamed_answer_is_lambdas_streaming_response_each_chunk_sent_as_it_is_produced():
    produced: list[float] = []
    seen: dict = {}

    def handler(event, context):
        seen.update(event=event, request_id=context.aws_request_id, arn=context.invoked_function_arn,
                    remaining=context.get_remaining_time_in_millis(), trace=os.environ.get("_X_AMZN_TRACE_ID"))

        def body():
            produced.append(time.monotonic())
            yield sse("delta", {"delta": "Hel"})
            time.sleep(0.2)
            produced.append(time.monotonic())
            yield b""  # nothing to send: not the end of the body
            yield sse("delta", {"delta": "lo"})
            yield sse("done", {"reply": "Hello"})
        return Streamed(200, STREAM_HEADERS, body())

    with FakeRuntimeApi([EVENT]) as api:
        assert invoke_once(RuntimeApi(api.address), handler) is True
        [request_id] = api.request_ids
        api.wait(request_id)
        response = api.responses[request_id]

    assert seen["event"] == EVENT and seen["request_id"] == request_id
    assert seen["arn"].endswith(":function:stream") and 25_000 < seen["remaining"] <= 30_000
    assert seen["trace"].startswith("Root=1-")
    with FakeRuntimeApi([EVENT]) as api:  # an invocation without a trace id does not keep the previous one's
        api.trace_id = None
        invoke_once(RuntimeApi(api.address), handler)
    assert seen["trace"] is None
    headers = response["headers"]
    assert headers["content-type"] == PRELUDE_CONTENT_TYPE == "application/vnd.awslambda.http-integration-response"
    assert headers["lambda-runtime-function-response-mode"] == "streaming"
    assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    assert response["complete"] and response["trailers"] == {}
    prelude, body, chunks = prelude_and_body(response)
    assert prelude == {"statusCode": 200, "headers": STREAM_HEADERS, "cookies": []}
    assert chunks == [sse("delta", {"delta": "Hel"}), sse("delta", {"delta": "lo"}), sse("done", {"reply": "Hello"})]
    # The first delta reached Lambda before the model's pause ended, not with the rest at the end.
    first_arrived, second_arrived = response["chunks"][1][0], response["chunks"][2][0]
    assert first_arrived < produced[1] and second_arrived - first_arrived >= 0.15


@pytest.mark.integration
def test_an_answer_that_is_not_streamed_is_one_chunk_after_its_prelude():
    def handler(event, context):
        return Streamed.whole(401, {"Content-Type": "application/json"}, '{"code": "unauthorized"}')

    with FakeRuntimeApi([EVENT]) as api:
        assert invoke_once(RuntimeApi(api.address), handler)
        api.wait(api.request_ids[0])
        prelude, body, chunks = prelude_and_body(api.responses[api.request_ids[0]])
    assert prelude["statusCode"] == 401 and body == b'{"code": "unauthorized"}' and len(chunks) == 1


@pytest.mark.integration
def test_a_handler_that_raises_before_answering_is_an_invocation_error():
    def handler(event, context):
        raise ValueError("the event is not a function URL's")

    with FakeRuntimeApi([EVENT]) as api:
        assert invoke_once(RuntimeApi(api.address), handler) is False
        [request_id] = api.request_ids
        api.wait(request_id)
        assert request_id not in api.responses
        error = api.errors[request_id]
    assert error["headers"]["lambda-runtime-function-error-type"] == "Unhandled"
    assert error["json"]["errorType"] == "ValueError"
    assert error["json"]["errorMessage"] == "the event is not a function URL's"
    assert error["json"]["requestId"] == request_id
    assert any("raise ValueError" in line for line in error["json"]["stackTrace"])


@pytest.mark.integration
def test_a_body_that_fails_mid_stream_ends_with_lambdas_error_trailers():
    def handler(event, context):
        def body():
            yield b"event: delta\n"
            raise RuntimeError("a bug in the turn")
        return Streamed(200, STREAM_HEADERS, body())

    with FakeRuntimeApi([EVENT]) as api:
        invoke_once(RuntimeApi(api.address), handler)
        api.wait(api.request_ids[0])
        response = api.responses[api.request_ids[0]]
    assert response["headers"]["trailer"] == "Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body"
    assert response["complete"] and response["trailers"]["lambda-runtime-function-error-type"] == "RuntimeError"
    error = json.loads(base64.b64decode(response["trailers"]["lambda-runtime-function-error-body"]))
    assert (error["errorType"], error["errorMessage"]) == ("RuntimeError", "a bug in the turn")
    assert prelude_and_body(response)[1] == b"event: delta\n"


class Turn:
    """A streamed turn's body as eros.streaming specifies it: closed early, it finishes its work (stores the
    reply) before close() returns."""

    def __init__(self):
        self.sent: list[bytes] = []
        self.stored = False

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        if len(self.sent) == 50:
            self.stored = True
            raise StopIteration
        time.sleep(0.01)
        self.sent.append(b"event: delta\ndata: {\"delta\": \"word \"}\n\n")
        return self.sent[-1]

    def close(self) -> None:
        while len(self.sent) < 50:  # the model's remaining words, generated and kept
            self.sent.append(b"...")
        self.stored = True


@pytest.mark.integration
@pytest.mark.parametrize("closable", [True, False])
def test_a_stream_that_breaks_mid_way_still_finishes_the_body(closable):
    turn = Turn()
    drained = []

    def plain():  # an iterator without close(): read to its end
        yield from turn
        drained.append(True)

    def handler(event, context):
        return Streamed(200, STREAM_HEADERS, turn if closable else _no_close(plain()))

    with FakeRuntimeApi([EVENT]) as api:
        api.drop_after = 3  # the prelude and two deltas, then the connection is reset
        assert invoke_once(RuntimeApi(api.address), handler) is False
        received = len(api.responses[api.request_ids[0]]["chunks"])
    assert received == 3 and len(turn.sent) == 50 and turn.stored
    assert drained == ([] if closable else [True])


@pytest.mark.integration
def test_a_body_whose_close_fails_after_a_broken_stream_does_not_stop_the_runtime(capsys):
    class Failing:
        def __iter__(self):
            return self

        def __next__(self):
            time.sleep(0.01)
            return b"data: x\n\n"

        def close(self):
            raise RuntimeError("the turn could not be stored")

    with FakeRuntimeApi([EVENT, EVENT]) as api:
        api.drop_after = 2
        runtime = RuntimeApi(api.address)
        assert invoke_once(runtime, lambda event, context: Streamed(200, STREAM_HEADERS, Failing())) is False
        api.drop_after = None
        assert invoke_once(runtime, lambda event, context: Streamed.whole(200, {}, "next")) is True
    assert "the turn could not be stored" in capsys.readouterr().err


class _no_close:  # noqa: N801 -- an iterator that hides its generator's close()
    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.inner)


@pytest.mark.integration
def test_a_handler_that_cannot_be_loaded_is_an_init_error_and_the_runtime_exits(tmp_path, monkeypatch):
    (tmp_path / "broken_stream_handler.py").write_text("import not_a_module_anywhere\n")
    with FakeRuntimeApi([]) as api:
        environ = {"AWS_LAMBDA_RUNTIME_API": api.address, "_HANDLER": "broken_stream_handler.lambda_handler",
                   "LAMBDA_TASK_ROOT": str(tmp_path)}
        monkeypatch.setattr(sys, "path", list(sys.path))
        assert stream_runtime.main(environ) == 1
        api.wait()
        [error] = api.init_errors
    assert error["headers"]["lambda-runtime-function-error-type"] == "Runtime.ImportModuleError"
    assert error["json"]["errorType"] == "Runtime.ImportModuleError"
    assert "not_a_module_anywhere" in error["json"]["errorMessage"]


@pytest.mark.integration
def test_a_handler_name_without_a_function_is_an_init_error():
    with FakeRuntimeApi([]) as api:
        assert stream_runtime.main({"AWS_LAMBDA_RUNTIME_API": api.address, "_HANDLER": "stream"}) == 1
        api.wait()
    assert "module.function" in api.init_errors[0]["json"]["errorMessage"]


@pytest.mark.e2e  # git, a process
def test_the_exec_wrapper_is_executable_in_git_and_runs_our_loop_not_the_managed_one():
    wrapper = ROOT / "functions" / "chat" / "stream-bootstrap"
    assert wrapper.stat().st_mode & stat.S_IXUSR
    listed = subprocess.run(["git", "ls-files", "-s", str(wrapper)], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    assert listed.startswith("100755 "), "git must keep it executable (a clone, sam build, the zip)"
    text = wrapper.read_text()
    assert text.startswith("#!/bin/sh\n") and "exec python3 -m eros.stream_runtime" in text
    assert '"$@"' not in text  # the managed bootstrap it is handed is not run


HANDLER_MODULE = '''
import time
from eros.streaming import Streamed, sse

def lambda_handler(event, context):
    def body():
        yield sse("turn", {"client_turn_id": "t1", "request": context.aws_request_id})
        time.sleep(0.2)
        yield sse("done", {"reply": event["body"]})
    return Streamed(200, {"Content-Type": "text/event-stream"}, body())
'''


@pytest.mark.e2e
def test_the_wrapper_serves_invocations_as_lambda_runs_it(tmp_path):
    """Lambda runs the wrapper with the managed bootstrap as its arguments, in an environment of the Runtime API's
    address, the handler's name and the task root; two invocations are served by one process (the handler is
    imported once)."""
    (tmp_path / "stream.py").write_text(HANDLER_MODULE)
    events = [EVENT | {"body": "first"}, EVENT | {"body": "second"}]
    with FakeRuntimeApi(events) as api:
        env = {**os.environ, "AWS_LAMBDA_RUNTIME_API": api.address, "_HANDLER": "stream.lambda_handler",
               "LAMBDA_TASK_ROOT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               "AWS_LAMBDA_FUNCTION_NAME": "eros-stream"}
        process = subprocess.Popen([str(ROOT / "functions" / "chat" / "stream-bootstrap"), "/var/runtime/bootstrap"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            for request_id in api.request_ids:
                api.wait(request_id, timeout=30)
        finally:
            process.kill()
            process.communicate()
        answers = [prelude_and_body(api.responses[rid]) for rid in api.request_ids]
        arrivals = [[at for at, _ in api.responses[rid]["chunks"]] for rid in api.request_ids]
    for (prelude, _, chunks), request_id, event, times in zip(answers, api.request_ids, events, arrivals, strict=True):
        assert prelude == {"statusCode": 200, "headers": {"Content-Type": "text/event-stream"}, "cookies": []}
        assert chunks == [sse("turn", {"client_turn_id": "t1", "request": request_id}),
                          sse("done", {"reply": event["body"]})]
        assert times[2] - times[1] >= 0.15  # the first event did not wait for the second


@pytest.mark.e2e
def test_sam_build_and_its_zip_keep_the_wrapper_executable(tmp_path):
    """Lambda execs the wrapper: in the built function and in the zip `sam deploy` uploads, it must keep its mode.
    The stream function alone is built (its CodeUri and handler from template.yaml; the layer is another test's)."""
    import zipfile

    import yaml
    from samcli.lib.package.utils import make_zip_with_lambda_permissions  # type: ignore[import-untyped]
    from test_template import CfnLoader

    function = yaml.load((ROOT / "template.yaml").read_text(), Loader=CfnLoader)["Resources"]["ChatStreamFunction"]
    wrapper = function["Properties"]["Environment"]["Variables"]["AWS_LAMBDA_EXEC_WRAPPER"].removeprefix("/var/task/")
    (tmp_path / "template.yaml").write_text(yaml.safe_dump({
        "AWSTemplateFormatVersion": "2010-09-09", "Transform": "AWS::Serverless-2016-10-31",
        "Resources": {"ChatStreamFunction": {"Type": "AWS::Serverless::Function", "Properties": {
            "Runtime": "python3.12", "Handler": function["Properties"]["Handler"],
            "CodeUri": str(ROOT / function["Properties"]["CodeUri"])}}}}))
    venv_bin = Path(sys.executable).parent  # sam looks for python3.12 on PATH: the virtualenv's is one
    build = subprocess.run([str(venv_bin / "sam"), "build", "--template", str(tmp_path / "template.yaml"),
                            "--build-dir", str(tmp_path / "build")], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}",
                                "SAM_CLI_TELEMETRY": "0"}, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    built = tmp_path / "build" / "ChatStreamFunction"
    assert (built / wrapper).stat().st_mode & 0o111 == 0o111
    archive = make_zip_with_lambda_permissions(str(tmp_path / "artifact"), str(built))
    with zipfile.ZipFile(archive) as zipped:
        mode = zipped.getinfo(wrapper).external_attr >> 16
    assert stat.S_ISREG(mode) and mode & 0o111 == 0o111


@pytest.mark.e2e
def test_the_wrapper_runs_the_real_stream_function_from_its_task_root(db):
    """The chat function's folder as Lambda's task root, the wrapper and our loop in their own process, the real
    handler (functions/chat/stream.py and the app, routes and models beside it) on the function URL sample: the
    turn's events streamed through the Runtime API and the turn stored. No JWT_ISSUER: the claims are where the
    local dev server puts them (tests/test_events.py runs the in-function token check on the same path)."""
    from test_events import seed_session_of_the_sample_events

    from eros.streaming import events

    sample = seed_session_of_the_sample_events(db)
    event = json.loads((ROOT / "events" / "chat_stream_turn.json").read_text())
    event["requestContext"]["authorizer"] = {"jwt": {"claims": {"sub": sample["user_id"]}, "scopes": None}}
    with FakeRuntimeApi([event]) as api:
        env = {**os.environ, "AWS_LAMBDA_RUNTIME_API": api.address, "_HANDLER": "stream.lambda_handler",
               "LAMBDA_TASK_ROOT": str(ROOT / "functions" / "chat"), "AWS_LAMBDA_FUNCTION_NAME": "eros-stream",
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        env.pop("JWT_ISSUER", None)
        process = subprocess.Popen([str(ROOT / "functions" / "chat" / "stream-bootstrap"), "/var/runtime/bootstrap"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            api.wait(api.request_ids[0], timeout=60)
        finally:
            process.kill()
            _, stderr = process.communicate()
        response = api.responses.get(api.request_ids[0]) or {}
    assert response.get("complete"), (api.errors, stderr.decode()[-3000:])
    prelude, body, _ = prelude_and_body(response)
    assert prelude["statusCode"] == 200 and prelude["headers"]["Content-Type"].startswith("text/event-stream")
    sent = list(events(body))
    assert sent[0][0] == "turn" and sent[-1][0] == "done" and sent[-1][1]["reply"]
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages").fetchone()["n"] == 2
