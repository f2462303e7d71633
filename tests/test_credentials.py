"""Secrets Manager resolution (moto): provider keys from PROVIDER_SECRET_ARN, the database conninfo from an
RDS-style secret, and DATABASE_URL winning locally."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import boto3
import certifi
import psycopg
import pytest
from aws_lambda_powertools.utilities import parameters
from moto import mock_aws
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import SecretStr

from eros import providers
from eros.config import Settings
from eros.credentials import (
    ConfigurationError,
    app_database_login,
    complete_app_secret,
    database_dsn,
    with_provider_keys,
)
from eros.providers.llm import ChatClient

RDS_SECRET = {"engine": "postgres", "host": "eros.cluster-abc.us-east-1.rds.amazonaws.com", "port": 5432,
              "username": "eros_app", "password": "s3cr3t!", "dbname": "eros", "dbClusterIdentifier": "eros"}


@functools.cache
def _shared_client():
    """One Secrets Manager client for the module's tests (a client is ~20 ms to make). It is only used inside
    ``mock_aws``, whose stub answers whichever client asks; the mock's state is reset when each test's ends."""
    return boto3.client("secretsmanager", region_name="us-east-1")


@pytest.fixture
def secretsmanager():
    """A moto Secrets Manager, empty at the start of every test. Powertools' cached providers are dropped
    around the test (so no value leaks between tests), and its secrets provider starts with the shared
    client instead of making a boto3 session and client of its own (~45 ms); a test that drops the caches
    itself (a new container) gets a provider of Powertools' own making."""
    with mock_aws():
        client = _shared_client()
        parameters.clear_caches()
        parameters.base.DEFAULT_PROVIDERS["secrets"] = parameters.SecretsProvider(boto3_client=client)

        def create(name: str, value) -> str:
            text = value if isinstance(value, str) else json.dumps(value)
            return client.create_secret(Name=name, SecretString=text)["ARN"]

        client.create = create
        yield client
    parameters.clear_caches()


def settings_from(**env) -> Settings:
    return Settings.from_env({key: str(value) for key, value in env.items()})


# --- provider keys ----------------------------------------------------------------------------------------

def test_provider_keys_come_from_the_secret(secretsmanager):
    arn = secretsmanager.create("eros/providers", {"OPENROUTER_API_KEY": "sk-or-1", "VOYAGE_API_KEY": "pa-1"})
    base = settings_from(PROVIDER_SECRET_ARN=arn)
    resolved = with_provider_keys(base)

    assert resolved.openrouter_api_key.get_secret_value() == "sk-or-1"
    assert resolved.voyage_api_key.get_secret_value() == "pa-1"
    assert resolved.llm_online and resolved.embed_online
    assert "sk-or-1" not in repr(resolved)  # still SecretStr: never printed
    assert base.openrouter_api_key is None  # the cached settings are not mutated


def test_lower_case_names_are_accepted(secretsmanager):
    arn = secretsmanager.create("eros/providers", {"openrouter_api_key": "sk-lower", "voyage_api_key": "pa-lower"})
    resolved = with_provider_keys(settings_from(PROVIDER_SECRET_ARN=arn))
    assert resolved.openrouter_api_key.get_secret_value() == "sk-lower"
    assert resolved.voyage_api_key.get_secret_value() == "pa-lower"


def test_a_key_missing_from_the_secret_keeps_the_environment_value(secretsmanager):
    arn = secretsmanager.create("eros/providers", {"OPENROUTER_API_KEY": "sk-from-secret", "VOYAGE_API_KEY": ""})
    resolved = with_provider_keys(settings_from(PROVIDER_SECRET_ARN=arn, OPENROUTER_API_KEY="sk-from-env",
                                                VOYAGE_API_KEY="pa-from-env"))
    assert resolved.openrouter_api_key.get_secret_value() == "sk-from-secret"
    assert resolved.voyage_api_key.get_secret_value() == "pa-from-env"


def test_an_empty_provider_secret_leaves_the_providers_offline(secretsmanager):
    arn = secretsmanager.create("eros/providers", {})
    resolved = with_provider_keys(settings_from(PROVIDER_SECRET_ARN=arn))
    assert resolved.openrouter_api_key is None and resolved.voyage_api_key is None
    assert not resolved.llm_online and not resolved.embed_online


def test_without_a_provider_secret_nothing_is_fetched():
    base = settings_from(OPENROUTER_API_KEY="sk-env")
    # no mock_aws here: any Secrets Manager call would fail (no endpoint, fake credentials)
    assert with_provider_keys(base) is base


def test_the_secret_is_cached_per_container(secretsmanager):
    arn = secretsmanager.create("eros/providers", {"OPENROUTER_API_KEY": "first"})
    settings = settings_from(PROVIDER_SECRET_ARN=arn)
    assert with_provider_keys(settings).openrouter_api_key.get_secret_value() == "first"

    secretsmanager.put_secret_value(SecretId=arn, SecretString=json.dumps({"OPENROUTER_API_KEY": "rotated"}))
    assert with_provider_keys(settings).openrouter_api_key.get_secret_value() == "first"  # warm: cached
    parameters.clear_caches()
    assert with_provider_keys(settings).openrouter_api_key.get_secret_value() == "rotated"


@pytest.mark.parametrize("value, message", [
    ("OPENROUTER_API_KEY=sk-1", "not valid JSON"),
    ('["sk-1"]', "not a JSON object"),
    ('"sk-1"', "not a JSON object"),
])
def test_a_malformed_provider_secret_is_a_configuration_error(secretsmanager, value, message):
    arn = secretsmanager.create("eros/providers", value)
    with pytest.raises(ConfigurationError, match=message) as caught:
        with_provider_keys(settings_from(PROVIDER_SECRET_ARN=arn))
    assert arn in str(caught.value)
    assert "sk-1" not in str(caught.value)  # the secret's text is never echoed


def test_a_missing_secret_fails_loudly(secretsmanager):
    with pytest.raises(parameters.exceptions.GetParameterError, match="ResourceNotFound"):
        with_provider_keys(settings_from(PROVIDER_SECRET_ARN="arn:aws:secretsmanager:us-east-1:123456789012:"
                                                            "secret:eros/nope-AbCdEf"))


def test_chat_client_uses_the_key_from_the_secret(secretsmanager, env, fake_llm):
    arn = secretsmanager.create("eros/providers", {"OPENROUTER_API_KEY": "sk-from-secrets-manager"})
    env(PROVIDER_SECRET_ARN=arn, LLM_BASE_URL=fake_llm.url)
    client = providers.chat_client()
    assert isinstance(client, ChatClient)
    client.complete("m", [{"role": "user", "content": "hi"}])
    assert fake_llm.requests[0]["headers"]["authorization"] == "Bearer sk-from-secrets-manager"


def test_a_deployment_never_falls_back_to_offline_providers(secretsmanager, env):
    """With a provider secret configured, a missing key is an error, not a silent switch to offline models."""
    arn = secretsmanager.create("eros/providers", {"VOYAGE_API_KEY": "pa-secret"})
    env(PROVIDER_SECRET_ARN=arn)
    assert "voyage" in providers.embedder().describe()
    with pytest.raises(ConfigurationError, match="OPENROUTER_API_KEY"):
        providers.chat_client()


# --- the database conninfo --------------------------------------------------------------------------------

def test_database_dsn_from_an_rds_secret(secretsmanager):
    arn = secretsmanager.create("eros/db", RDS_SECRET)
    dsn = database_dsn(settings_from(DATABASE_SECRET_ARN=arn))
    assert conninfo_to_dict(dsn) == {"host": RDS_SECRET["host"], "port": "5432", "user": "eros_app",
                                     "password": "s3cr3t!", "dbname": "eros", "sslmode": "verify-full",
                                     "sslrootcert": certifi.where()}


def test_database_host_overrides_the_secret_host(secretsmanager):
    arn = secretsmanager.create("eros/db", RDS_SECRET)
    proxy = "eros-proxy.proxy-abc.us-east-1.rds.amazonaws.com"
    parts = conninfo_to_dict(database_dsn(settings_from(DATABASE_SECRET_ARN=arn, DATABASE_HOST=proxy)))
    assert parts["host"] == proxy
    assert parts["user"] == "eros_app" and parts["password"] == "s3cr3t!"


def test_an_rds_managed_secret_with_only_credentials_needs_database_host(secretsmanager):
    # RDS-managed master secrets hold just {username, password}: the host comes from DATABASE_HOST
    arn = secretsmanager.create("rds!db-123", {"username": "postgres", "password": "pw"})
    parts = conninfo_to_dict(database_dsn(settings_from(DATABASE_SECRET_ARN=arn, DATABASE_HOST="db.internal")))
    assert parts == {"host": "db.internal", "port": "5432", "user": "postgres", "password": "pw",
                     "dbname": "postgres", "sslmode": "verify-full", "sslrootcert": certifi.where()}
    with pytest.raises(ConfigurationError, match="'host'"):
        database_dsn(settings_from(DATABASE_SECRET_ARN=arn))


def test_awkward_passwords_survive_the_conninfo(secretsmanager):
    password = "p@ss word 'quoted' \\back= slash;%"
    arn = secretsmanager.create("eros/db", dict(RDS_SECRET, password=password, port="6432"))
    parts = conninfo_to_dict(database_dsn(settings_from(DATABASE_SECRET_ARN=arn)))
    assert parts["password"] == password
    assert parts["port"] == "6432"


@pytest.mark.parametrize("field", ["username", "password", "host"])
def test_a_missing_field_is_a_configuration_error(secretsmanager, field):
    secret = {k: v for k, v in RDS_SECRET.items() if k != field}
    arn = secretsmanager.create("eros/db", secret)
    with pytest.raises(ConfigurationError, match=f"lacks '{field}'"):
        database_dsn(settings_from(DATABASE_SECRET_ARN=arn))


@pytest.mark.parametrize("empty", [None, ""])
def test_a_null_or_empty_password_is_missing_too(secretsmanager, empty):
    arn = secretsmanager.create("eros/db", dict(RDS_SECRET, password=empty))
    with pytest.raises(ConfigurationError, match="lacks 'password'"):
        database_dsn(settings_from(DATABASE_SECRET_ARN=arn))


def test_every_missing_field_is_named(secretsmanager):
    arn = secretsmanager.create("eros/db", {"engine": "postgres"})
    with pytest.raises(ConfigurationError, match="lacks 'host', 'username', 'password'"):
        database_dsn(settings_from(DATABASE_SECRET_ARN=arn))


@pytest.mark.parametrize("value, message", [
    ("host=db user=eros password=hunter2", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
])
def test_a_malformed_database_secret_is_a_configuration_error(secretsmanager, value, message):
    arn = secretsmanager.create("eros/db", value)
    with pytest.raises(ConfigurationError, match=message) as caught:
        database_dsn(settings_from(DATABASE_SECRET_ARN=arn))
    assert "hunter2" not in str(caught.value)


def test_nothing_configured_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="no database configured"):
        database_dsn(settings_from())


def test_database_url_wins_locally(secretsmanager):
    url = "postgresql://eros:pw@127.0.0.1:5433/eros"
    # the ARN does not exist: resolving it would raise, so passing proves it is never read
    settings = settings_from(DATABASE_URL=url, DATABASE_SECRET_ARN="arn:aws:secretsmanager:us-east-1:"
                                                                 "123456789012:secret:absent-AbCdEf",
                             DATABASE_HOST="ignored.example")
    assert database_dsn(settings) == url
    assert isinstance(settings.database_url, SecretStr) and url not in repr(settings)


def test_the_database_secret_is_cached_too(secretsmanager):
    arn = secretsmanager.create("eros/db", RDS_SECRET)
    settings = settings_from(DATABASE_SECRET_ARN=arn)
    first = database_dsn(settings)
    secretsmanager.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    assert database_dsn(settings) == first  # a warm container makes no Secrets Manager call


# --- TLS: the server's certificate and host name are verified ------------------------------------------------

def test_the_default_trust_store_holds_the_roots_of_rds_proxys_certificate(secretsmanager):
    """RDS Proxy presents an ACM certificate: it chains to an Amazon root, which certifi's bundle carries."""
    arn = secretsmanager.create("eros/db", RDS_SECRET)
    parts = conninfo_to_dict(database_dsn(settings_from(DATABASE_SECRET_ARN=arn)))
    assert parts["sslmode"] == "verify-full"
    bundle = Path(parts["sslrootcert"]).read_text(encoding="utf-8")
    for root in ("Amazon Root CA 1", "Amazon Root CA 2", "Amazon Root CA 3", "Amazon Root CA 4",
                 "Starfield Services Root Certificate Authority - G2"):
        assert f"# Subject: CN={root} O=" in bundle, root


def test_the_bundled_libpq_understands_sslrootcert_system():
    # sslrootcert=system needs libpq 16; what psycopg's wheel bundles decides whether it is an option
    assert psycopg.pq.version() >= 160000


@pytest.mark.parametrize("value", ["system", "certs/rds-global-bundle.pem", "/abs/rds-global-bundle.pem"])
def test_the_ca_bundle_is_a_setting(secretsmanager, tmp_path, monkeypatch, value):
    from importlib import resources

    arn = secretsmanager.create("eros/db", RDS_SECRET)
    if value.startswith("/"):
        value = str(tmp_path / "rds-global-bundle.pem")
        open(value, "w").close()
        expected = value
    elif value != "system":  # relative: a file shipped in the layer, next to the eros package
        package = tmp_path / "eros"
        (package / "certs").mkdir(parents=True)
        (package / value).write_text("")
        monkeypatch.setattr(resources, "files", lambda name: package)
        expected = str(package / value)
    else:
        expected = "system"
    parts = conninfo_to_dict(database_dsn(settings_from(DATABASE_SECRET_ARN=arn, DATABASE_SSL_ROOT_CERT=value)))
    assert (parts["sslmode"], parts["sslrootcert"]) == ("verify-full", expected)


def test_a_missing_ca_bundle_is_a_configuration_error(secretsmanager):
    arn = secretsmanager.create("eros/db", RDS_SECRET)
    with pytest.raises(ConfigurationError, match="no CA bundle at /nowhere/bundle.pem"):
        database_dsn(settings_from(DATABASE_SECRET_ARN=arn, DATABASE_SSL_ROOT_CERT="/nowhere/bundle.pem"))


@pytest.mark.integration
def test_verify_full_refuses_a_server_that_does_not_speak_tls():
    """No silent fallback to plain text: a listener that will not do TLS is refused before any login."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def refuse_tls():  # what a Postgres with ssl=off answers to the SSLRequest: 'N'
        conn, _ = listener.accept()
        conn.recv(8)
        conn.sendall(b"N")
        conn.recv(1024)
        conn.close()

    threading.Thread(target=refuse_tls, daemon=True).start()
    dsn = make_conninfo(host="127.0.0.1", port=str(listener.getsockname()[1]), user="eros", password="pw",
                        dbname="eros", sslmode="verify-full", sslrootcert=certifi.where(), connect_timeout="3")
    with pytest.raises(psycopg.OperationalError, match="(?i)ssl"):
        psycopg.connect(dsn)
    listener.close()


# --- the application's login (the migrate function makes it; the app functions use it) ---------------------

def test_the_app_login_comes_from_its_own_secret(secretsmanager):
    arn = secretsmanager.create("eros/app-db", {"username": "eros_app_login", "password": "generated-pw"})
    assert app_database_login(settings_from(APP_DATABASE_SECRET_ARN=arn)) == ("eros_app_login", "generated-pw")
    assert app_database_login(settings_from()) is None  # locally: nothing to create


@pytest.mark.parametrize("secret, message", [
    ({"username": "eros_app_login"}, "lacks 'password'"),
    ({"password": "pw"}, "lacks 'username'"),
    ({"username": "Robert'); DROP TABLE x;--", "password": "pw"}, "not allowed"),
    ({"username": "postgres", "password": "pw"}, "not allowed"),
    ({"username": "rdsadmin", "password": "pw"}, "not allowed"),
    ({"username": "eros_app", "password": "pw"}, "not allowed"),  # the group role itself
])
def test_a_bad_app_login_is_a_configuration_error(secretsmanager, secret, message):
    arn = secretsmanager.create("eros/app-db", secret)
    with pytest.raises(ConfigurationError, match=message) as caught:
        app_database_login(settings_from(APP_DATABASE_SECRET_ARN=arn))
    assert "pw" not in str(caught.value).replace("'password'", "")


def test_the_app_secret_is_completed_with_where_to_connect(secretsmanager):
    arn = secretsmanager.create("eros/app-db", {"username": "eros_app_login", "password": "generated-pw"})
    settings = settings_from(APP_DATABASE_SECRET_ARN=arn)
    admin = make_conninfo(host="eros-proxy.proxy-abc.us-east-1.rds.amazonaws.com", port="5432",
                          user="postgres", password="admin-pw", dbname="eros", sslmode="verify-full")
    assert complete_app_secret(settings, admin) is True
    stored = json.loads(secretsmanager.get_secret_value(SecretId=arn)["SecretString"])
    assert stored == {"username": "eros_app_login", "password": "generated-pw", "engine": "postgres",
                      "host": "eros-proxy.proxy-abc.us-east-1.rds.amazonaws.com", "port": 5432, "dbname": "eros"}
    parameters.clear_caches()
    assert complete_app_secret(settings, admin) is False  # already complete: no new version

    # and the app functions connect from it alone, as the app user
    parts = conninfo_to_dict(database_dsn(settings_from(DATABASE_SECRET_ARN=arn)))
    assert (parts["user"], parts["password"], parts["host"], parts["dbname"]) == (
        "eros_app_login", "generated-pw", "eros-proxy.proxy-abc.us-east-1.rds.amazonaws.com", "eros")


class TlsPostgresStandIn:
    """Speaks the start of the Postgres protocol over TLS: answers the SSLRequest with 'S', does the TLS
    handshake with a certificate for "localhost" signed by its own CA, and answers the startup message
    with a FATAL "tls-ok". A client that gets "tls-ok" back accepted the certificate."""

    def __init__(self, tmp_path):
        import datetime
        import socket
        import ssl
        import threading

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.UTC)

        def cert(subject, key, issuer, issuer_key, *, ca):
            def name(common_name):
                return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

            builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                       .public_key(key.public_key()).serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(hours=1))
                       .not_valid_after(now + datetime.timedelta(hours=1))
                       .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
            if not ca:
                builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]),
                                                critical=False)
            else:
                builder = builder.add_extension(x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False,
                    decipher_only=False), critical=True)
            return builder.sign(issuer_key, hashes.SHA256())

        ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca = cert("eros test CA", ca_key, "eros test CA", ca_key, ca=True)
        server = cert("localhost", server_key, "eros test CA", ca_key, ca=False)
        self.ca_file = tmp_path / "test-ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        chain, key = tmp_path / "server.pem", tmp_path / "server.key"
        chain.write_bytes(server.public_bytes(serialization.Encoding.PEM))
        key.write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(chain, key)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        import struct

        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            try:
                conn.settimeout(5)
                conn.recv(8)  # SSLRequest
                conn.sendall(b"S")
                tls = self.context.wrap_socket(conn, server_side=True)
                tls.recv(4096)  # the startup message
                fields = b"SFATAL\x00VFATAL\x00C28000\x00Mtls-ok\x00\x00"
                tls.sendall(b"E" + struct.pack("!I", len(fields) + 4) + fields)
                tls.close()
            except Exception:  # noqa: BLE001 - a client that rejected the certificate hangs up mid-handshake
                conn.close()

    def close(self):
        self.listener.close()


@pytest.fixture
def tls_server(tmp_path):
    server = TlsPostgresStandIn(tmp_path)
    yield server
    server.close()


def _connect(dsn: str) -> str:
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(dsn, connect_timeout=5)
    return str(caught.value)


@pytest.mark.integration
def test_verify_full_accepts_a_server_certificate_from_the_configured_ca(secretsmanager, tls_server):
    arn = secretsmanager.create("eros/db", dict(RDS_SECRET, host="localhost", port=tls_server.port))
    dsn = database_dsn(settings_from(DATABASE_SECRET_ARN=arn, DATABASE_SSL_ROOT_CERT=str(tls_server.ca_file)))
    assert "tls-ok" in _connect(dsn)  # through the handshake to the startup answer


@pytest.mark.integration
def test_verify_full_refuses_a_certificate_of_an_unknown_ca(secretsmanager, tls_server):
    arn = secretsmanager.create("eros/db", dict(RDS_SECRET, host="localhost", port=tls_server.port))
    error = _connect(database_dsn(settings_from(DATABASE_SECRET_ARN=arn)))  # the default bundle: not this CA
    assert "certificate verify failed" in error and "tls-ok" not in error
    # what sslmode=require (the old setting, with no root certificate) accepted from the same server:
    assert "tls-ok" in _connect(make_conninfo(host="localhost", port=str(tls_server.port), user="eros",
                                              password="pw", dbname="eros", sslmode="require"))


@pytest.mark.integration
def test_verify_full_refuses_a_certificate_for_another_host(secretsmanager, tls_server):
    arn = secretsmanager.create("eros/db", dict(RDS_SECRET, host="127.0.0.1", port=tls_server.port))
    settings = settings_from(DATABASE_SECRET_ARN=arn, DATABASE_SSL_ROOT_CERT=str(tls_server.ca_file))
    error = _connect(database_dsn(settings))
    assert "does not match host name" in error and "tls-ok" not in error


@pytest.mark.integration
def test_system_means_the_bundle_ssl_cert_file_names(secretsmanager, tls_server, monkeypatch):
    """psycopg's wheel bundles its own OpenSSL, whose default store is absent on Lambda: "system" verifies
    against SSL_CERT_FILE (docs/DEPLOY.md says so)."""
    arn = secretsmanager.create("eros/db", dict(RDS_SECRET, host="localhost", port=tls_server.port))
    dsn = database_dsn(settings_from(DATABASE_SECRET_ARN=arn, DATABASE_SSL_ROOT_CERT="system"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.ca_file))
    assert "tls-ok" in _connect(dsn)


def test_an_empty_provider_secret_is_a_clear_503_and_holds_dreaming(secretsmanager, env, db):
    """The secret a fresh stack makes has empty keys: a turn is a 503 `provider_not_configured` naming no secret
    (never a 500), the user's message is kept, /v1/health says which key is missing, and dreaming holds the session
    without counting an attempt against it."""
    from apiclient import Api
    from helpers import go_idle

    from eros_dev.dreaming import sweep_locally

    arn = secretsmanager.create("eros/providers", {"OPENROUTER_API_KEY": "", "VOYAGE_API_KEY": ""})
    env(PROVIDER_SECRET_ARN=arn)
    api = Api()
    sid = api.session()
    status, body = api.call("POST", f"/v1/sessions/{sid}/turns", {"content": "hello"})
    assert status == 503 and body["code"] == "provider_not_configured" and body["retryable"] is False, body
    assert "provider keys" in body["message"] and arn not in json.dumps(body)
    assert db.execute("SELECT count(*) AS n FROM engine.chat_messages WHERE session_id = %s", (sid,)).fetchone()[
        "n"] == 1
    status, health = api.call("GET", "/v1/health", user=None)
    assert status == 503 and "OPENROUTER_API_KEY" in health["providers"]["error"]
    status, body = api.call("POST", f"/v1/sessions/{sid}/context", {"content": "hi"})
    assert status == 503 and body["code"] == "provider_not_configured"
    go_idle(db)
    sweep_locally()
    row = db.execute("SELECT extracted_at, extraction_attempts FROM engine.chat_sessions WHERE id = %s",
                     (sid,)).fetchone()
    assert row == {"extracted_at": None, "extraction_attempts": 0}
    assert db.execute("SELECT count(*) AS n FROM engine.provider_blocks").fetchone()["n"] == 1


# --- the RDS CA bundle of a direct connection (the starter profile: no RDS Proxy) ------------------------------

@pytest.fixture
def trust_store(tmp_path, monkeypatch):
    """A loopback stand-in for AWS's RDS trust store; the bundle lands in a fresh temporary directory."""
    import http.server
    import threading

    from eros import credentials

    served: list[str] = []
    answer = {"status": 200, "body": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            served.append(self.path)
            body = answer["body"].encode()
            self.send_response(answer["status"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(credentials, "RDS_CA_BUNDLE_URL",
                        f"http://127.0.0.1:{server.server_port}/{{region}}/{{region}}-bundle.pem")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    yield served, answer
    server.shutdown()
    server.server_close()


@pytest.mark.integration
def test_rds_means_the_regions_rds_bundle_fetched_once_per_container(secretsmanager, trust_store, tmp_path):
    served, answer = trust_store
    arn = secretsmanager.create("eros/db", RDS_SECRET)
    cfg = settings_from(DATABASE_SECRET_ARN=arn, DATABASE_SSL_ROOT_CERT="rds")
    parts = conninfo_to_dict(database_dsn(cfg))
    assert (parts["sslmode"], parts["sslrootcert"]) == ("verify-full", str(tmp_path / "rds-ca-eu-west-3.pem"))
    assert Path(parts["sslrootcert"]).read_text() == answer["body"]
    assert conninfo_to_dict(database_dsn(cfg))["sslrootcert"] == parts["sslrootcert"]
    assert served == ["/eu-west-3/eu-west-3-bundle.pem"]  # once: the second connection reads the file


@pytest.mark.integration
@pytest.mark.parametrize("status, body", [(503, "busy"), (200, "<html>not a bundle</html>")])
def test_a_failed_fetch_of_the_rds_bundle_is_the_database_unreachable(secretsmanager, trust_store, tmp_path,
                                                                       status, body):
    _, answer = trust_store
    answer.update(status=status, body=body)
    arn = secretsmanager.create("eros/db", RDS_SECRET)
    with pytest.raises(psycopg.OperationalError, match="RDS CA bundle|PEM certificate bundle"):
        database_dsn(settings_from(DATABASE_SECRET_ARN=arn, DATABASE_SSL_ROOT_CERT="rds"))
    assert list(tmp_path.iterdir()) == []  # nothing half-written is taken for the bundle next time


@pytest.mark.integration
def test_the_rds_bundle_needs_the_region(secretsmanager, trust_store, monkeypatch):
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    arn = secretsmanager.create("eros/db", RDS_SECRET)
    with pytest.raises(ConfigurationError, match="needs AWS_REGION"):
        database_dsn(settings_from(DATABASE_SECRET_ARN=arn, DATABASE_SSL_ROOT_CERT="rds"))
