"""The stream function's own token check (eros.auth.stream_claims): behind a function URL there is no JWT authorizer,
so the function makes the HTTP API authorizer's checks itself, against a fake OIDC issuer on loopback that serves
its JWKS (keys made here with ``cryptography``). Every forged, stale, misdirected or garbled token is refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from eros import auth
from eros.auth import IssuerUnavailable, stream_claims

pytestmark = pytest.mark.integration

AUDIENCE = "app-client-1"


class FakeIssuer:
    """An OIDC issuer on loopback. With ``discovery`` (Okta-like) its discovery document names its key set at
    ``{url}/keys``; without, it has none and the key set is at ``{url}/.well-known/jwks.json`` (Cognito's place).
    The key set is the public half of ``keys`` (kid -> private key); ``fetches`` counts its downloads."""

    def __init__(self, discovery: bool = True):
        self.keys = {"key-1": rsa.generate_private_key(public_exponent=65537, key_size=2048)}
        self.fetches = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                keys_path = "/pool-1/keys" if discovery else "/pool-1/.well-known/jwks.json"
                if discovery and self.path == "/pool-1/.well-known/openid-configuration":
                    return self._json({"issuer": issuer.url, "jwks_uri": issuer.url + "/keys"})
                if self.path != keys_path:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                issuer.fetches += 1
                self._json({"keys": [
                    {**jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True), "kid": kid,
                     "alg": "RS256", "use": "sig"} for kid, key in issuer.keys.items()]})

            def _json(self, document: dict):
                body = json.dumps(document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pool-1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, kid: str = "key-1", key=None, **claims) -> str:
        now = int(time.time())
        body = {"sub": "alice", "iss": self.url, "aud": AUDIENCE, "iat": now, "exp": now + 600} | claims
        return jwt.encode({k: v for k, v in body.items() if v is not None}, key or self.keys[kid],
                          algorithm="RS256", headers={"kid": kid})

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(params=[True, False], ids=["discovery", "cognito-path"])
def issuer(env, request):
    fake = FakeIssuer(discovery=request.param)
    env(JWT_ISSUER=fake.url, JWT_AUDIENCE=f"other-app, {AUDIENCE}")
    auth.reset()
    yield fake
    auth.reset()
    fake.close()


def event(authorization: str | None) -> dict:
    headers = {"content-type": "application/json"} | ({"authorization": authorization} if authorization else {})
    return {"version": "2.0", "headers": headers, "requestContext": {"http": {"method": "POST"}}}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_token_of_the_issuer_for_an_accepted_audience_is_the_callers_claims(issuer):
    claims = stream_claims(event(f"Bearer {issuer.token()}"))
    assert claims is not None and claims["sub"] == "alice" and claims["aud"] == AUDIENCE
    assert stream_claims(event(f"bearer   {issuer.token(sub='bob')}"))["sub"] == "bob"  # the scheme in any case
    # A list audience, and a Cognito access token (no aud: its client_id is the audience)
    assert stream_claims(event(f"Bearer {issuer.token(aud=['x', AUDIENCE])}")) is not None
    assert stream_claims(event(f"Bearer {issuer.token(aud=None, client_id=AUDIENCE, token_use='access')}"))
    assert issuer.fetches == 1  # the key set is fetched once per container


def test_a_token_of_another_issuer_or_for_another_audience_is_refused(issuer):
    assert stream_claims(event(f"Bearer {issuer.token(iss='https://cognito-idp.example.com/pool-2')}")) is None
    assert stream_claims(event(f"Bearer {issuer.token(iss=issuer.url + '/')}")) is None  # exactly the issuer
    assert stream_claims(event(f"Bearer {issuer.token(aud='someone-else')}")) is None
    assert stream_claims(event(f"Bearer {issuer.token(aud=None)}")) is None
    assert stream_claims(event(f"Bearer {issuer.token(aud=None, client_id='someone-else')}")) is None


def test_an_expired_or_not_yet_valid_token_is_refused_beyond_the_leeway(issuer):
    now = int(time.time())
    assert stream_claims(event(f"Bearer {issuer.token(exp=now - 120, iat=now - 700)}")) is None
    assert stream_claims(event(f"Bearer {issuer.token(exp=now - 5, iat=now - 700)}")) is not None  # clock skew
    assert stream_claims(event(f"Bearer {issuer.token(nbf=now + 300)}")) is None
    assert stream_claims(event(f"Bearer {issuer.token(iat=now + 300)}")) is None
    assert stream_claims(event(f"Bearer {issuer.token(exp=None)}")) is None  # a token that never expires
    assert stream_claims(event(f"Bearer {issuer.token(sub=None)}")) is None  # no user


def test_a_token_signed_with_another_key_is_refused(issuer):
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert stream_claims(event(f"Bearer {issuer.token(key=stranger)}")) is None  # the issuer's kid, not its key
    for _ in range(5):  # a kid it lacks; tokens naming unknown kids do not make the container fetch each time
        assert stream_claims(event(f"Bearer {issuer.token(kid='key-9', key=stranger)}")) is None
    assert issuer.fetches == 1  # PyJWKClient refetches for an unknown kid at most once in its cooldown (30 s)
    # ... and a rotation: a new key of the issuer is fetched when a token names it (once the cooldown has passed).
    issuer.keys["key-2"] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    auth.jwks_client(issuer.url).cooldown_duration = 0
    assert stream_claims(event(f"Bearer {issuer.token(kid='key-2')}"))["sub"] == "alice"


def test_alg_none_and_hmac_with_the_public_key_are_refused(issuer):
    now = int(time.time())
    claims = {"sub": "mallory", "iss": issuer.url, "aud": AUDIENCE, "iat": now, "exp": now + 600}
    payload = b64(json.dumps(claims).encode())
    unsigned = f"{b64(json.dumps({'alg': 'none', 'typ': 'JWT', 'kid': 'key-1'}).encode())}.{payload}."
    assert stream_claims(event(f"Bearer {unsigned}")) is None
    # The classic confusion: HS256 keyed with the issuer's public key (which anyone can fetch).
    public_pem = issuer.keys["key-1"].public_key().public_bytes(serialization.Encoding.PEM,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = f"{b64(json.dumps({'alg': 'HS256', 'typ': 'JWT', 'kid': 'key-1'}).encode())}.{payload}"
    signature = b64(hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest())
    assert stream_claims(event(f"Bearer {signing_input}.{signature}")) is None
    # RS256 in the header over the same forged body: a signature that is not the issuer's.
    forged = f"{b64(json.dumps({'alg': 'RS256', 'kid': 'key-1'}).encode())}.{payload}.{signature}"
    assert stream_claims(event(f"Bearer {forged}")) is None


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic YWxpY2U6c2VjcmV0", "eyJhbGciOi.x.y",
                                    "Bearer not-a-token", "Bearer a.b.c", "Bearer ....", "Bearer \u00e9\u00e9.x.y"])
def test_a_missing_or_garbled_header_is_refused(issuer, header):
    assert stream_claims(event(header)) is None


def test_the_header_is_found_in_any_case_and_odd_events_are_refused(issuer):
    good = issuer.token()
    assert stream_claims({"headers": {"Authorization": f"Bearer {good}"}}) is not None
    assert stream_claims({"headers": None}) is None and stream_claims({}) is None
    assert stream_claims({"headers": {"authorization": ["Bearer", good]}}) is None


def test_no_audience_configured_accepts_nothing(issuer, env):
    env(JWT_AUDIENCE=None)
    env(JWT_AUDIENCE=" , ")
    assert stream_claims(event(f"Bearer {issuer.token()}")) is None


def test_an_issuer_whose_keys_cannot_be_fetched_is_a_retryable_503_not_a_refusal(issuer, env):
    token = issuer.token()
    issuer.close()
    with pytest.raises(IssuerUnavailable) as raised:
        stream_claims(event(f"Bearer {token}"))
    assert (raised.value.status, raised.value.code, raised.value.extra) == (503, "auth_unavailable",
                                                                           {"retryable": True})


def test_without_jwt_issuer_the_local_dev_servers_verified_claims_are_the_answer(env):
    env(JWT_ISSUER=None)
    claims = {"sub": "alice", "iss": "http://127.0.0.1:3000/local", "aud": "eros-local"}
    verified = event("Bearer whatever-the-dev-server-checked")
    verified["requestContext"]["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
    assert stream_claims(verified) == claims
    assert stream_claims(event("Bearer x")) is None  # the dev server put no claims: not verified
    verified["requestContext"]["authorizer"]["jwt"]["claims"] = {"iss": "x"}
    assert stream_claims(verified) is None


def test_the_stream_function_answers_401_for_a_refused_token_and_503_when_the_keys_cannot_be_fetched(issuer):
    from eros_dev.lambda_runtime import LambdaContext, load_function

    handler = load_function("chat", entry="stream").lambda_handler
    turn = {"version": "2.0", "rawPath": "/v1/sessions/s-1/turns/stream", "body": "{}",
            "requestContext": {"http": {"method": "POST", "path": "/v1/sessions/s-1/turns/stream"}, "stage": "$default",
                               "requestId": "r-1"}}
    refused = handler(turn | {"headers": {"authorization": f"Bearer {issuer.token(aud='x')}"}}, LambdaContext("s"))
    assert (refused.status_code, json.loads(b"".join(refused.body))) == (401, {"message": "Unauthorized"})
    token = issuer.token()
    auth.reset()  # a new container: its first token makes it fetch the keys
    issuer.close()
    unavailable = handler(turn | {"headers": {"authorization": f"Bearer {token}"}}, LambdaContext("s"))
    assert unavailable.status_code == 503
    assert json.loads(b"".join(unavailable.body)) | {"message": ""} == {
        "statusCode": 503, "code": "auth_unavailable", "retryable": True, "message": ""}
