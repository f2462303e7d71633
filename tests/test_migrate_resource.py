"""The DatabaseMigration custom resource (functions/migrate/app.py), run in-process: it migrates a real
(embedded) Postgres and answers CloudFormation by PUTting the response document to a loopback server."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from eros_dev.lambda_runtime import LambdaContext, load_function

# A loopback recorder stands in for CloudFormation's response URL in every test.
pytestmark = pytest.mark.integration

RESPONSE_KEYS = {"Status", "Reason", "PhysicalResourceId", "StackId", "RequestId", "LogicalResourceId", "Data"}
STACK_ID = "arn:aws:cloudformation:us-east-1:123456789012:stack/eros-test/5b4f3a20-ff11-11ef-9c2d-0a1b2c3d4e5f"


class ResponseRecorder:
    """A loopback stand-in for CloudFormation's pre-signed response URL: records every request."""

    def __init__(self, status: int = 200):
        self.requests: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                recorder.requests.append({"method": self.command, "path": self.path,
                                          "headers": {k.lower(): v for k, v in self.headers.items()},
                                          "body": body})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_PUT = do_POST = do_GET = _record

            def log_message(self, format, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll: shutdown() waits for the serve loop to notice (0.5 s per test by default).
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01},
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/response?X-Amz-Signature=abc"

    def response(self) -> dict:
        assert len(self.requests) == 1, self.requests
        request = self.requests[0]
        assert request["method"] == "PUT"
        assert request["path"] == "/response?X-Amz-Signature=abc"
        return json.loads(request["body"])


@pytest.fixture
def cfn():
    recorder = ResponseRecorder()
    recorder.thread.start()
    yield recorder
    recorder.server.shutdown()
    recorder.server.server_close()


@pytest.fixture(scope="module")
def handler():
    return load_function("migrate").lambda_handler


@pytest.fixture
def fresh_database(database_url):
    """An empty database on the embedded server (the shared test database is migrated already)."""
    name = f"eros_migrate_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield make_conninfo(database_url, dbname=name)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cfn_event(request_type: str, response_url: str, **extra) -> dict:
    event = {
        "RequestType": request_type,
        "ResponseURL": response_url,
        "StackId": STACK_ID,
        "RequestId": str(uuid.uuid4()),
        "ResourceType": "Custom::DatabaseMigration",
        "LogicalResourceId": "DatabaseMigration",
        "ResourceProperties": {"ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:migrate",
                               "MigrationsVersion": "arn:aws:lambda:us-east-1:123456789012:layer:ErosLayer:3"},
    }
    event.update(extra)
    return event


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def applied_migrations(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM engine.schema_migrations ORDER BY name")]


def test_create_migrates_an_empty_database_and_reports_success(handler, cfn, fresh_database, env):
    from eros.migrate import function_files, migration_files

    env(DATABASE_URL=fresh_database)
    event = cfn_event("Create", cfn.url)
    result = handler(event, LambdaContext("migrate", timeout_secs=300))

    response = cfn.response()
    assert set(response) >= RESPONSE_KEYS
    assert response["Status"] == "SUCCESS" == result["Status"]
    assert response["StackId"] == STACK_ID
    assert response["RequestId"] == event["RequestId"]
    assert response["LogicalResourceId"] == "DatabaseMigration"
    assert response["PhysicalResourceId"] == "eros-test-DatabaseMigration"
    names = [name for name, _ in migration_files()]
    assert names and applied_migrations(fresh_database) == names
    applied = names + [name for name, _ in function_files()]  # then every function file (eros/sql/functions)
    assert response["Data"] == {"Applied": ",".join(applied), "AppliedCount": str(len(applied))}
    # The pre-signed URL is signed without a content type: none may be sent.
    assert cfn.requests[0]["headers"].get("content-type", "") == ""
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT count(*) FROM engine.personas").fetchone()[0] > 0


def test_update_is_a_no_op_on_an_up_to_date_schema_and_keeps_the_physical_id(handler, cfn, fresh_database, env):
    env(DATABASE_URL=fresh_database)
    first = ResponseRecorder()
    first.thread.start()
    try:
        handler(cfn_event("Create", first.url), LambdaContext("migrate", timeout_secs=300))
        created = first.response()["PhysicalResourceId"]
    finally:
        first.server.shutdown()
        first.server.server_close()
    before = applied_migrations(fresh_database)

    handler(cfn_event("Update", cfn.url, PhysicalResourceId=created,
                      OldResourceProperties={"MigrationsVersion": "arn:...:layer:ErosLayer:2"}),
            LambdaContext("migrate", timeout_secs=300))
    response = cfn.response()
    assert response["Status"] == "SUCCESS"
    assert response["PhysicalResourceId"] == created
    assert response["Data"] == {"Applied": "", "AppliedCount": "0"}
    assert "up to date" in response["Reason"]
    assert applied_migrations(fresh_database) == before


def test_an_edited_applied_migration_fails_the_deploy_and_names_the_file(handler, cfn, fresh_database, env,
                                                                         monkeypatch):
    """A migration changed after it was applied (eros.migrate records its SHA-256) fails the deploy before
    anything runs, and the stack's events say which file."""
    from eros import migrate as runner
    from eros.migrate import migrate, migration_files

    env(DATABASE_URL=fresh_database)
    migrate(fresh_database)
    edited = [(name, sql.replace("-- 0004", "-- 0004 (edited)", 1)) for name, sql in migration_files()]
    assert edited != migration_files()
    monkeypatch.setattr(runner, "migration_files", lambda: edited)
    result = handler(cfn_event("Update", cfn.url), LambdaContext("migrate", timeout_secs=300))
    response = cfn.response()
    assert response["Status"] == "FAILED" == result["Status"]
    assert response["Reason"].startswith("database migration failed: EditedMigration: applied migration"
                                         " 0004_consolidation.sql was edited since it was applied"), response["Reason"]


def test_an_unreachable_database_fails_cleanly_without_leaking_credentials(handler, cfn, env):
    password = "s3cret-Pa55word"
    env(DATABASE_URL=f"postgresql://eros:{password}@127.0.0.1:{closed_port()}/eros?connect_timeout=2")
    result = handler(cfn_event("Create", cfn.url), LambdaContext("migrate", timeout_secs=300))

    response = cfn.response()
    assert response["Status"] == "FAILED" == result["Status"]
    reason = response["Reason"]
    assert reason.startswith("database migration failed: OperationalError")
    assert password not in reason and "postgresql://" not in reason and "eros:" not in reason
    assert password not in cfn.requests[0]["body"].decode()
    assert response["Data"] == {}
    assert response["PhysicalResourceId"]  # CloudFormation needs one even for a failed create
    assert len(reason) <= 400


def test_a_missing_database_configuration_fails_with_the_configuration_error(handler, cfn, env):
    env(DATABASE_URL=None, DATABASE_SECRET_ARN=None)
    handler(cfn_event("Create", cfn.url), LambdaContext("migrate", timeout_secs=300))
    response = cfn.response()
    assert response["Status"] == "FAILED"
    assert "ConfigurationError" in response["Reason"] and "no database configured" in response["Reason"]


def test_a_conninfo_echoed_in_an_error_is_scrubbed(handler, cfn, env):
    # libpq repeats a malformed connection string in its error message: the password must not follow it.
    env(DATABASE_URL="host=127.0.0.1 password=hunter2-secret port=notaport dbname")
    handler(cfn_event("Create", cfn.url), LambdaContext("migrate", timeout_secs=300))
    response = cfn.response()
    assert response["Status"] == "FAILED"
    assert "hunter2-secret" not in json.dumps(response)


def test_a_migration_that_overruns_its_deadline_still_answers(handler, cfn, env, monkeypatch):
    module = load_function("migrate")
    monkeypatch.setattr(module, "RESPONSE_RESERVE_SECS", 299.0)  # leaves a 1 s budget
    release = threading.Event()
    monkeypatch.setattr(module, "_migrate", lambda dsn: release.wait(30) or [])
    try:
        handler(cfn_event("Update", cfn.url, PhysicalResourceId="eros-test-DatabaseMigration"),
                LambdaContext("migrate", timeout_secs=300))
    finally:
        release.set()
    response = cfn.response()
    assert response["Status"] == "FAILED" and "did not finish" in response["Reason"]


def test_delete_succeeds_without_touching_the_database(handler, cfn, env, monkeypatch):
    module = load_function("migrate")

    def must_not_run(*_):
        raise AssertionError("Delete must not migrate or drop anything")

    monkeypatch.setattr(module, "_migrate", must_not_run)
    # Not even a configured database is needed: the stack may be going away with its secret.
    env(DATABASE_URL=None, DATABASE_SECRET_ARN=None)
    event = cfn_event("Delete", cfn.url, PhysicalResourceId="eros-test-DatabaseMigration")
    result = handler(event, LambdaContext("migrate", timeout_secs=300))

    response = cfn.response()
    assert response["Status"] == "SUCCESS" == result["Status"]
    assert response["PhysicalResourceId"] == "eros-test-DatabaseMigration"
    assert response["RequestId"] == event["RequestId"]


def test_delete_leaves_the_schema_in_place(handler, cfn, database_url, env):
    env(DATABASE_URL=database_url)
    before = applied_migrations(database_url)
    handler(cfn_event("Delete", cfn.url, PhysicalResourceId="x"), LambdaContext("migrate", timeout_secs=300))
    assert cfn.response()["Status"] == "SUCCESS"
    assert applied_migrations(database_url) == before and before


def test_an_unknown_request_type_fails(handler, cfn):
    handler(cfn_event("Rotate", cfn.url), LambdaContext("migrate", timeout_secs=300))
    assert cfn.response()["Status"] == "FAILED"


def test_an_undeliverable_response_raises_so_lambda_retries(handler, env, monkeypatch):
    module = load_function("migrate")
    monkeypatch.setattr(module.time, "sleep", lambda _: None)
    monkeypatch.setattr(module, "_migrate", lambda dsn: [])
    refused = f"http://127.0.0.1:{closed_port()}/response"
    with pytest.raises(RuntimeError, match="could not deliver"):
        handler(cfn_event("Create", refused), LambdaContext("migrate", timeout_secs=300))


def test_an_error_answer_from_the_response_url_is_retried(handler, monkeypatch):
    module = load_function("migrate")
    monkeypatch.setattr(module.time, "sleep", lambda _: None)
    recorder = ResponseRecorder(status=503)
    recorder.thread.start()
    try:
        with pytest.raises(RuntimeError):
            handler(cfn_event("Delete", recorder.url, PhysicalResourceId="x"), LambdaContext("migrate"))
        assert len(recorder.requests) == module.RESPONSE_ATTEMPTS
    finally:
        recorder.server.shutdown()
        recorder.server.server_close()


# --- the application's DML-only login ---------------------------------------------------------------------

@pytest.fixture
def app_secret(database_url):
    """A moto Secrets Manager holding the app login's secret as the template generates it."""
    import boto3
    from aws_lambda_powertools.utilities import parameters
    from moto import mock_aws

    parameters.clear_caches()
    name = f"eros_app_login_{uuid.uuid4().hex[:8]}"
    with mock_aws():
        client = boto3.client("secretsmanager", region_name="us-east-1")
        arn = client.create_secret(Name="eros/app-db", SecretString=json.dumps(
            {"username": name, "password": "Generated-App-Pw-0123456789"}))["ARN"]
        yield client, arn, name
    parameters.clear_caches()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {name}")


def test_create_makes_the_app_login_and_completes_its_secret(handler, cfn, fresh_database, env, app_secret):
    from psycopg.conninfo import conninfo_to_dict

    client, arn, name = app_secret
    env(DATABASE_URL=fresh_database, APP_DATABASE_SECRET_ARN=arn)
    handler(cfn_event("Create", cfn.url), LambdaContext("migrate", timeout_secs=300))
    response = cfn.response()
    assert response["Status"] == "SUCCESS", response
    assert "Generated-App-Pw" not in json.dumps(response)

    stored = json.loads(client.get_secret_value(SecretId=arn)["SecretString"])
    target = conninfo_to_dict(fresh_database)
    assert (stored["username"], stored["password"]) == (name, "Generated-App-Pw-0123456789")
    assert (stored["host"], stored["dbname"], stored["engine"]) == (target["host"], target["dbname"], "postgres")
    app_dsn = make_conninfo(fresh_database, user=name, password=stored["password"])
    with psycopg.connect(app_dsn, autocommit=True) as app:
        assert app.execute("SELECT count(*) FROM engine.personas").fetchone()[0] > 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("DROP TABLE engine.chat_messages")


def test_an_app_login_that_is_the_admin_fails_the_deploy(handler, cfn, fresh_database, env, app_secret):
    from psycopg.conninfo import conninfo_to_dict

    client, arn, _ = app_secret
    admin = conninfo_to_dict(fresh_database).get("user") or "postgres"
    client.put_secret_value(SecretId=arn, SecretString=json.dumps({"username": admin, "password": "Other-Pw-42"}))
    env(DATABASE_URL=fresh_database, APP_DATABASE_SECRET_ARN=arn)
    handler(cfn_event("Create", cfn.url), LambdaContext("migrate", timeout_secs=300))
    response = cfn.response()
    assert response["Status"] == "FAILED"
    assert "ConfigurationError" in response["Reason"] or "UnsafeAppUser" in response["Reason"]
    assert "Other-Pw-42" not in json.dumps(response)
