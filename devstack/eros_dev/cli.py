"""The ``eros`` command: serve (the local stack) and stop it, migrate, token, chat, mcp, sweep, invoke, doctor,
calibrate, forget, usage, events, backfill-episodes, personas, apps, keys, webhooks. Every failure is one line on stderr
(EROS_DEBUG=1 shows the traceback)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


class CliError(Exception):
    """A failure the person can fix: its message says how."""
    exit_code = 1


class BadInput(CliError):
    """What the person gave the command cannot be used (a file, an event, an answer): exit 2, as for bad arguments."""
    exit_code = 2


def _app_id(app: str | None) -> str:
    """``--app`` checked as an app id (eros.apps.APP_ID); none given: the first app, ``default``. Reads no database:
    the commands that only make a local token (the API then refuses an app it does not serve) or read the events
    log."""
    from eros.apps import APP_ID, DEFAULT

    if app is None:
        return DEFAULT
    if not APP_ID.fullmatch(app):
        raise BadInput(f"--app {app!r} is not an app id: 2 to 40 of a-z 0-9 -, starting with a letter")
    return app


def _served_app(app: str | None) -> str:
    """``--app`` as ``_app_id`` checks it, and an app this database serves (not one being deleted): for the
    commands that read or write users' rows (call it after ``_database()``)."""
    from eros.store import apps as app_store

    app = _app_id(app)
    if app_store.find(app) is None:
        raise CliError(f"there is no app {app!r} (`eros apps list` lists them)")
    return app


def _user_key(app: str, user: str, option: str = "USER") -> str:
    """The engine's key of the subject ``user`` in ``app`` (eros.apps.user_key), refusing a subject no token could
    carry (it would name another app's user)."""
    from eros.apps import unusable_subject, user_key

    problem = unusable_subject(user)
    if problem:
        raise BadInput(f"{option} {user!r} {problem}")
    return user_key(app, user)


def _database() -> tuple[str, str, bool]:
    """(the database URL, what to call it, whether this call started it): DATABASE_URL if set, else the
    embedded Postgres in .data/pg, started on demand. The URL is then put in the environment, where the
    functions this process runs read their settings (the local stack is their Lambda environment)."""
    from eros.config import settings

    from . import data_dir
    from .stack import embedded_postgres, postgres_running

    configured = settings().database_url
    if configured is not None:
        return configured.get_secret_value(), "DATABASE_URL", False
    was_running = postgres_running()
    url = embedded_postgres()
    os.environ["DATABASE_URL"] = url
    settings.cache_clear()
    return url, f"embedded Postgres 16 + pgvector in {data_dir() / 'pg'}", not was_running


def _answer_only():
    """While a command runs the functions' code: what they print (their metrics, as Lambda's log lines) goes
    to stderr, so that stdout carries the command's answer alone (``--json`` can be piped)."""
    from contextlib import redirect_stdout

    return redirect_stdout(sys.stderr)


@contextmanager
def _quiet(level: str = "WARNING") -> Iterator[None]:
    """The engine's log lines below ``level`` (each migration applied, each job done) are not shown while a
    command says what happened in its own words; EROS_DEBUG=1 shows them."""
    from eros.observability import logger

    before = logger.log_level
    if not _debugging():
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


@contextmanager
def _logs_on_stderr() -> Iterator[None]:
    """The engine's log lines go to stderr while a command runs (Lambda's go to stdout): stdout is the command's
    answer, which ``--json`` makes a JSON document a pipe can read."""
    from eros.observability import logger

    handler = logger.registered_handler
    if not isinstance(handler, logging.StreamHandler):
        yield
        return
    before = handler.setStream(sys.stderr)
    try:
        yield
    finally:
        if before is not None:
            handler.setStream(before)


def cmd_migrate(args) -> int:
    from eros.config import settings
    from eros.credentials import database_dsn
    from eros.migrate import migrate

    if not settings().database_secret_arn:
        _database()
    applied = migrate(database_dsn(settings()))
    print(f"migrations applied: {', '.join(applied) if applied else 'none (up to date)'}")
    return 0


def cmd_token(args) -> int:
    from eros.config import settings

    from .tokens import issue_token, local_jwt_key

    if args.app is not None:
        _app_id(args.app)
    print(issue_token(args.user, settings(), local_jwt_key(), ttl_secs=args.ttl, operator=args.operator,
                      app=args.app))
    return 0


def cmd_serve(args) -> int:
    import errno

    from eros import providers
    from eros.config import settings
    from eros.migrate import migrate

    from . import data_dir, events_log
    from .server import make_server
    from .stack import stop_embedded_postgres

    port = args.port or settings().port
    base = f"http://{args.host}:{port}"
    # Exports (GET /v1/export) go to a folder this server serves, in place of S3 and its presigned URLs.
    os.environ.setdefault("EXPORT_DIR", str(data_dir() / "exports"))
    os.environ.setdefault("EXPORT_BASE_URL", f"{base}/local")
    events_log()  # each sweep publishes the memory events there (`eros events --follow`)
    # An app's webhook may be a receiver on this machine (http, loopback): eros.webhooks refuses both in AWS.
    os.environ.setdefault("WEBHOOK_ALLOW_HTTP", "true")
    settings.cache_clear()
    cfg = settings()
    try:
        server = make_server(cfg, args.host, port, concurrency=args.concurrency)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise CliError(f"port {port} is in use (another `make run`?): stop it with `make stop`, or run on another "
                       f"port: PORT={port + 1} make run") from None
    url, database, started = _database()
    try:
        with _quiet():
            applied = migrate(url, local=True)  # an edited applied migration is a warning here, an error on deploy
        with _quiet("ERROR"):  # an offline provider's warning: the banner says it
            described = providers.describe()
        _serve(args, settings(), server, base, database, _schema(applied), described)
    finally:
        server.server_close()
        if started:  # Ctrl-C stops what `make run` started; a Postgres that was already running stays
            stop_embedded_postgres()
            print("stopped the embedded Postgres", flush=True)
    return 0


def _schema(applied: list[str]) -> str:
    """The banner's schema line: the newest migration, and what this start applied."""
    from eros.migrate import migration_files

    migrations = sum(not name.startswith("functions/") for name in applied)
    done = [f"{migrations} migration(s)"] if migrations else []
    done += [f"{len(applied) - migrations} function file(s)"] if len(applied) > migrations else []
    return migration_files()[-1][0] + (f" (applied now: {' and '.join(done)})" if done else " (up to date)")


def _serve(args, cfg, server, base: str, database: str, schema: str, described: dict) -> None:
    from .dreaming import run_local_sweeper
    from .stack import serving

    sweeper = run_local_sweeper(cfg) if args.sweep else None  # the local EventBridge schedule
    print(f"""
eros local stack
  database : {database}
  schema   : {schema}
  chat LLM : {described['llm']}
  embedder : {described['embedder']}
  dreaming : {f"every {cfg.dreaming_tick_secs}s, sessions idle for {cfg.dreaming_idle_secs}s" if sweeper else "off"}
  API      : {base}
  console  : {base}/console/
  logs     : {"one line per record (LOG_FORMAT=json for Powertools' JSON)" if cfg.log_format == "text"
              else "Powertools JSON (LOG_FORMAT=json)"}; EROS_DEBUG=1 shows every detail

Open the console in a browser, or try it from a shell:
  TOKEN=$(.venv/bin/eros token alice)
  curl -s -X POST {base}/v1/sessions -H "Authorization: Bearer $TOKEN" -d '{{"persona_id":"luna"}}'
  curl -s -X POST {base}/v1/sessions/SESSION_ID/turns -H "Authorization: Bearer $TOKEN" \\
       -d '{{"content":"I moved to Tokyo last week"}}'
  .venv/bin/eros chat alice          # or chat in the terminal
  .venv/bin/eros sweep --now         # dream now, without waiting for {cfg.dreaming_idle_secs}s of quiet
Ctrl-C (or `make stop`) stops it.
""", flush=True)
    with serving():
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def cmd_stop(args) -> int:
    """``make stop``: the running ``eros serve`` and the embedded Postgres."""
    from .stack import stop_local_stack

    stopped = stop_local_stack()
    print(f"stopped {' and '.join(stopped)}" if stopped else "nothing was running")
    return 0


def cmd_sweep(args) -> int:
    """One dreaming sweep now, waiting for its jobs: what each did, or why there was nothing to do."""
    import json

    from eros.config import settings

    from . import events_log
    from .dreaming import sweep_locally

    _database()
    events_log()
    with _answer_only(), _quiet():  # the answer below says what each job did
        result = sweep_locally(idle_now=args.now)
    if args.json:
        print(json.dumps(result, default=str, indent=2))
    else:
        print("\n".join(swept(result, settings().dreaming_idle_secs, args.now)))
    return 0


def swept(result: dict, idle_secs: int, now: bool) -> list[str]:
    """A sweep's answer for a person: a line for the sweep, one per job, and a hint when nothing was idle."""
    from eros.apps import shown

    lines = [f"claimed {result['claimed']} session(s) and {result['users_claimed']} user(s) for a deep pass"]
    for job in result["jobs"]:
        if job["kind"] == "session":
            done = ", ".join([f"{job[k]} {k}" for k in ("memories", "superseded", "confirmed") if job.get(k)]
                             + ([f"episode {job['episode']}"] if job.get("episode") else [])
                             + ([f"then {job['followed']} more imported session(s) of the user"]
                                if job.get("followed") else []))
            what = f"session {job['session_id']} of {shown(job['user_id'])}"
        else:
            done = ", ".join(f"{job[k]} {k}" for k in ("merged", "superseded") if job.get(k))
            what = f"deep pass of {shown(job['user_id'])}"
        why = job.get("error") or (f"fault: {job['fault']}" if job.get("fault") else "")
        lines.append(f"  {what}: {job['outcome']}" + (f" ({done})" if done else "") + (f" - {why}" if why else ""))
    if result.get("blocked"):
        lines.append(f"dreaming is held: {', '.join(result['blocked'])} refused our credentials (see /v1/health)")
    if not result["claimed"] and not now:
        lines.append(f"nothing was idle: a session is dreamt about {idle_secs} s after its last message "
                     f"(DREAMING_IDLE_SECS); `eros sweep --now` takes every session with new messages at once")
    return lines


def cmd_events(args) -> int:
    """The memory events the local stack's sweeps published (eros.events; docs/EVENTS.md), oldest first, each once
    (a sweep killed after publishing publishes its batch again: the log keeps both, this shows one); --follow
    waits for more."""
    import json

    from eros.apps import DEFAULT

    from . import events_log, logged_events

    app = _app_id(args.app) if args.app or args.user else None  # a user is one of an app's (default: the first)
    path, offset = events_log(), 0
    shown: set[str] = set()
    if not path.exists() and not args.follow:
        print(f"no events yet: each sweep of the local stack (`make run`, `eros sweep`) publishes them to {path}")
        return 0
    while True:
        events, offset = logged_events(path, offset, shown)
        for event in events:
            if (app is None or event.get("app", DEFAULT) == app) and (not args.user or event["user_id"] == args.user):
                print(json.dumps(event, ensure_ascii=False) if args.json else _event_line(event), flush=True)
        if not args.follow:
            return 0
        time.sleep(0.5)


def _event_line(event: dict) -> str:
    about = event.get("memory_id") or event.get("session_id") or ""
    detail = " ".join(f"{k}={v}" for k, v in event["detail"].items())
    from eros.apps import shown, user_key

    who = shown(user_key(event.get("app", "default"), event["user_id"]))  # a user of another app: alice@acme
    return f"{event['occurred_at'][11:19]} {who} #{event['seq']} {event['type']} {about} {detail}".rstrip()


def cmd_invoke(args) -> int:
    """One function's real handler on an event file, in this process, with the local database; prints
    its answer. For an extract event that Lambda gave up on, the dead-letter record (its requestPayload)
    or the bare event both work."""
    import json
    from pathlib import Path

    from .dreaming import sweep_locally
    from .lambda_runtime import LambdaContext, load_function

    path = Path(args.event)
    try:
        event = json.loads(path.read_text())
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:  # not UTF-8 text, or not JSON
        raise BadInput(f"{path} is not JSON: {exc}") from None
    if isinstance(event, dict) and isinstance(event.get("requestPayload"), dict):  # a Lambda destination record
        event = event["requestPayload"]
    problem = _event_problem(args.function, event)
    if problem:
        kind = _looks_like(event)
        what, sample = _TAKES[args.function]
        raise BadInput(f"{path} is " + (f"{kind[1]}, not {what}" if kind and kind[0] != args.function else
                                        f"not {what}") + f": {problem} (events/{sample} is one)")
    if args.function != "chat-stream" and (args.app or args.as_user):
        raise BadInput("--as USER and --app are for chat-stream (a turn sent as a user)")
    _database()
    if args.function == "chat-stream":
        return _invoke_streaming(event, args.as_user, _served_app(args.app) if args.app else None)
    with _answer_only():
        if args.function == "sweeper":  # its fan-out goes to local extract containers; the answer lists each job
            answer = sweep_locally(event=event)
        else:
            answer = load_function(args.function).lambda_handler(event, LambdaContext(args.function))
    print(json.dumps(answer, default=str, indent=2))
    return 0


def _invoke_streaming(event: dict, user: str | None, app: str | None = None) -> int:
    """The stream function's handler (functions/chat/stream.py) on a function URL's event: its status and headers as
    one JSON line, then each chunk of its body as it comes (the turn's Server-Sent Events). The token is checked as
    the local stack's dev server checks it (its claims put where the server puts them); ``user``: a fresh local
    token of that user (of ``app``) replaces the event's."""
    import json

    from eros.config import settings

    from .lambda_runtime import LambdaContext, load_function
    from .tokens import issue_token, local_jwt_key, verify_token

    config, out = settings(), sys.stdout
    headers = event["headers"] = dict(event.get("headers") or {})
    if app and not user:
        raise BadInput("--app names the app of the --as USER: give --as too")
    if user:
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        token = issue_token(user, config, local_jwt_key(), app=app)
        event["headers"] = headers | {"authorization": f"Bearer {token}"}
    if "jwt_issuer" not in config.model_fields_set:  # the local stack: the dev server verifies, the function trusts
        authorization = next((v for k, v in event["headers"].items() if k.lower() == "authorization"), None)
        claims = verify_token(authorization, config, local_jwt_key())
        if claims is not None:
            event.setdefault("requestContext", {})["authorizer"] = {
                "jwt": {"claims": {k: str(v) for k, v in claims.items()}, "scopes": None}}
    with _answer_only():
        streamed = load_function("chat", entry="stream").lambda_handler(event, LambdaContext("chat-stream"))
        print(json.dumps({"statusCode": streamed.status_code, "headers": streamed.headers}), file=out, flush=True)
        for chunk in streamed.body:
            out.write(chunk.decode(errors="replace"))
            out.flush()
    if streamed.status_code == 401 and not user:
        print("the event's token is not one of this stack's: `--as USER` puts a fresh one in it", file=sys.stderr)
    return 0


# What each function's handler takes, and the sample of it in events/.
_TAKES = {"chat": ("an API Gateway HTTP API event (payload format 2.0)", "chat_health.json"),
          "chat-stream": ("a Lambda function URL event (payload format 2.0)", "chat_stream_turn.json"),
          "extract": ("an extract job (a session's or a deep pass's)", "extract_session.json"),
          "sweeper": ("a scheduled event (EventBridge)", "sweeper_schedule.json")}


def _event_problem(function: str, event: object) -> str | None:
    """Why ``event`` is not what ``function``'s handler reads, in a person's words; None when it is."""
    if not isinstance(event, dict):
        kinds = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}
        return f"it is {kinds.get(type(event), 'a number')}, not an object"
    if function == "extract":
        from pydantic import ValidationError

        from .lambda_runtime import load_function

        try:
            load_function("extract").job(event)  # the handler's own parsing
        except ValidationError as exc:
            return "; ".join(_where(error["loc"]) + error["msg"].replace("Field required", "missing")
                             for error in exc.errors()[:3])
        return None
    if function == "sweeper":  # it reads nothing else from the event
        kind = event.get("detail-type")
        return None if kind == "Scheduled Event" else (
            f"its detail-type is {kind!r}, not 'Scheduled Event'" if kind else "it has no detail-type")
    if "httpMethod" in event:
        return "an HTTP API's event has rawPath and requestContext.http, not path and httpMethod"
    context = event.get("requestContext")
    http = context.get("http") if isinstance(context, dict) else None
    needed = {"rawPath": event.get("rawPath"),  # what the handler (Powertools' resolver) reads of every event
              "requestContext.http.method": http.get("method") if isinstance(http, dict) else None,
              "requestContext.stage": context.get("stage") if isinstance(context, dict) else None}
    missing = [name for name, value in needed.items() if not isinstance(value, str)]
    if missing:
        return f"it has no {', '.join(missing)}"
    wrong = [name for name in ("headers", "queryStringParameters", "pathParameters")
             if event.get(name) is not None and not isinstance(event[name], dict)]
    wrong += ["body"] if event.get("body") is not None and not isinstance(event["body"], str) else []
    return f"{', '.join(wrong)} must be " + ("an object" if wrong != ["body"] else "a string") if wrong else None


def _where(loc: tuple) -> str:
    path = [str(part) for part in loc if part not in ("session", "deep_pass")]  # the union's tag
    return f"{'.'.join(path)}: " if path else ""


def _looks_like(event: object) -> tuple[str, str] | None:
    """(the function whose event it seems to be, what it is), or None."""
    if not isinstance(event, dict):
        return None
    if not event:
        return "", "an empty object"
    if ".lambda-url." in str((event.get("requestContext") or {}).get("domainName")):
        return "chat-stream", "a function URL event (the stream function's)"
    if "requestContext" in event or "rawPath" in event or "routeKey" in event:
        return "chat", "an HTTP API event (the chat function's)"
    if "httpMethod" in event:
        return "", "a REST API event (payload format 1.0)"
    if "detail-type" in event:
        return "sweeper", "an EventBridge event (the sweeper's)"
    if "claim_token" in event or "session_id" in event:
        return "extract", "an extract job"
    if "RequestType" in event and "ResourceProperties" in event:
        return "", "a CloudFormation request (the migrate function's: locally, `eros migrate` does its work)"
    return None


def cmd_doctor(args) -> int:
    """What ``GET /v1/health/deep`` checks, from here: the database, the schema, each provider and the embedder's
    similarity thresholds (eros.calibrated)."""
    import json

    from eros.health import deep_report

    _database()
    with _answer_only():
        report = deep_report(fresh=True)  # an operator's check: never an answer kept from earlier
    if args.json:
        print(json.dumps(report, default=str, indent=2))
    else:
        marks = {"ok": "ok  ", "warning": "WARN"}  # a warning works, but wants a look; it does not fail the check
        for name, check in report["checks"].items():
            print(f"{marks.get(check['status'], 'BAD ')} {name:<11} {check['detail']}")
    return 0 if report["status"] == "ok" else 1


def cmd_calibrate(args) -> int:
    """The similarity thresholds and score weights for the stored vectors' embedding model, derived from this
    deployment's own memories without labels (eros.calibrated.calibrate), stored unless ``--dry-run``, and shown
    beside the defaults and what the engine used until now."""
    import json

    from eros import calibrated

    _database()
    with _answer_only(), _quiet():
        try:
            done = calibrated.calibrate(dry_run=args.dry_run, limit=args.sample)
        except calibrated.TooFew as exc:
            raise CliError(f"{exc}; nothing was stored (run it again once dreaming has written more memories)"
                           ) from None
        except ValueError as exc:
            raise CliError(f"the derived thresholds are not usable ({exc}); nothing was stored") from None
    report = _calibrated(done)
    if args.json:
        print(json.dumps(report, default=str, indent=2))
        return 0
    verb = "would store (--dry-run: nothing stored)" if args.dry_run else "stored"
    print(f"{report['model']}: thresholds from {report['pairs']:,} memories' nearest neighbours of the same user and"
          f" category; {verb}")
    print(f"{'setting':<26} {'default':>8} {'used until now':>22} {'chosen':>8}")
    for knob in report["knobs"]:
        before = f"{knob['before']} ({knob['before_source']})"
        print(f"{knob['variable']:<26} {knob['default']:>8} {before:>22} {knob['chosen']:>8}")
    for note in report["notes"]:
        print(f"note: {note}")
    return 0


def _calibrated(done) -> dict:
    from eros import calibrated, calibration

    chosen, before = done.calibration, done.before
    knobs = [{"knob": name, "variable": calibrated.ENV_NAMES[name], "default": getattr(calibration.REFERENCE, name),
              "before": before.values[name], "before_source": before.sources[name], "chosen": getattr(chosen, name)}
             for name in calibrated.KNOBS]
    overridden = [k["variable"] for k in knobs if k["before_source"] == "env"]
    notes = list(done.notes)
    if overridden:
        notes.append(f"set in the environment, so still used instead of the chosen value: {', '.join(overridden)}")
    return {"model": chosen.model, "pairs": done.pairs, "stored": done.stored is not None,
            "calibrated_at": done.stored["created_at"] if done.stored else None, "knobs": knobs, "notes": notes}


def _sample(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if not 50 <= n <= 20000:
        raise argparse.ArgumentTypeError(f"{n} is not between 50 and 20000")
    return n


def cmd_forget(args) -> int:
    """What ``DELETE /v1/me`` does, for an operator: erase every row of USER and their export files, once the
    person has seen what that is and typed the user id again (``--yes``: a script's choice, no question)."""
    from eros.account import erase, stored
    from eros.apps import DEFAULT

    _database()
    app = _served_app(args.app)
    key = _user_key(app, args.user)
    who = args.user if app == DEFAULT else f"{args.user} of app {app}"  # another app's user: said, as erased
    found = stored(key)
    if not any(found.values()):  # nothing to erase: say so rather than report zeros as an erasure
        print(f"nothing was stored about {who}")
        return 0
    print(f"stored about {who}: {_counted(found)}")
    if not args.yes:
        if not sys.stdin.isatty():
            raise BadInput("an erasure cannot be undone: run it at a terminal to confirm it, or pass --yes")
        try:
            typed = input(f"Erase all of it, for good? Type the user id ({args.user}) to confirm: ")
        except EOFError:
            typed = ""
        if typed.strip() != args.user:
            raise CliError(f"nothing was erased: the answer was not {args.user!r}")
    print(f"erased {who}: {_counted(erase(key))}")
    return 0


def _counted(counts: dict[str, int]) -> str:
    """``2 sessions, 14 messages, 5 memories, 1 deep pass``: the three a person asks about always, the rest when
    there are any."""
    main = ("sessions", "messages", "memories")
    one = {"sessions": "session", "messages": "message", "memories": "memory", "persona_instances": "persona instance",
           "personas": "persona", "usage_days": "usage day", "exports": "export"}
    return ", ".join(f"{count} {one.get(kind, kind) if count == 1 else kind}".replace("_", " ") for kind, count in
                     [(kind, counts.get(kind, 0)) for kind in main]
                     + [(kind, count) for kind, count in counts.items() if kind not in main and count])


def cmd_backfill_episodes(args) -> int:
    """Episodes for sessions extracted before episodes existed (``eros.dreaming.episodes``): one batch."""
    from eros.config import settings
    from eros.dreaming.episodes import backfill

    _database()
    app = _served_app(args.app) if args.app or args.user else None  # neither: every app's sessions
    done = backfill(settings(), _user_key(app, args.user, "--user") if app and args.user else None, args.limit,
                    app=app)
    print(f"episodes written: {done.written}; no episode in the answer: {done.no_episode}; refused: {done.refused};"
          f" over budget (skipped this run): {done.deferred}; transcript cut by retention (skipped):"
          f" {done.retention_skipped}; provider failures (taken again next run): {done.failed};"
          f" calls: {done.llm_calls} LLM + {done.embedding_calls} embedding")
    return 0


def cmd_import(args) -> int:
    """Import a JSONL file of conversations (eros.importing says the format and what is checked), streamed, with
    a progress line; refused lines are listed with their numbers (exit 1 when any)."""
    from eros.importing import describe, import_conversations

    _database()
    app = _served_app(args.app)
    if args.user:
        _user_key(app, args.user, "--user")
    with _quiet():  # a log line per conversation would bury the progress line; the summary says what happened
        return _import(args, app, import_conversations, describe)


def _import(args, app: str, import_conversations, describe) -> int:
    import json

    try:
        total = os.path.getsize(args.file)
        stream = open(args.file, "rb")  # noqa: SIM115 (closed below; read a line at a time)
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    tty = sys.stderr.isatty() and not args.json
    last = [0.0]

    def progress(done) -> None:
        now = time.monotonic()
        if not tty or now - last[0] < 0.2:
            return
        last[0] = now
        share = done.bytes_read / total if total else 1.0
        bar = "#" * int(share * 30)
        print(f"\r  [{bar:<30}] {share:4.0%}  {done.conversations:,} conversations, {done.stored:,} messages"
              f" stored, {len(done.refused):,} refused", end="", file=sys.stderr, flush=True)

    started = time.monotonic()
    with stream:
        done = import_conversations(stream, user=args.user, app=app, progress=progress)
    if tty:
        print(file=sys.stderr)
    report = describe(done) | {"seconds": round(time.monotonic() - started, 1)}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"imported {done.conversations:,} conversations ({done.sessions_created:,} new sessions):"
              f" {done.stored:,} messages stored, {done.messages - done.stored:,} already there,"
              f" {done.skipped:,} system or tool messages skipped, in {report['seconds']} s")
        for number, problem in done.refused[:20]:
            print(f"  line {number}: {problem}")
        if len(done.refused) > 20:
            print(f"  ... and {len(done.refused) - 20:,} more refused lines")
        print("dreaming distils the sessions oldest first: `eros sweep --now`, or the schedule")
    return 1 if done.refused else 0


def cmd_personas(args) -> int:
    """The app's personas, for operators (users make their own through the API): list them, set one (made, or a
    new version when its text changed: sessions already started keep theirs), or retire one."""
    from pathlib import Path

    from eros import db
    from eros.store import personas as persona_store

    url, _, _ = _database()
    args.app = _served_app(args.app)
    with db.connect(url) as conn:
        if args.action == "set":
            if not args.id or not args.name or not args.prompt_file:
                raise CliError("set needs ID, --name and --prompt-file")
            try:
                prompt = Path(args.prompt_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise CliError(f"cannot read {args.prompt_file}: {exc.strerror}") from None
            problem = _persona_problem(args.id, args.name, prompt)
            if problem:
                raise CliError(problem)
            version = persona_store.keep_app(args.app, args.id, args.name, args.description or "", prompt, conn)
            print(f"{args.id}: " + (f"version {version}" if version else "unchanged (same text, or an id another"
                                                                         " app or a user has)"))
        elif args.action == "retire":
            if not args.id:
                raise CliError("retire needs ID")
            if not persona_store.retire_app(args.app, args.id, conn):
                raise CliError(f"no active app persona {args.id!r}")
            print(f"{args.id}: retired (listed no more; its sessions go on)")
        for p in persona_store.app_personas(args.app, conn):
            state = f"retired {p['retired_at']:%Y-%m-%d}" if p["retired_at"] else "active"
            print(f"{p['id']:<16} v{p['version']:<3} {state:<18} {p['name']}: {p['description']}")
    return 0


def _persona_problem(persona_id: str, name: str, prompt: str) -> str | None:
    import re

    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", persona_id) or persona_id.startswith("u-"):
        return (f"the id {persona_id!r} must be 1-64 of a-z 0-9 _ - (starting with a letter or digit), and not "
                "start with u- (users' characters)")
    if not 1 <= len(name.strip()) <= 64:
        return "--name must be 1 to 64 characters"
    if not 1 <= len(prompt) <= 8_000:
        return f"the prompt must be 1 to 8,000 characters (it has {len(prompt):,})"
    return None


def cmd_apps(args) -> int:
    """The deployment's apps (tenants, eros.apps), for operators with the migration credentials: list them, create
    one, change its settings, export one's whole record, or delete one whole (its users erased as ``eros forget``
    erases one, then its personas, keys and row) once the person has seen what that is and typed the app id again."""
    from eros.store import apps as app_store

    _database()
    args.pairs = args.pairs + args.sets  # create's --set, set's KEY=VALUE: either way
    actions = {"create": _apps_create, "set": _apps_set, "export": lambda args, _: _apps_export(args),
               "delete": lambda args, _: _apps_delete(args)}
    return actions[args.action](args, app_store) if args.action in actions else _apps_list(app_store)  # the default


def _apps_set(args, app_store) -> int:
    row = app_store.find(args.id)
    if row is None:
        raise CliError(f"there is no app {args.id!r} (`eros apps list` lists them)")
    if not args.pairs:
        raise BadInput("set needs at least one KEY=VALUE (KEY=none clears one)")
    kept = app_store.set_settings(args.id, _app_settings(args.pairs, row["settings"]))
    if kept is None:
        raise CliError(f"the app {args.id!r} is being deleted")
    print(f"{args.id}: settings {_shown_settings(kept['settings'])} (running functions take them within 30 s)")
    return 0


def _apps_export(args) -> int:
    """The app's whole record (eros.account.export_app), to --out or standard output; what was written, on stderr."""
    from eros.account import NoSuchApp, export_app
    from eros.store import apps as app_store

    if app_store.find(args.id) is None:  # before a file is made for it
        raise CliError(f"there is no app {args.id!r} (`eros apps list` lists them)")
    try:
        if args.out:
            try:
                with open(args.out, "xb") as out:
                    done = export_app(args.id, out)
            except FileExistsError:
                raise BadInput(f"--out {args.out} exists: an export never overwrites a file") from None
            except OSError as exc:
                raise CliError(f"cannot write {args.out}: {exc.strerror}") from None
        else:
            done = export_app(args.id, sys.stdout.buffer)
            sys.stdout.flush()
    except NoSuchApp as exc:
        raise CliError(str(exc)) from None
    print(f"exported app {args.id}: {done.users} users, {done.bytes:,} bytes"
          + (f" to {args.out}" if args.out else ""), file=sys.stderr)
    return 0


def _apps_list(app_store) -> int:
    print(f"{'id':<20} {'name':<24} {'created':<10} {'users':>6} {'live keys':>9}  settings")
    counted = app_store.users_by_app()  # users with a session: one read (the deletion's scan reads every table)
    for app in app_store.every():
        live = sum(k["revoked_at"] is None for k in app_store.keys(app["id"]))
        users = counted.get(app["id"], 0)
        state = f" (being deleted since {app['deleted_at']:%Y-%m-%d %H:%M})" if app["deleted_at"] else ""
        print(f"{app['id']:<20} {app['name'][:24]:<24} {app['created_at']:%Y-%m-%d} {users:>6,} {live:>9}"
              f"  {_shown_settings(app['settings'])}{state}")
    return 0


def _apps_create(args, app_store) -> int:
    from eros.apps import APP_ID

    if not APP_ID.fullmatch(args.id):
        raise BadInput(f"the app id {args.id!r} must be 2 to 40 of a-z 0-9 -, starting with a letter")
    name = (args.name or "").strip()
    if not 1 <= len(name) <= 200:
        raise BadInput("create needs --name, 1 to 200 characters")
    made = app_store.create(args.id, name, _app_settings(args.pairs, {}))
    if made is None:
        raise CliError(f"the app id {args.id!r} is taken (by an app, or one being deleted)")
    print(f"app {made['id']} ({made['name']}) created: settings {_shown_settings(made['settings'])}; its users'"
          f" tokens name it in the {_app_claim()} claim; `eros keys create --app {made['id']}` makes a key for its"
          " servers")
    return 0


def _app_claim() -> str:
    from eros.config import settings

    return settings().app_claim


def _apps_delete(args) -> int:
    from eros.account import app_stored, erase_app
    from eros.apps import DEFAULT
    from eros.store import apps as app_store

    if args.id == DEFAULT:
        raise CliError(f"the first app, {DEFAULT}, cannot be deleted (`eros forget USER` erases one of its users)")
    row = next((app for app in app_store.every() if app["id"] == args.id), None)
    if row is None:
        raise CliError(f"there is no app {args.id!r} (`eros apps list` lists them)")
    users, rows = app_stored(args.id)
    print(f"stored for app {args.id} ({row['name']}): {users} users; rows: {_rows(rows)}")
    if not args.yes:
        if not sys.stdin.isatty():
            raise BadInput("an app's deletion cannot be undone: run it at a terminal to confirm it, or pass --yes")
        try:
            typed = input(f"Delete the app, its users and everything of theirs, for good? Type the app id"
                          f" ({args.id}) to confirm: ")
        except EOFError:
            typed = ""
        if typed.strip() != args.id:
            raise CliError(f"nothing was deleted: the answer was not {args.id!r}")
    done = erase_app(args.id)
    print(f"deleted app {args.id}: {done.users} users erased ({_counted(done.erased)}); then "
          + ", ".join(f"{count} {kind.replace('_', ' ')}" for kind, count in done.leftovers.items()))
    left = {table: n for table, n in done.scan.items() if n}
    print(f"scan of every table for the app's rows: {_rows(done.scan) if left else 'none left'}")
    if left:
        raise CliError(f"rows of the app are left ({_rows(left)}): run `eros apps delete {args.id}` again")
    return 0


def _rows(counts: dict[str, int]) -> str:
    return ", ".join(f"{table} {count:,}" for table, count in counts.items() if count) or "none"


def _shown_settings(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "(the deployment's)"


def _app_settings(pairs: list[str], current: dict) -> dict:
    """``current`` with each KEY=VALUE of ``pairs`` over it (KEY=none: unset), checked as eros.apps.AppSettings."""
    from pydantic import ValidationError

    from eros.apps import AppSettings

    fields = AppSettings.model_fields
    merged = dict(current)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"{pair!r} is not KEY=VALUE")
        if key not in fields:
            raise BadInput(f"unknown setting {key!r}: an app may set {', '.join(fields)}")
        if value.strip().lower() == "none":
            merged.pop(key, None)
        else:
            merged[key] = _setting_value(key, value.strip(), fields[key].annotation)
    try:
        return AppSettings.model_validate(merged).overrides()
    except ValidationError as exc:
        raise BadInput("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None


def _setting_value(key: str, value: str, annotation) -> object:
    """VALUE as the setting's type: a whole number, true/false, or text."""
    from typing import get_args

    kinds = set(get_args(annotation)) or {annotation}
    if bool in kinds:
        truth = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False,
                 "0": False}.get(value.lower())
        if truth is None:
            raise BadInput(f"{key} is true or false, not {value!r}")
        return truth
    if int in kinds:
        try:
            return int(value)
        except ValueError:
            raise BadInput(f"{key} is a whole number, not {value!r}") from None
    return value


def cmd_keys(args) -> int:
    """An app's API keys, for its servers (the /server routes, X-Api-Key): make one, list them, rotate one (a new
    key in its place, the old one refused from then on) or revoke one, as its operator does through the API
    (eros.apps). A key is shown once, when it is made."""
    from eros import apps
    from eros.store import apps as app_store

    _database()
    args.app = _served_app(args.app)
    if args.action == "list":
        return _keys_list(app_store.keys(args.app))
    if args.action == "create":
        name = (args.name or "default").strip()
        if not 1 <= len(name) <= 100:
            raise BadInput("--name must be 1 to 100 characters")
        made = apps.create_key(args.app, name)
    elif args.action == "revoke":
        key_id = _key_id(args)
        if apps.revoke_key(args.app, key_id) is None:
            raise CliError(f"{key_id} is not a live key of the app {args.app!r}")
        print(f"key {key_id} of app {args.app}: revoked (refused from now on)")
        return 0
    else:
        key_id = _key_id(args)
        rotated = apps.rotate_key(args.app, key_id)
        if rotated is None:
            raise CliError(f"{key_id} is not a live key of the app {args.app!r}")
        print(f"key {key_id} of app {args.app}: revoked, replaced by the key below")
        made = rotated
    print(f"key {made['id']} ({made['name']}) of app {args.app}:\n{made['secret']}\n"
          "This key is shown once and not again (only its hash is kept): store it now.")
    return 0


def _keys_list(keys: list[dict]) -> int:
    for k in keys:
        state = ("live" if k["revoked_at"] is None else f"revoked {k['revoked_at']:%Y-%m-%d %H:%M}"
                 + (f", replaced by {k['replaced_by']}" if k["replaced_by"] else ""))
        used = f"{k['last_used_at']:%Y-%m-%d %H:%M}" if k["last_used_at"] else "never"
        print(f"{k['id']}  {k['prefix']}...  {k['name'][:24]:<24} created {k['created_at']:%Y-%m-%d}"
              f"  used {used:<16}  {state}")
    return 0


def _key_id(args):
    from uuid import UUID

    try:
        return UUID(args.key_id)
    except ValueError:
        raise BadInput(f"{args.key_id!r} is not a key id (`eros keys list --app {args.app}`)") from None


def cmd_webhooks(args) -> int:
    """An app's webhook (docs/EVENTS.md "Webhooks"), as its operator keeps it through the API (eros.webhooks): set
    its URL (its signing secret printed when it is made or rotated, once), show it with its deliveries waiting and
    dead, delete it (its waiting deliveries dropped), or redrive its dead deliveries."""
    from eros import webhooks
    from eros.config import settings

    _database()
    args.app = _served_app(args.app)
    if args.action == "set":
        try:
            made = webhooks.set_webhook(args.app, args.url, args.rotate_secret, settings())
        except ValueError as exc:
            raise BadInput(f"{exc} (WEBHOOK_ALLOW_HTTP=true allows http and private addresses, as `eros serve`"
                           " does)") from None
        print(f"webhook of app {args.app}: {made['url']}")
        if "secret" in made:
            print(f"signing secret:\n{made['secret']}\nThis secret is shown once (`--rotate-secret` makes a new"
                  " one): store it where the endpoint verifies signatures.")
        return 0
    if args.action == "redrive":
        if webhooks.show(args.app) is None:
            raise CliError(f"the app {args.app!r} has no webhook (`eros webhooks set --app {args.app} URL`)")
        print(f"{webhooks.redrive(args.app)} dead deliveries of app {args.app} due again (the next sweep posts them)")
        return 0
    if args.action == "delete":
        if not webhooks.delete(args.app):
            raise CliError(f"the app {args.app!r} has no webhook")
        print(f"webhook of app {args.app}: deleted, with its deliveries not made yet")
        return 0
    found = webhooks.show(args.app)
    if found is None:
        raise CliError(f"the app {args.app!r} has no webhook (`eros webhooks set --app {args.app} URL`)")
    rotated = f"{found['secret_rotated_at']:%Y-%m-%d %H:%M}" if found["secret_rotated_at"] else "never"
    print(f"{found['url']}\ncreated {found['created_at']:%Y-%m-%d %H:%M}, secret rotated {rotated}\n"
          f"deliveries waiting: {found['pending']}, dead: {found['dead']}")
    return 0


def cmd_usage(args) -> int:
    """An operator's usage report: every user's tokens, calls and estimated cost in a range of UTC days
    (costliest first), or one user's per day, purpose and model (what ``GET /v1/usage`` answers)."""
    import json

    from eros import usage

    _database()
    try:
        first, last = usage.days_of(args.first, args.last)
    except usage.BadRange as exc:
        raise CliError(f"--{exc.field}: {exc.problem}") from None
    app = _served_app(args.app)
    report = (usage.report(_user_key(app, args.user, "--user"), first, last) if args.user
              else usage.by_user(app, first, last))
    if args.json:
        print(json.dumps(report, default=str, indent=2))
    else:
        print("\n".join(_user_usage(report) if args.user else _users_usage(report, args.limit)))
    return 0


def _money(value: float) -> str:
    return f"{value:,.4f}"


def _users_usage(report: dict, limit: int) -> list[str]:
    from eros.store.usage import PURPOSES

    lines = [f"app {report['app']}: usage {report['from']} .. {report['to']} (UTC days), estimated"
             f" {report['currency']} at list prices",
             f"{'user':<32} {'calls':>8} {'tokens':>12} " + " ".join(f"{p:>11}" for p in PURPOSES) + f" {'cost':>10}"]
    users = report["users"]
    for u in users[:limit]:
        lines.append(f"{u['user_id'][:32]:<32} {u['calls']:>8,} {u['tokens']:>12,} "
                     + " ".join(f"{u['purposes'][p]:>11,}" for p in PURPOSES) + f" {_money(u['estimated_cost']):>10}")
    if len(users) > limit:
        lines.append(f"... and {len(users) - limit} more users (--limit)")
    lines.append(f"{len(users)} users, {sum(u['tokens'] for u in users):,} tokens, "
                 f"{_money(sum(u['estimated_cost'] for u in users))} {report['currency']}")
    return lines + _unpriced(report)


def _user_usage(report: dict) -> list[str]:
    lines = [f"usage {report['from']} .. {report['to']} (UTC days), estimated {report['currency']} at list prices",
             f"{'day':<10} {'purpose':<10} {'model':<36} {'calls':>6} {'input':>10} {'output':>10} {'cost':>10}"]
    for day in report["days"]:
        for c in day["calls"]:
            estimate = "unpriced" if c["estimated_cost"] is None else _money(c["estimated_cost"])
            lines.append(f"{day['day']!s:<10} {c['purpose']:<10} {c['model'][:36]:<36} {c['calls']:>6,} "
                         f"{c['input_tokens']:>10,} {c['output_tokens']:>10,} {estimate:>10}")
    totals = report["totals"]
    lines.append(f"total: {totals['calls']:,} calls, {totals['tokens']:,} tokens, "
                 f"{_money(totals['estimated_cost'])} {report['currency']}")
    return lines + _unpriced(report)


def _unpriced(report: dict) -> list[str]:
    if not report["unpriced_models"]:
        return []
    return [f"not in the cost (no price; set MODEL_PRICES): {', '.join(report['unpriced_models'])}"]


def _day(value: str):
    from datetime import date

    try:
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {value!r}") from None


def cmd_chat(args) -> int:
    import httpx

    from eros.config import settings
    from eros_client import Client

    from .tokens import issue_token, local_jwt_key

    url = args.url or f"http://127.0.0.1:{settings().port}"
    for option, given in (("--url", url), ("--stream-url", args.stream_url)):
        if given and not given.lower().startswith(("http://", "https://")):
            raise BadInput(f"{option} {given!r} needs its scheme: http:// or https:// (e.g. {option} http://{given})")
    app = _local_app(args)
    token = args.token or issue_token(args.user, settings(), local_jwt_key(), app=app)
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    try:
        answer = client.get("/v1/personas")
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach the local stack at {url} ({type(exc).__name__}): start it with `make run`, "
                       f"or point at the one running (--url, or the PORT it runs on)") from None
    _refused_token(answer, url)
    try:
        personas = answer.raise_for_status().json()["personas"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        raise CliError(f"{url} answered GET /v1/personas with {answer.status_code} and no list of personas: is it"
                       " the eros API? (--url, or the PORT it runs on)") from None
    known = [p["id"] for p in personas]
    if args.persona and args.persona not in known:
        raise CliError(f"no persona {args.persona!r}: choose one of {', '.join(known)}")
    persona = args.persona or known[0]
    session = client.post("/v1/sessions", json={"persona_id": persona}).raise_for_status().json()
    print(f"session {session['id']} with {persona} — type a message, Ctrl-D to quit")
    # A stream that breaks off is asked for once more (the same client_turn_id: the stored reply is replayed).
    with Client(url, token, timeout=60, max_retries=1, stream_url=args.stream_url) as eros:
        for line in sys.stdin:
            if line.strip():
                _chat_turn(eros, session["id"], persona, line.strip(), args.stream)
    return 0


def _local_app(args) -> str | None:
    """The app of the local token ``eros chat`` and ``eros mcp`` make (``--app``; None: the first app's token, with
    no app claim). A ``--token`` names its own app."""
    if args.app is None:
        return None
    if getattr(args, "token", None):
        raise BadInput("--app names the app of the local token made for USER: a --token names its own app")
    return _app_id(args.app)


def _refused_token(answer, url: str) -> None:
    """A 401 from the API: the token was refused (an app it does not serve, another stack's signing key, an expired
    --token), in the API's own words."""
    if answer.status_code != 401:
        return
    try:
        why = answer.json().get("message") or "Unauthorized"
    except (ValueError, AttributeError):
        why = "Unauthorized"
    raise CliError(f"{url} refused the token: {why}")


def cmd_mcp(args) -> int:
    """The memory API as MCP tools over stdio (eros_client.mcp), for USER, against the running local stack: what an
    assistant on this machine starts (clients/python/README.md has the config). stdout is the MCP channel: every
    word for people goes to stderr."""
    import httpx

    from eros.config import settings

    from .tokens import issue_token, local_jwt_key

    try:
        from eros_client.mcp import serve
    except ImportError:
        raise CliError("the MCP SDK is not installed: pip install -e 'clients/python[mcp]' (`make venv` has it)") \
            from None
    cfg = settings()
    url = (args.url or f"http://127.0.0.1:{cfg.port}").rstrip("/")
    if not url.lower().startswith(("http://", "https://")):
        raise BadInput(f"--url {url!r} needs its scheme: http:// or https:// (e.g. --url http://{url})")
    key, app = local_jwt_key(), _local_app(args)
    whose = args.user if app is None else f"{args.user} (of app {app})"
    try:  # the token is tried once: an app the stack does not serve is said now, not by every tool
        answer = httpx.get(f"{url}/v1/personas", timeout=3,
                           headers={"Authorization": f"Bearer {issue_token(args.user, cfg, key, 60, app=app)}"})
    except httpx.HTTPError as exc:  # not fatal: the assistant may start before `make run`
        print(f"eros mcp: nothing answers at {url} ({type(exc).__name__}): start the local stack with `make run`;"
              " until then every tool answers api_unreachable", file=sys.stderr, flush=True)
    else:  # the assistant's log of the server (its stderr) says whose memories, from where
        _refused_token(answer, url)
        print(f"eros mcp: {whose}'s memories at {url}, as MCP tools over stdio", file=sys.stderr, flush=True)
    # A token made for each call, short-lived: an assistant that runs for days never holds an expired one.
    serve(url, lambda: issue_token(args.user, cfg, key, ttl_secs=300, app=app))
    return 0


def _chat_turn(eros, session_id: str, persona: str, content: str, stream: bool) -> None:
    """One turn of ``eros chat``: the reply's words printed as they come (``stream``) or whole, then what was
    recalled; an error is one line, ``[status code] message``, after what the reply had said so far."""
    import httpx

    from eros_client import ApiError

    began = False  # the reply's line was begun: an error goes on a line of its own
    try:
        if stream:
            for piece in (turn := eros.stream_turn(session_id, content)):
                print(piece if began else f"{persona}> {piece}", end="", flush=True)
                began = True
            result = turn.result
            print("" if began else f"{persona}> ")  # the reply's line ends (an empty reply has its prompt alone)
        else:
            result = eros.take_turn(session_id, content)
            print(f"{persona}> {result.reply}")
    except ApiError as error:
        print(f"{'\n' if began else ''}[{error.status} {error.code}] {error.message}", flush=True)
        return
    except httpx.TransportError as error:
        print(f"{'\n' if began else ''}[no answer] the connection broke ({type(error).__name__}): the message may "
              "have been stored", flush=True)
        return
    recalled = ", ".join(f"{r.layer}/{r.category or '-'}" for r in result.recalled) or "nothing"
    print(f"   (recalled: {recalled})")


def _webhooks_parser(sub) -> None:
    """`eros webhooks ACTION --app APP`: each action its own parser, as `eros keys`."""
    p = sub.add_parser("webhooks", help="an app's signed webhook for its memory events: set, show, delete, redrive")
    p.set_defaults(func=cmd_webhooks, url=None, rotate_secret=False)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, what in (("set", "where the app's events are posted (its secret printed when made or rotated)"),
                         ("show", "the app's webhook and its deliveries waiting and dead"),
                         ("delete", "stop posting (the deliveries not made yet are dropped)"),
                         ("redrive", "the dead deliveries due again")):
        a = actions.add_parser(action, help=what)
        if action == "set":
            a.add_argument("url", help="an https URL (http, and private addresses, with WEBHOOK_ALLOW_HTTP)")
            a.add_argument("--rotate-secret", action="store_true", help="a new signing secret in place of the old")
        a.add_argument("--app", required=True, help="whose webhook")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eros", description="Dreaming memory for companion chat")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the local stack: embedded Postgres, HTTP API, sweeper")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default: PORT, else 3000")
    p.add_argument("--no-sweep", dest="sweep", action="store_false", help="do not run the dreaming sweeper")
    p.add_argument("--concurrency", type=int, default=16,
                   help="chat containers (concurrent requests handled, like Lambda's concurrency; default 16)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("migrate", help="apply migrations and seed personas")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("token", help="print a local bearer token for USER")
    p.add_argument("user")
    p.add_argument("--ttl", type=int, default=86400)
    p.add_argument("--operator", action="store_true", help="with the operator scope (OPERATOR_SCOPE): the app's"
                                                           " routes (/v1/operator/...: the app's personas,"
                                                           " API keys and usage)")
    p.add_argument("--app", help="a user of APP (the token's eros_app claim, APP_CLAIM); default: the first app,"
                                 " default")
    p.set_defaults(func=cmd_token)

    p = sub.add_parser("chat", help="chat in the terminal against the running local stack")
    p.add_argument("user", nargs="?", default="local-user")
    p.add_argument("--persona")
    p.add_argument("--url", help="the local stack's address; default http://127.0.0.1:PORT (3000)")
    p.add_argument("--token", help="a bearer token for a deployed API (default: a local token for USER)")
    p.add_argument("--stream-url", help="where streamed turns go when that is not --url (a deployed stack's StreamUrl"
                                        " URL)")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="ask for each reply whole (the JSON route) instead of word by word")
    p.add_argument("--app", help="USER is a user of APP (the local token's app claim); default: the first app,"
                                 " default")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("mcp", help="serve USER's memories as MCP tools over stdio (search, list, add, edit, forget,"
                                   " history, context) for an assistant, against the running local stack")
    p.add_argument("user", nargs="?", default="local-user")
    p.add_argument("--url", help="the local stack's address; default http://127.0.0.1:PORT (3000)")
    p.add_argument("--app", help="USER is a user of APP (the local token's app claim); default: the first app,"
                                 " default")
    p.set_defaults(func=cmd_mcp)

    p = sub.add_parser("forget", help="erase everything stored about USER (what DELETE /v1/me does), after showing"
                                      " what that is and asking for the user id again")
    p.add_argument("user")
    p.add_argument("--app", default="default", help="the user's app (default: the first app, default)")
    p.add_argument("--yes", action="store_true", help="erase without asking (a script; needed without a terminal)")
    p.set_defaults(func=cmd_forget)

    p = sub.add_parser("backfill-episodes", help="write episodes for sessions extracted before episodes existed"
                                                 " (one LLM call and one embedding per session, within each user's"
                                                 " budget); run again until it writes none")
    p.add_argument("--user", help="one user's sessions (a user of --app); default: everyone's, oldest first")
    p.add_argument("--app", help="the app's users only; default: every app's (with --user: the first app's,"
                                 " default)")
    p.add_argument("--limit", type=int, default=100, help="sessions in this run (default 100)")
    p.set_defaults(func=cmd_backfill_episodes)

    p = sub.add_parser("import", help="import a JSONL file of conversations (one a line: conversation_id, user_id,"
                                      " persona_id, messages with role, content, created_at); safe to run again")
    p.add_argument("file")
    p.add_argument("--user", help="every conversation is this user's (lines may then leave user_id out)")
    p.add_argument("--app", help="the lines' user_id (and --user) are users of APP; default: the first app,"
                                 " default")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=cmd_import)

    # Each action its own parser, so that options may come before or after the ids (`eros personas set --app acme
    # guide ...`): an optional positional would take nothing at the first option and refuse the id after it.
    p = sub.add_parser("personas", help="an app's personas: list, set (a new version) or retire one")
    app_help = "whose personas (default: the first app, default)"
    p.add_argument("--app", default="default", help=app_help)
    p.set_defaults(func=cmd_personas, action="list", id=None, name=None, description=None, prompt_file=None)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    a = actions.add_parser("list", help="the app's personas, retired ones too (the default)")
    a.add_argument("--app", default=argparse.SUPPRESS, help=app_help)  # SUPPRESS: the one given before it stays
    a = actions.add_parser("set", help="make one, or give it a new version when its text changed")
    a.add_argument("id")
    a.add_argument("--name")
    a.add_argument("--description")
    a.add_argument("--prompt-file", help="a text file with the persona's system prompt")
    a.add_argument("--app", default=argparse.SUPPRESS, help=app_help)
    a = actions.add_parser("retire", help="list it no more and start no session with it (its sessions go on)")
    a.add_argument("id")
    a.add_argument("--app", default=argparse.SUPPRESS, help=app_help)

    # Each action its own parser, so that options may come before or after the ids (`eros keys rotate --app acme
    # KEY_ID`): an optional positional would take nothing at the first option and refuse the id after it.
    p = sub.add_parser("apps", help="the deployment's apps (tenants): list, create, set (settings), export or delete"
                                    " one")
    p.set_defaults(func=cmd_apps, action="list", id=None, pairs=[], sets=[], name=None, out=None, yes=False)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.add_parser("list", help="every app: users, live keys, settings (the default)")
    a = actions.add_parser("create", help="a new app")
    a.add_argument("id", help="2 to 40 of a-z 0-9 -, starting with a letter")
    a.add_argument("--name", help="the app's name (1 to 200 characters)")
    a.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="one of the app's settings (again for more)")
    a = actions.add_parser("set", help="change an app's settings")
    a.add_argument("id")
    a.add_argument("pairs", nargs="+", metavar="KEY=VALUE", help="the app's settings (KEY=none clears one)")
    a = actions.add_parser("export", help="an app's whole record, as JSON lines")
    a.add_argument("id")
    a.add_argument("--out", help="the file to write (never overwritten); default: standard output")
    a = actions.add_parser("delete", help="delete an app whole, after showing what that is and asking for its id")
    a.add_argument("id")
    a.add_argument("--yes", action="store_true", help="without asking (a script; needed without a terminal)")

    p = sub.add_parser("keys", help="an app's API keys for its servers: create, list, rotate or revoke one")
    p.set_defaults(func=cmd_keys, key_id=None, name=None)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, what in (("create", "a new key, printed once"), ("list", "the app's keys, revoked ones too"),
                         ("rotate", "a new key in place of KEY_ID, which is revoked"),
                         ("revoke", "refuse KEY_ID from now on")):
        a = actions.add_parser(action, help=what)
        if action in ("rotate", "revoke"):
            a.add_argument("key_id", help="the key's id (`eros keys list --app APP`)")
        a.add_argument("--app", required=True, help="whose keys")
        if action == "create":
            a.add_argument("--name", help="what the key is for (default: default)")

    _webhooks_parser(sub)

    p = sub.add_parser("usage", help="tokens, provider calls and estimated cost per user (or one user's per day)")
    p.add_argument("--from", dest="first", type=_day, help="first UTC day (YYYY-MM-DD); default 30 days ago")
    p.add_argument("--to", dest="last", type=_day, help="last UTC day, included; default today")
    p.add_argument("--user", help="one user's report per day, purpose and model")
    p.add_argument("--app", default="default", help="whose users (default: the first app, default)")
    p.add_argument("--limit", type=int, default=50, help="users listed (default 50)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=cmd_usage)

    p = sub.add_parser("sweep", help="run one dreaming sweep now (claims idle sessions and extracts them)")
    p.add_argument("--now", action="store_true", help="every session with new messages counts as idle")
    p.add_argument("--json", action="store_true", help="the sweep's answer and each job's, as JSON")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("events", help="the memory events the local stack's sweeps published (docs/EVENTS.md)")
    p.add_argument("--follow", "-f", action="store_true", help="wait for more, as tail -f does")
    p.add_argument("--user", help="only this user's events (a user of --app: default, the first app, default)")
    p.add_argument("--app", help="only this app's events; default: every app's (with --user: the first app's)")
    p.add_argument("--json", action="store_true", help="each event as its JSON document, a line each")
    p.set_defaults(func=cmd_events)
    p = sub.add_parser("stop", help="stop the running local stack and its embedded Postgres (`make stop`)")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("invoke", help="run a function's real handler on an event file, with the local database")
    p.add_argument("function", choices=["chat", "chat-stream", "sweeper", "extract"],
                   help="chat-stream: the streamed turn's function, its chunks printed as they come; the migrate"
                        " function answers CloudFormation: locally, `eros migrate` does its work")
    p.add_argument("event", help="a JSON event file (events/ has one for each function)")
    p.add_argument("--as", dest="as_user", metavar="USER",
                   help="chat-stream: send the turn as USER (a fresh local token in the event's authorization)")
    p.add_argument("--app", help="chat-stream: --as USER is a user of APP (the token's app claim); default: the"
                                 " first app, default")
    p.set_defaults(func=cmd_invoke)

    p = sub.add_parser("calibrate", help="derive the similarity thresholds for the embedding model from this"
                                         " deployment's memories, store them and show what was chosen")
    p.add_argument("--dry-run", action="store_true", help="show what would be chosen; store nothing")
    p.add_argument("--sample", type=_sample, default=3000,
                   help="the most memories whose nearest neighbour is read (50 to 20000; default 3000)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("doctor", help="check the database, the schema version, the providers and the embedder's"
                                      " calibration (exit 1 if a check failed)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)

    args = parser.parse_args(argv)
    from eros.config import SettingsError

    try:
        with _logs_on_stderr():
            return args.func(args)
    except KeyboardInterrupt:
        return 130
    except CliError as exc:
        print(f"eros {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except SettingsError as exc:  # names each variable: nothing more to show
        print(f"eros {args.command}: bad setting: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        if _debugging():
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"eros {args.command}: {type(exc).__name__}: {first} (EROS_DEBUG=1 shows where)", file=sys.stderr)
        return 1


def _debugging() -> bool:
    from eros.config import settings

    try:
        return settings().eros_debug
    except Exception:  # the settings themselves are what failed: EROS_DEBUG as pydantic would read it
        return os.environ.get("EROS_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


if __name__ == "__main__":
    sys.exit(main())
