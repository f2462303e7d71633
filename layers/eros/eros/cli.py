"""The ``eros`` command: serve (the local stack), migrate, token, chat, sweep, forget, usage."""

from __future__ import annotations

import argparse
import os
import sys


def _database() -> tuple[str, str]:
    """(the database URL, what to call it): DATABASE_URL if set, else the embedded Postgres in .data/pg,
    started on demand. The URL is then put in the environment, where the functions this process runs
    read their settings (the local stack is their Lambda environment)."""
    from .config import settings
    from .local import data_dir, embedded_postgres

    configured = settings().database_url
    if configured is not None:
        return configured.get_secret_value(), "DATABASE_URL"
    url = embedded_postgres()
    os.environ["DATABASE_URL"] = url
    settings.cache_clear()
    return url, f"embedded Postgres 16 + pgvector in {data_dir() / 'pg'}"


def cmd_migrate(args) -> int:
    from .config import settings
    from .credentials import database_dsn
    from .migrate import migrate

    if not settings().database_secret_arn:
        _database()
    applied = migrate(database_dsn(settings()))
    print(f"migrations applied: {', '.join(applied) if applied else 'none (up to date)'}")
    return 0


def cmd_token(args) -> int:
    from .config import settings
    from .local import issue_token, local_jwt_key

    print(issue_token(args.user, settings(), local_jwt_key(), ttl_secs=args.ttl))
    return 0


def cmd_serve(args) -> int:
    from . import providers
    from .config import settings
    from .local import data_dir, make_server, run_local_sweeper
    from .migrate import migrate

    url, database = _database()
    migrate(url)
    port = args.port or settings().port
    base = f"http://{args.host}:{port}"
    # Exports (GET /v1/export) go to a folder this server serves, in place of S3 and its presigned URLs.
    os.environ.setdefault("EXPORT_DIR", str(data_dir() / "exports"))
    os.environ.setdefault("EXPORT_BASE_URL", f"{base}/local")
    settings.cache_clear()
    cfg = settings()
    server = make_server(cfg, args.host, port, concurrency=args.concurrency)
    described = providers.describe()
    sweeper = run_local_sweeper(cfg) if args.sweep else None  # the local EventBridge schedule
    print(f"""
eros local stack
  database : {database}
  chat LLM : {described['llm']}
  embedder : {described['embedder']}
  dreaming : {f"every {cfg.dreaming_tick_secs}s, sessions idle for {cfg.dreaming_idle_secs}s" if sweeper else "off"}
  API      : {base}

Try it:
  TOKEN=$(.venv/bin/eros token alice)
  curl -s -X POST {base}/v1/sessions -H "Authorization: Bearer $TOKEN" -d '{{"persona_id":"luna"}}'
  curl -s -X POST {base}/v1/sessions/SESSION_ID/turns -H "Authorization: Bearer $TOKEN" \\
       -d '{{"content":"I moved to Tokyo last week"}}'
  .venv/bin/eros chat alice          # or chat in the terminal
""", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def cmd_sweep(args) -> int:
    from .local import sweep_locally

    _database()
    result = sweep_locally()
    print(result)
    return 0


def cmd_forget(args) -> int:
    """What ``DELETE /v1/me`` does, for an operator: erase every row of USER and their export files."""
    from .records import erase

    _database()
    erased = erase(args.user)
    print(f"erased {args.user}: " + ", ".join(f"{count} {kind.replace('_', ' ')}" for kind, count in erased.items()))
    return 0


def cmd_usage(args) -> int:
    """An operator's usage report: every user's tokens, calls and estimated cost in a range of UTC days
    (costliest first), or one user's per day, purpose and model (what ``GET /v1/usage`` answers)."""
    import json

    from . import usage

    _database()
    try:
        first, last = usage.days_of(args.first, args.last)
    except usage.BadRange as exc:
        print(f"eros usage: --{exc}", file=sys.stderr)
        return 2
    report = usage.report(args.user, first, last) if args.user else usage.by_user(first, last)
    if args.json:
        print(json.dumps(report, default=str, indent=2))
    else:
        print("\n".join(_user_usage(report) if args.user else _users_usage(report, args.limit)))
    return 0


def _money(value: float) -> str:
    return f"{value:,.4f}"


def _users_usage(report: dict, limit: int) -> list[str]:
    from .store.usage import PURPOSES

    lines = [f"usage {report['from']} .. {report['to']} (UTC days), estimated {report['currency']} at list prices",
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

    from .config import settings
    from .local import issue_token, local_jwt_key

    token = issue_token(args.user, settings(), local_jwt_key())
    client = httpx.Client(base_url=args.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    try:
        personas = client.get("/v1/personas").raise_for_status().json()["personas"]
    except httpx.HTTPError as exc:
        print(f"cannot reach the local stack at {args.url} ({exc}); start it with `make run`", file=sys.stderr)
        return 1
    persona = args.persona or personas[0]["id"]
    session = client.post("/v1/sessions", json={"persona_id": persona}).raise_for_status().json()
    print(f"session {session['id']} with {persona} — type a message, Ctrl-D to quit")
    for line in sys.stdin:
        if not line.strip():
            continue
        response = client.post(f"/v1/sessions/{session['id']}/turns", json={"content": line.strip()})
        body = response.json()
        if response.status_code != 200:
            print(f"[{response.status_code}] {body.get('message')}")
            continue
        recalled = ", ".join(f"{r['layer']}/{r['category'] or '-'}" for r in body["recalled"]) or "nothing"
        print(f"{persona}> {body['reply']}\n   (recalled: {recalled})")
    return 0


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
    p.set_defaults(func=cmd_token)

    p = sub.add_parser("chat", help="chat in the terminal against the running local stack")
    p.add_argument("user", nargs="?", default="local-user")
    p.add_argument("--persona")
    p.add_argument("--url", default="http://127.0.0.1:3000")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("forget", help="erase everything stored about USER (what DELETE /v1/me does)")
    p.add_argument("user")
    p.set_defaults(func=cmd_forget)

    p = sub.add_parser("usage", help="tokens, provider calls and estimated cost per user (or one user's per day)")
    p.add_argument("--from", dest="first", type=_day, help="first UTC day (YYYY-MM-DD); default 30 days ago")
    p.add_argument("--to", dest="last", type=_day, help="last UTC day, included; default today")
    p.add_argument("--user", help="one user's report per day, purpose and model")
    p.add_argument("--limit", type=int, default=50, help="users listed (default 50)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=cmd_usage)

    p = sub.add_parser("sweep", help="run one dreaming sweep now (claims idle sessions and extracts them)")
    p.set_defaults(func=cmd_sweep)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
