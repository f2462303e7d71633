"""The schema can be sharded by user (issue 13): every table of a user's data carries the user key, and every
statement of the stores and of the database's functions (eros/sql/functions) that touches one names it, so a
database distributed by user (Citus, or partitions by hash of the user) can send it to one shard. The statements
that are cross-user by design are listed here with the reason; a new statement is either scoped by its user or
added to the list on purpose."""

from __future__ import annotations

import ast
import re

import pytest
from helpers import ROOT

pytestmark = pytest.mark.unit

STORES = ROOT / "layers" / "eros" / "eros" / "store"
FUNCTIONS = ROOT / "layers" / "eros" / "eros" / "sql" / "functions"
USER_TABLES = {"chat_sessions", "chat_messages", "companion_memories", "persona_instances", "user_deep_pass",
               "user_usage", "user_model_usage", "relationship_terms", "user_reembedding",
               "memory_events", "user_event_sequence",  # the events' outbox and each user's event counter (0035)
               "webhook_deliveries"}  # each event's delivery to its app's webhook (0037): the user's data
# Reference data: on every shard. A user's own characters (migration 0030) are persona rows too: few and small,
# replicated with the app's, written through the database's functions only.
SHARED_TABLES = {"personas", "persona_versions", "provider_blocks", "schema_migrations", "schema_objects",
                 "embedding_space", "embedding_calibrations",  # the deployment's embedding model (migration 0032)
                 "apps", "app_keys",  # the apps and their keys (migration 0036): few, keyed by the app
                 "app_webhooks"}  # an app's webhook endpoint (migration 0037): one per app at most
# Cross-user by design, each with why. On a sharded database these run on every shard (a fan-out) or per shard.
CROSS_USER = {
    "dreaming._CLAIM_TEMPLATE": "the sweeper claims idle sessions of everyone: run per shard (the follow-on claim "
                                "of one user's next imported session adds the user to it)",
    "dreaming._EXPIRE": "retention deletes old extracted messages of everyone: run per shard",
    "dreaming.load": "the in-flight count and backlog age of the whole deployment: summed over shards",
    "dreaming.redrive": "an operator re-drives every given-up session (or one user's: then scoped)",
    "deep_pass._CLAIM": "the sweeper claims users due a deep pass: run per shard",
    "usage.calls_by_user": "the operators' report over every user: summed over shards",
    "usage.tokens_by_user": "the same report's token totals",
    "grants.grant_app_role": "the app role's grants, on whole tables: DDL, not a statement on anyone's rows",
    "embedding.holds": "whether any vector of the deployment's recorded model is left, asked only when another "
                       "model is configured: every shard",
    "reembedding._CLAIM": "the sweeper claims users due a re-embedding after a change of embedder: run per shard",
    "reembedding._BEGIN": "a change of embedder queues every user that has rows: run on every shard",
    "reembedding._PROGRESS": "how far a re-embedding is, over the whole deployment: summed over shards",
    "reembedding.switch": "the switch to the new model's vectors: the deployment's, on every shard at once",
    "reembedding.cancel": "a re-embedding stopped: every shard",
    "reembedding.late_rows": "rows of any user written since their user's job was done, before the switch: per shard",
    "reembedding.any_pending": "whether any user's job is left: every shard",
    "reembedding.redrive": "an operator re-drives every given-up user: every shard",
    "events._PENDING": "the sweeper publishes every user's events, oldest first: run per shard (a user's events are "
                       "on the user's shard, in their order)",
    "events.published": "the published events, by the ids the drain just read: per shard",
    "apps.users_by_app": "the operator's list of apps counts each app's users: summed over shards",
    "events.record_memory_event": "a trigger on one memory row (its type names the table): writes the event of "
                                  "that row's own user, on that row's shard",
    "account.app_users": "an app's deletion finds every user of the app (engine.app_of): every shard",
    "account.scan": "what is left of an app being deleted, in every table: summed over shards",
    "account._ERASE_APP": "an app's deletion removes its users' leftover events and counters (every shard), then its "
                          "personas, keys and row",
    "embedding.keep_embedding_space": "the same question, asked by the trigger only when a vector of another "
                                      "model than the recorded one is written: every shard",
    "webhooks._FIND": "an app's webhook with the counts of its users' deliveries waiting and dead: summed over shards",
    "webhooks._REDRIVE": "an app's operator redrives the dead deliveries of every user of the app: every shard",
    "webhooks._CLAIM": "the sweeper claims the due deliveries of everyone: run per shard",
    "webhooks._PRUNE": "the sweeper forgets everyone's deliveries made a day ago: run per shard",
}
# Not scoped by the user yet: each finds its rows by an id (a session, a memory, a claim) that its caller got
# from a user-scoped statement, so it is correct on one database, but a sharded one would have to ask every
# shard. They are the work left before sharding (docs/CAPACITY.md, "Past one writer"); this list may only
# shrink: a new statement names its user.
NOT_YET_SCOPED: set[str] = set()
# Parts of statements, not statements: every statement built from them adds the user's condition.
FRAGMENTS = {
    "memories.FROM": "the memory listing's FROM; each use adds WHERE m.user_id = ...",
}


def statements() -> list[tuple[str, str]]:
    """(module.owner, SQL text) for every string of the stores that names an engine table; the owner is the
    module-level name or the function it is in."""
    found = []
    for path in sorted(STORES.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            owner = (node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                     else node.targets[0].id if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                     else None)
            if owner is None:
                continue
            for text in _strings(node):
                if "engine." in text:
                    found.append((f"{path.stem}.{owner}", text))
    return found


# A function's body: what follows its name, between the first pair of $$ (a DO block's $do$ is not one).
_BODY = re.compile(r"(?:FUNCTION|PROCEDURE) engine\.(\w+)\b.*?\$\$(.*?)\$\$", re.S)


def function_statements() -> list[tuple[str, str]]:
    """(file.function, SQL text) for each statement of each function body of eros/sql/functions, comments
    removed: the turn's, recall's and the spend's statements run there, not in the stores."""
    found = []
    for path in sorted(FUNCTIONS.glob("*.sql")):
        text = re.sub(r"--[^\n]*", "", path.read_text())
        for function in _BODY.finditer(text):
            found += [(f"{path.stem}.{function[1]}", statement) for statement in function[2].split(";")
                      if "engine." in statement]
    return found


def _strings(node: ast.AST) -> list[str]:
    """Each outermost string of ``node``: a literal, an f-string's or a ``+`` chain's constant parts joined."""
    out = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            out.append(child.value)
        elif isinstance(child, ast.JoinedStr) or (isinstance(child, ast.BinOp) and isinstance(child.op, ast.Add)):
            out.append(" ".join(str(c.value) for c in ast.walk(child)
                                if isinstance(c, ast.Constant) and isinstance(c.value, str)))
        else:
            out.extend(_strings(child))
    return out


# ``store.claims`` writes a dreaming job's lease, backoff and give-up once for every job table: its statements
# say ``engine.{table}``, and name the user as any other (``user_id = %(user_id)s``).
JOB_TABLES = {"chat_sessions", "user_deep_pass", "user_reembedding"}


def tables(sql: str) -> set[str]:
    return set(re.findall(r"engine\.(\w+)", sql)) | (JOB_TABLES if "engine.{table}" in sql else set())


def test_every_table_of_a_users_data_has_the_user_key():
    migrations = "\n".join(p.read_text() for p in sorted((ROOT / "layers/eros/eros/migrations").glob("*.sql")))
    first_named = {new: old for old, new in re.findall(r"ALTER TABLE engine\.(\w+) RENAME TO (\w+)", migrations)}
    created = set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?engine\.(\w+)", migrations)) - set(first_named.values())
    assert created | first_named.keys() == USER_TABLES | (SHARED_TABLES - {"schema_migrations"})
    for table in USER_TABLES:
        first = first_named.get(table, table)
        body = re.search(rf"CREATE TABLE (?:IF NOT EXISTS )?engine\.{first} \((.*?)\n\);", migrations, re.S)[1]
        added = re.search(rf"ALTER TABLE engine\.{first} ADD COLUMN user_id", migrations)
        assert re.search(r"^\s*user_id\s+text", body, re.M) or added, table


def test_every_statement_on_a_users_data_names_the_user():
    in_functions = function_statements()
    assert len({owner for owner, _ in in_functions}) >= 10  # the scan sees the functions' SQL
    found = statements() + in_functions
    assert len(found) > 30  # the scan sees the stores' SQL
    unscoped = sorted({owner for owner, sql in found
                       if tables(sql) & USER_TABLES and owner not in CROSS_USER and owner not in FRAGMENTS
                       and "user_id" not in sql and "%(user)s" not in sql})
    new, done = set(unscoped) - NOT_YET_SCOPED, NOT_YET_SCOPED - set(unscoped)
    assert not new, f"not scoped by the user (scope it, or list it in CROSS_USER with why): {new}"
    assert not done, f"scoped now: take them off NOT_YET_SCOPED: {done}"


def test_every_job_table_is_a_table_of_a_users_data():
    from eros.store import claims, deep_pass, dreaming, reembedding

    specs = [v for module in (dreaming, deep_pass, reembedding) for v in vars(module).values()
             if isinstance(v, claims.JobTable)]
    assert {spec.table for spec in specs} == JOB_TABLES
    assert sum("engine.{table}" in sql for owner, sql in statements() if owner.startswith("claims.")) >= 6


def test_the_cross_user_list_names_only_statements_that_exist():
    owners = {owner for owner, _ in statements() + function_statements()}
    assert set(CROSS_USER) <= owners, set(CROSS_USER) - owners


# --- apps (migration 0036): the same proof for the app ------------------------------------------------------------
# The user key names the app (eros.apps: a bare subject is the first app's, any other app's users are
# '<app>\x1f<subject>'), so each statement above that names its user is scoped by the app as well. What is left to
# hold: the statements that span users either name the app they read, or span the apps on purpose (listed with why);
# and the app's own rows (its personas, its keys) are found by the app.
ACROSS_APPS = {
    "dreaming._CLAIM_TEMPLATE": "the deployment's sweeper claims idle sessions of every app; each job runs with its "
                                "user's app's settings (eros.dreaming.jobs.run: eros.apps.settings_for)",
    "dreaming.load": "the deployment's dreaming load and backlog age, over every app (its alarms are the operator's)",
    "dreaming.redrive": "the deployment's operator re-drives given-up sessions (or one user's: then scoped)",
    "deep_pass._CLAIM": "the sweeper claims users of every app due a deep pass",
    "grants.grant_app_role": "DDL",
    "embedding.holds": "the embedding model is the deployment's, one for every app",
    "embedding.keep_embedding_space": "the same: the deployment's model",
    "reembedding._CLAIM": "a change of the deployment's embedder re-embeds every app's users",
    "reembedding._BEGIN": "the same", "reembedding._PROGRESS": "the same", "reembedding.switch": "the same",
    "reembedding.cancel": "the same", "reembedding.late_rows": "the same", "reembedding.any_pending": "the same",
    "reembedding.redrive": "the same",
    "events._PENDING": "the sweeper publishes every app's events to the deployment's bus; each names its app "
                       "(eros.events.envelope), and subscribers filter by it",
    "events.published": "by the ids the drain just read",
    "apps.users_by_app": "the deployment's operator's list of apps, with each app's users",
    "events.record_memory_event": "a trigger on one memory row: that row's own user's event",
    "webhooks._CLAIM": "the deployment's sweeper delivers every app's due events, each to its own app's endpoint "
                       "(joined by the delivery's app_id)",
    "webhooks._PRUNE": "the deployment's sweeper forgets delivered rows of every app alike",
}
APP_TABLES = {"personas", "persona_versions", "app_keys", "apps", "app_webhooks"}
# ... and the few that read every app's rows on purpose.
EVERY_APP = {
    "apps.every": "the deployment's operator lists the apps (eros apps list), and retention reads each app's days",
    "personas.keep_user_persona": "its second statement writes the version row of the character its first wrote, "
                                  "of_owner's",
}


def _names_the_app(sql: str) -> bool:
    return bool(re.search(r"app_of|%\(app\)s|\bapp_id\b|of_app", sql))


def test_every_statement_across_users_names_its_app_or_spans_apps_on_purpose():
    found = dict(statements() + function_statements())
    assert set(ACROSS_APPS) <= set(CROSS_USER), set(ACROSS_APPS) - set(CROSS_USER)
    per_app = set(CROSS_USER) - set(ACROSS_APPS)
    assert {"dreaming._EXPIRE", "usage.calls_by_user", "usage.tokens_by_user"} <= per_app
    unscoped = {owner for owner in per_app if not _names_the_app(found[owner])}
    assert not unscoped, f"span users but name no app (scope them, or list them in ACROSS_APPS with why): {unscoped}"


def test_every_statement_on_an_apps_rows_names_the_app_or_a_user_of_it():
    """An app's personas, keys and row are found by the app (or, for a user's character and the persona of a user's
    session, by the user, whose key names the app); a key by its secret's hash (eros.apps.from_key)."""
    found = statements() + function_statements()
    loose = sorted({owner for owner, sql in found if tables(sql) & APP_TABLES and not _names_the_app(sql)
                    and not re.search(r"user_id|owner|%\(user\)s|USABLE|secret_sha256", sql)
                    and owner not in {"grants.grant_app_role"} | EVERY_APP.keys()})
    assert not loose, f"statements on an app's rows that name neither the app nor a user: {loose}"


@pytest.mark.parametrize("app, subject", [("default", "alice"), ("acme", "alice"), ("acme", "default"),
                                          ("acme", "globex:alice"), ("globex", "acme\u00a0alice"),
                                          ("default", "auth0|42"), ("ab", "用户")])
def test_the_user_key_names_its_app_in_python_and_in_sql(db, app, subject):
    from eros import apps

    key = apps.user_key(app, subject)
    assert apps.split(key) == (app, subject)
    assert db.execute("SELECT engine.app_of(%s) AS app", (key,)).fetchone()["app"] == app


def test_two_apps_users_of_one_subject_never_share_a_key_and_the_separator_is_refused_in_a_subject():
    from eros import apps

    keys = {apps.user_key(app, "alice") for app in ("default", "acme", "globex")}
    assert len(keys) == 3
    assert apps.unusable_subject("acme\x1falice") and apps.unusable_subject("\x1f")
    assert apps.unusable_subject("alice") is None
