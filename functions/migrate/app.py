"""CloudFormation custom resource ``DatabaseMigration``: brings the database schema up to date on deploy.

Create and Update run ``eros.migrate.migrate`` (idempotent, serialised by an advisory lock) against
the deployed database, then creates or updates the application's DML-only login from its secret
(``eros.migrate.ensure_app_user``); Delete does nothing (removing the stack never drops data). Whatever happens,
the outcome goes back to CloudFormation by an HTTP PUT of the response document to the event's
``ResponseURL``: a custom resource that never answers holds the stack for an hour. So the
migration runs under a deadline kept short of the function's timeout, and the ``eros`` package is
imported inside the guarded section (a broken package still reports FAILED).

The ``Reason`` shown in the stack events names the error, never a connection string or password.
"""

from __future__ import annotations

import json
import re
import threading
import time
import traceback

import httpx

try:  # the logger is a nicety; the response must not depend on the eros package importing
    from eros.observability import logger
except Exception:  # pragma: no cover - only when the layer itself is broken
    import logging

    logger = logging.getLogger("eros.migrate")  # type: ignore[assignment]  # same calls, plain logging

RESPONSE_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
RESPONSE_ATTEMPTS = 3
# Time kept back from the function's timeout to send the response after a migration that overran.
RESPONSE_RESERVE_SECS = 30.0
MAX_REASON_CHARS = 400  # the whole response document must stay under 4 KB


class MigrationTimeout(RuntimeError):
    pass


def lambda_handler(event: dict, context) -> dict:
    request = event.get("RequestType")
    physical_id = event.get("PhysicalResourceId") or _new_physical_id(event)
    log_stream = getattr(context, "log_stream_name", "") or "unknown"
    logger.info("custom resource request", extra={"request_type": request,
                                                   "logical_resource_id": event.get("LogicalResourceId")})
    if request == "Delete":
        status, reason, data = "SUCCESS", "nothing to do: deleting the stack keeps the database", {}
    elif request in ("Create", "Update"):
        dsn: list[str] = []  # filled once known, so that an error message can be scrubbed of it
        try:
            applied = _run_with_deadline(lambda: _migrate(dsn), _budget_secs(context))
            status, data = "SUCCESS", {"Applied": ",".join(applied), "AppliedCount": str(len(applied))}
            reason = f"applied {', '.join(applied)}" if applied else "schema already up to date"
        except Exception as error:  # noqa: BLE001 - every failure must become a FAILED response
            message = _scrub(_describe(error), dsn)
            logger.error("database migration failed", extra={
                "error_type": type(error).__name__,
                "error": _scrub("".join(traceback.format_exception(error)), dsn)})
            status, data = "FAILED", {}
            reason = f"database migration failed: {message} (log stream {log_stream})"
    else:
        status, reason, data = "FAILED", f"unsupported request type {request!r}", {}

    response = {
        "Status": status,
        "Reason": reason[:MAX_REASON_CHARS],
        "PhysicalResourceId": physical_id,
        "StackId": event.get("StackId"),
        "RequestId": event.get("RequestId"),
        "LogicalResourceId": event.get("LogicalResourceId"),
        "NoEcho": False,
        "Data": data,
    }
    _send(event["ResponseURL"], response)
    logger.info("custom resource response sent", extra={"status": status, "reason": response["Reason"]})
    return {"Status": status, "Reason": response["Reason"]}


def _migrate(dsn_holder: list[str]) -> list[str]:
    from psycopg.conninfo import make_conninfo

    from eros.config import settings
    from eros.credentials import app_database_login, complete_app_secret, database_dsn
    from eros.migrate import ensure_app_user, migrate

    cfg = settings()
    dsn = database_dsn(cfg)
    dsn_holder.append(dsn)
    applied = migrate(dsn)
    # The application's login (AWS): created or updated after the migrations (0006 makes its role), and its
    # secret completed with where to connect. Its password is scrubbed from any error like the admin's.
    login = app_database_login(cfg)
    if login is not None:
        dsn_holder.append(make_conninfo(password=login[1]))
        ensure_app_user(dsn, *login)
        complete_app_secret(cfg, dsn)
    return applied


def _new_physical_id(event: dict) -> str:
    # One physical resource per stack, stable across updates (a changed id would make CloudFormation
    # send a Delete for the "old" resource; harmless here, but pointless).
    stack = str(event.get("StackId", "")).split("/")
    name = stack[1] if len(stack) > 1 else "eros"
    return f"{name}-{event.get('LogicalResourceId', 'DatabaseMigration')}"


def _budget_secs(context) -> float:
    remaining = context.get_remaining_time_in_millis() / 1000 if context is not None else 300.0
    return max(1.0, remaining - RESPONSE_RESERVE_SECS)


def _run_with_deadline(work, seconds: float):
    """Run ``work`` in a daemon thread; raise MigrationTimeout if it has not finished in ``seconds``."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = work()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=target, name="database-migration", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise MigrationTimeout(f"did not finish within {seconds:.0f} s "
                               "(is another migration holding the lock, or the database overloaded?)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _describe(error: BaseException) -> str:
    text = " ".join(str(error).split())  # one line: libpq messages span several
    name = type(error).__name__
    sqlstate = getattr(error, "sqlstate", None)
    if sqlstate:
        name = f"{name} SQLSTATE {sqlstate}"
    return f"{name}: {text}" if text else name


_URL_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://)[^/@\s]*@")
_PASSWORD_PARAM = re.compile(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


def _scrub(text: str, dsns: list[str]) -> str:
    """Remove connection strings and credentials from a message before it leaves the function."""
    for dsn in dsns:
        if dsn:
            text = text.replace(dsn, "<connection string>")
            password = _password_of(dsn)
            if password:
                text = text.replace(password, "***")
    text = _URL_USERINFO.sub(r"\1***@", text)
    return _PASSWORD_PARAM.sub(r"\1***", text)


def _password_of(dsn: str) -> str | None:
    try:
        from psycopg.conninfo import conninfo_to_dict

        password = conninfo_to_dict(dsn).get("password")
        return str(password) if password else None
    except Exception:  # noqa: BLE001 - an unparsable DSN has no password to find
        return None


def _send(url: str, response: dict) -> None:
    """PUT the response document to the pre-signed URL, retrying briefly; raise if it never lands."""
    body = json.dumps(response).encode()
    last: Exception | None = None
    for attempt in range(RESPONSE_ATTEMPTS):
        try:
            # The pre-signed S3 URL is signed without a content type: send an empty one.
            reply = httpx.put(url, content=body, headers={"content-type": ""}, timeout=RESPONSE_TIMEOUT)
            if reply.status_code < 300:
                return
            last = RuntimeError(f"response URL answered HTTP {reply.status_code}")
        except httpx.HTTPError as error:
            last = error
        logger.warning("sending the custom resource response failed",
                       extra={"attempt": attempt + 1, "error": _scrub(str(last), [])})
        time.sleep(min(2 ** attempt, 5))
    # Raising makes Lambda retry the invocation (the migration is idempotent), which sends again.
    raise RuntimeError("could not deliver the custom resource response") from last
