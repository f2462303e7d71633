"""Secrets Manager resolution (moto): provider keys from PROVIDER_SECRET_ARN, the database conninfo from an
RDS-style secret, and DATABASE_URL winning locally."""

from __future__ import annotations

import json

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
from eros.providers.llm import ChatClient
from eros.secrets import (ConfigurationError, app_database_login, complete_app_secret, database_dsn,
                          with_provider_keys)
from fakes import fake_llm  # noqa: F401 - fixture

RDS_SECRET = {"engine": "postgres", "host": "eros.cluster-abc.us-east-1.rds.amazonaws.com", "port": 5432,
              "username": "eros_app", "password": "s3cr3t!", "dbname": "eros", "dbClusterIdentifier": "eros"}


@pytest.fixture
def secretsmanager():
    """A moto Secrets Manager; Powertools' cached provider (and its boto3 client) is dropped around the test,
    so the client is created inside the mock and no value leaks between tests."""
    parameters.clear_caches()
    with mock_aws():
        client = boto3.client("secretsmanager", region_name="us-east-1")

        def create(name: str, value) -> str:
            text = value if isinstance(value, str) else json.dumps(value)
            return client.create_secret(Name=name, SecretString=text)["ARN"]

        client.create = create  # type: ignore[attr-defined]
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
    bundle = open(parts["sslrootcert"], encoding="utf-8").read()
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
