"""Schema-driven fuzz of the HTTP API (issue 8, evidence for items 6 and 7): every operation of
/v1/openapi.json, with requests that schemathesis generates from the document itself, valid ones
(positive) and invalid ones (negative: wrong types, out-of-range numbers, unknown fields, odd text),
sent through the real handler as API Gateway events with a valid token. The fakes stand in for OpenRouter
and Voyage and count their calls.

What must hold for every request: no 5xx, and a refused request (any 4xx) reached neither the chat model
nor the embedder. Path ids are sometimes the caller's real session or memory (so turns, history, restore
and deletion are fuzzed past the 404), sometimes what the generator made.

Bounded so that it stays fast: FUZZ_EXAMPLES examples per operation and mode (default 25), derandomised
(the same cases every run, so CI is stable); FUZZ_RANDOM=1 explores new cases, and a larger FUZZ_EXAMPLES
searches longer. FUZZ_REPORT=path appends, per operation and mode, how many requests were sent and their
statuses (one JSON line each; bench/results/api_fuzz.md is such a run).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from urllib.parse import urlencode, urlsplit

import jsonschema_rs
import pytest
import schemathesis
from apiclient import Api
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pgvector import Vector
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from eros.providers.offline import hash_embed
from eros_dev.lambda_runtime import LambdaContext, load_function
from eros_dev.server import http_api_event

pytestmark = pytest.mark.e2e

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
DOCUMENT = json.loads(load_function("chat").health.openapi_document())
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
OPERATIONS = {f"{op.method.upper()} {op.path}": op
              for op in (r.ok() for r in SCHEMA.get_all_operations() if isinstance(r, Ok))}
# Negative cases need something to get wrong: a parameter or a body.
CASES = [(name, mode) for name, op in OPERATIONS.items()
         for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
         if mode is GenerationMode.POSITIVE
         or {"parameters", "requestBody"} & set(DOCUMENT["paths"][op.path][op.method])]


@pytest.fixture
def world(db, env, fake_llm, fake_voyage, tmp_path):
    """Online providers (the fakes), alice's session with one turn, a superseded memory to restore, and a
    folder for exports (as the local stack has)."""
    env(LLM_BASE_URL=fake_llm.url, OPENROUTER_API_KEY="x", EMBED_BASE_URL=fake_voyage.url, VOYAGE_API_KEY="x",
        PROVIDER_MAX_RETRIES=0, EXPORT_DIR=str(tmp_path), EXPORT_BASE_URL="http://127.0.0.1:9/local")
    api = Api()
    session = api.session()
    assert api.call("POST", f"/v1/sessions/{session}/turns", {"content": "I grow tomatoes"})[0] == 200
    old, new = (db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category)"
                           " VALUES ('alice', %s, %s, 'fact') RETURNING id", (text, Vector(hash_embed(text))))
                .fetchone()["id"] for text in ("lives in Lisbon", "lives in Porto"))
    db.execute("UPDATE engine.companion_memories SET superseded_at = now(), superseded_by = %s,"
               " superseded_reason = 'changed' WHERE id = %s", (new, old))
    memories = [str(r["id"]) for r in db.execute("SELECT id FROM engine.companion_memories").fetchall()]
    return api, {"session_id": [session], "memory_id": memories}, fake_llm, fake_voyage


def send(api: Api, case, path_parameters: dict) -> tuple[int, str, dict]:
    """The case as the API Gateway event AWS would send (a valid token for alice); (status, body, request)."""
    case.path_parameters = {**(case.path_parameters or {}), **path_parameters}
    request = case.as_transport_kwargs(base_url="http://api.example")
    url = urlsplit(request["url"])
    params = request.get("params") or {}
    target = url.path + ("?" + urlencode(params, doseq=True) if params else "")
    if "json" in request:
        body = json.dumps(request["json"]).encode()
    else:
        data = request.get("data") or b""
        body = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    headers = {str(k): str(v) for k, v in (request.get("headers") or {}).items()}
    event = http_api_event(request["method"], target, headers, body, {"sub": "alice", "iss": "test", "aud": "test"})
    result = api.function.lambda_handler(event, LambdaContext("chat"))
    return result["statusCode"], result.get("body") or "", {"method": request["method"], "target": target,
                                                            "body": body[:300]}


@pytest.mark.parametrize("operation,mode", CASES, ids=[f"{name} {mode.value}" for name, mode in CASES])
def test_no_input_gives_a_5xx_and_a_refused_request_costs_no_provider_call(world, operation, mode):
    api, real_ids, llm, embedder = world
    op = OPERATIONS[operation]
    own_ids = st.fixed_dictionaries({name: st.sampled_from(values) for name, values in real_ids.items()
                                     if "{" + name + "}" in op.path})

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not os.environ.get("FUZZ_RANDOM"),
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(mode), use_own_ids=st.booleans(), ids=own_ids)
    def request(case, use_own_ids, ids):
        calls = (llm.calls, embedder.calls)
        status, body, sent = send(api, case, ids if use_own_ids else {})
        statuses.append(status)
        assert status < 500, f"{status} for {sent}: {body[:500]}"
        if status >= 400:
            assert (llm.calls, embedder.calls) == calls, f"{status} after a provider call for {sent}: {body[:300]}"
            answer = json.loads(body)
            assert answer["statusCode"] == status and answer["code"] and answer["message"], answer
            if status == 422:  # the body the document describes, exactly
                jsonschema_rs.validate(DOCUMENT["paths"][op.path][op.method]["responses"]["422"]["content"][
                    "application/json"]["schema"], answer)

    statuses: list[int] = []
    try:
        request()
    finally:
        if os.environ.get("FUZZ_REPORT"):
            with open(os.environ["FUZZ_REPORT"], "a") as report:
                report.write(json.dumps({"operation": operation, "mode": mode.value, "requests": len(statuses),
                                         "statuses": dict(Counter(map(str, sorted(statuses))))}) + "\n")
    if mode is GenerationMode.POSITIVE and operation in ("POST /v1/sessions/{session_id}/turns",
                                                         "GET /v1/sessions/{session_id}/messages", "GET /v1/memories"):
        assert 200 in statuses, f"the fuzz never got past validation: {sorted(set(statuses))}"
