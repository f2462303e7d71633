"""The user tables as tables PARTITIONED BY HASH (user_id), made from a migrated, empty schema (issue 13,
"Past one database"): the shape a database distributed by user needs, whether Postgres's own hash
partitions or Citus's shards. For tests and benches only, in a scratch database: production stays
unpartitioned, and nothing here is a migration. tests/test_partitioned_by_user.py runs the store's
unchanged SQL on it; bench/partitioned_recall.py times it against the plain schema.

The conversion reads the migrated schema from the catalog (so an index or a constraint a new migration adds
follows without an edit here) and changes only what partitioning forces:

* A partitioned table's primary key and unique constraints must include the partition key: ``(id)``
  becomes ``(id, user_id)``. Where that makes two constraints of one table equal (chat_sessions' primary key
  and migration 0010's ``UNIQUE (id, user_id)``), they become one: the primary key.
* A foreign key must reference a unique constraint, so one that references a partitioned table carries
  ``user_id`` on both sides: ``(session_id) REFERENCES chat_sessions (id)`` becomes ``(session_id, user_id)
  REFERENCES chat_sessions (id, user_id)``, which also says that a row's session (instance, successor) is
  its own user's. ``ON DELETE SET NULL`` names the column it nulls (``SET NULL (session_id)``, PostgreSQL
  15+): ``user_id`` is NOT NULL, and still the row's. A key that becomes equal to another one of its table
  (chat_messages' two keys to its session) is kept once.
* Storage parameters (``toast_tuple_target``) go on each partition: a partitioned table stores nothing.

Every other index is recreated on the partitioned parent as the migrations define it (each partition gets
its own copy), and so is every trigger (a row trigger of the parent fires for each partition's rows); every
CHECK, default, generated column and identity is kept, a view over a converted table (a previous release's name
of it, e.g. 0022's ``user_consolidation``) is made again over the partitioned one, and the application role's
grants are applied again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

import psycopg
from psycopg.abc import Params, Query
from psycopg.conninfo import make_conninfo

from eros.db import connect
from eros.migrate import grant_app_role, migrate
from eros.store import recall as recall_store

# The user tables a turn, a recall, the claim and an extraction touch. chat_messages joined them with
# migration 0013, whose turn key (the conflict target of the store's INSERT ... ON CONFLICT) names user_id,
# as partitioning forces every unique key to; its foreign key to the sessions already carried user_id.
TABLES = ("persona_instances", "chat_sessions", "chat_messages", "companion_memories", "user_deep_pass",
          "user_usage", "user_model_usage", "relationship_terms")
PARTITIONS = 4
KEY = "user_id"


@dataclass
class Conversion:
    """What ``partition_by_user`` did: the tables, their partitions, and each key it had to change."""

    tables: tuple[str, ...]
    partitions: int
    changes: list[str] = field(default_factory=list)


def _match(pattern: str | re.Pattern[str], text: str) -> re.Match[str]:
    found = re.fullmatch(pattern, text)
    if found is None:
        raise ValueError(f"a definition this conversion does not know: {text}")
    return found


def _columns(text: str) -> list[str]:
    return [c.strip() for c in text.split(",")]


def _listed(columns: list[str]) -> str:
    return ", ".join(columns)


def _with_key(columns: list[str]) -> list[str]:
    return columns if KEY in columns else [*columns, KEY]


def _catalog(conn: Any, tables: tuple[str, ...]) -> dict[str, list[dict]]:
    names = [f"engine.{t}" for t in tables]
    keys = conn.execute(
        "SELECT conrelid::regclass::text AS owner, conname AS name, contype AS kind,"
        "       pg_get_constraintdef(oid) AS definition, confrelid::regclass::text AS target"
        " FROM pg_constraint WHERE contype IN ('p', 'u', 'f')"
        "   AND (conrelid = ANY (%(t)s::regclass[]) OR confrelid = ANY (%(t)s::regclass[]))"
        " ORDER BY array_position(ARRAY['p', 'u', 'f'], contype::text), conrelid::regclass::text, conname",
        {"t": names}).fetchall()
    indexes = conn.execute(
        "SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS definition"
        " FROM pg_index i WHERE i.indrelid = ANY (%(t)s::regclass[])"
        "   AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid AND c.contype IN ('p', 'u'))"
        " ORDER BY 1", {"t": names}).fetchall()
    triggers = conn.execute(
        "SELECT tgname AS name, pg_get_triggerdef(oid) AS definition FROM pg_trigger"
        " WHERE tgrelid = ANY (%(t)s::regclass[]) AND NOT tgisinternal ORDER BY 1", {"t": names}).fetchall()
    options = conn.execute("SELECT relname AS name, reloptions AS options FROM pg_class"
                           " WHERE oid = ANY (%(t)s::regclass[]) AND reloptions IS NOT NULL", {"t": names}).fetchall()
    views = conn.execute(
        "SELECT DISTINCT v.oid::regclass::text AS name, pg_get_viewdef(v.oid) AS definition"
        " FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class v ON v.oid = r.ev_class"
        " WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = ANY (%(t)s::regclass[])"
        "   AND v.relkind = 'v' AND v.oid <> d.refobjid ORDER BY 1", {"t": names}).fetchall()
    return {"keys": keys, "indexes": indexes, "triggers": triggers, "options": options, "views": views}


def _unique_keys(keys: list[dict], conversion: Conversion) -> list[tuple[str, str]]:
    """(owner, ADD CONSTRAINT clause) for the partitioned tables' primary keys and unique constraints, with
    the partition key added; a constraint that comes out equal to an earlier one of its table is dropped
    (the primary key comes first)."""
    out: list[tuple[str, str]] = []
    seen: dict[tuple[str, tuple[str, ...]], str] = {}
    for key in keys:
        if key["kind"] == "f":
            continue
        kind, listed = _match(r"(PRIMARY KEY|UNIQUE) \((.*)\)", key["definition"]).groups()
        columns = _with_key(_columns(listed))
        if (key["owner"], tuple(sorted(columns))) in seen:
            conversion.changes.append(f"{key['owner']}: {key['name']} {key['definition']} is the same key as"
                                      f" {seen[key['owner'], tuple(sorted(columns))]} now: one index, not two")
            continue
        seen[key["owner"], tuple(sorted(columns))] = key["name"]
        if columns != _columns(listed):
            conversion.changes.append(f"{key['owner']}: {kind} ({listed}) -> {kind} ({_listed(columns)})")
        out.append((key["owner"], f"ADD CONSTRAINT {key['name']} {kind} ({_listed(columns)})"))
    return out


_FOREIGN = re.compile(r"FOREIGN KEY \((?P<local>[^)]*)\) REFERENCES (?P<target>[\w.]+)\((?P<remote>[^)]*)\)"
                      r"(?P<rest>.*)")


def _local_columns(key: dict) -> list[str]:
    return _columns(_match(_FOREIGN, key["definition"])["local"])


def _foreign_keys(keys: list[dict], partitioned: set[str], conversion: Conversion) -> list[tuple[str, str]]:
    """(owner, ADD CONSTRAINT clause) for every foreign key from or to a partitioned table; one that references
    a partitioned table gets the partition key on both sides."""
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    # The keys that already carry user_id first: of two that come out equal, the one a migration wrote stays.
    foreign = sorted((k for k in keys if k["kind"] == "f"), key=lambda k: KEY not in _local_columns(k))
    for key in foreign:
        definition = key["definition"]
        if key["target"] in partitioned:
            parts = _match(_FOREIGN, definition).groupdict()
            local, remote = _columns(parts["local"]), _columns(parts["remote"])
            rest = parts["rest"]
            if KEY not in local:
                rest = rest.replace("ON DELETE SET NULL", f"ON DELETE SET NULL ({_listed(local)})")
                local, remote = [*local, KEY], [*remote, KEY]
            definition = (f"FOREIGN KEY ({_listed(local)}) REFERENCES {parts['target']}({_listed(remote)}){rest}")
        if (key["owner"], definition) in seen:
            conversion.changes.append(f"{key['owner']}: {key['name']} {key['definition']} is the same key as"
                                      " another of the table now: kept once")
            continue
        seen.add((key["owner"], definition))
        if definition != key["definition"]:
            conversion.changes.append(f"{key['owner']}: {key['definition']} -> {definition}")
        out.append((key["owner"], f"ADD CONSTRAINT {key['name']} {definition}"))
    return out


def partition_by_user(conn: Any, tables: tuple[str, ...] = TABLES, partitions: int = PARTITIONS) -> Conversion:
    """Turn ``tables`` (names in schema engine, all empty) of the migrated database on ``conn`` into tables
    partitioned by hash of user_id into ``partitions`` partitions each (``<table>_p0`` ...), in one
    transaction. Returns what had to change."""
    conversion = Conversion(tuple(tables), partitions)
    partitioned = {f"engine.{t}" for t in tables}
    with conn.transaction():
        for table in tables:
            if conn.execute(f"SELECT 1 FROM engine.{table} LIMIT 1").fetchone():
                raise ValueError(f"engine.{table} has rows: the conversion is for an empty, migrated schema")
        catalog = _catalog(conn, tuple(tables))
        keys = _unique_keys(catalog["keys"], conversion) + _foreign_keys(catalog["keys"], partitioned, conversion)
        options = {row["name"]: row["options"] for row in catalog["options"]}
        for key in catalog["keys"]:  # first, so that each plain table can go without CASCADE
            if key["kind"] == "f":
                conn.execute(f"ALTER TABLE {key['owner']} DROP CONSTRAINT {key['name']}")
        for view in catalog["views"]:  # likewise
            conn.execute(f"DROP VIEW {view['name']}")
        for table in tables:
            _rebuild(conn, table, partitions, options.get(table), conversion)
        for owner, clause in keys:
            conn.execute(f"ALTER TABLE {owner} {clause}")
        # Indexes and row triggers as the migrations define them (a parent's fire for every partition's rows).
        for statement in [row["definition"] for row in catalog["indexes"] + catalog["triggers"]]:
            conn.execute(statement)
        for view in catalog["views"]:
            conn.execute(f"CREATE VIEW {view['name']} AS {view['definition']}")
        grant_app_role(conn)
    return conversion


def _rebuild(conn: Any, table: str, partitions: int, options: list[str] | None, conversion: Conversion) -> None:
    """engine.<table> again, partitioned, with the same columns, defaults, generated columns, identity, CHECKs
    and comments, and its partitions; the plain table (its keys and indexes with it) is dropped."""
    plain = f"{table}__plain"
    conn.execute(f"ALTER TABLE engine.{table} RENAME TO {plain}")
    conn.execute(f"CREATE TABLE engine.{table} (LIKE engine.{plain} INCLUDING DEFAULTS INCLUDING GENERATED"
                 " INCLUDING IDENTITY INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS)"
                 f" PARTITION BY HASH ({KEY})")
    conn.execute(f"DROP TABLE engine.{plain}")
    storage = f" WITH ({', '.join(options)})" if options else ""
    for remainder in range(partitions):
        conn.execute(f"CREATE TABLE engine.{table}_p{remainder} PARTITION OF engine.{table}"
                     f" FOR VALUES WITH (MODULUS {partitions}, REMAINDER {remainder}){storage}")
    if options:
        conversion.changes.append(f"engine.{table}: {', '.join(options)} on each partition (a partitioned table"
                                  " has no storage of its own)")


# --- a scratch database ------------------------------------------------------------------------------------

def create_database(server_url: str, name: str, *, partitioned: bool = True, tables: tuple[str, ...] = TABLES,
                    partitions: int = PARTITIONS) -> tuple[str, Conversion | None]:
    """Database ``name`` on the server of ``server_url``, made again from nothing, migrated by ``eros.migrate``
    and (``partitioned``) converted by ``partition_by_user``: its URL and the conversion."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = make_conninfo(server_url, dbname=name)
    migrate(url)
    if not partitioned:
        return url, None
    with connect(url) as conn:
        return url, partition_by_user(conn, tables, partitions)


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- what a statement scans ------------------------------------------------------------------------------

# engine.turn_recall() is engine.recall_candidates() run from PL/pgSQL, which keeps its plan; EXPLAIN cannot see
# into PL/pgSQL, so a turn's recall is explained as the SQL function the planner inlines, the same statement.
_SEEN_THROUGH = {recall_store.TURN_RECALL: recall_store.CANDIDATES}
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


class _Explained(psycopg.Cursor[Any]):
    """A cursor that runs EXPLAIN of each statement instead of the statement: what it returns is the plan."""

    options = ""
    generic = False

    def execute(self, query: Query, params: Params | None = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> Self:
        if not isinstance(query, str):
            raise TypeError("only statements given as text are explained")
        query = _SEEN_THROUGH.get(query, query)
        if not self.generic:
            return super().execute(f"EXPLAIN {self.options}{query}", params, prepare=prepare, binary=binary)
        # The generic plan, as PL/pgSQL keeps it: prepared with $n for the named placeholders (their casts give
        # the types), planned without the values, executed with them (partitions are pruned at executor start).
        if not isinstance(params, Mapping):
            raise TypeError("a generic plan is explained for named parameters only")
        names = list(dict.fromkeys(_PLACEHOLDER.findall(query)))
        numbered = _PLACEHOLDER.sub(lambda m: f"${names.index(m[1]) + 1}", query)
        # Not this class (its statements are not explained) and with the values as literals: the server infers no
        # parameter's type in a utility statement such as EXPLAIN EXECUTE.
        side = psycopg.ClientCursor(self.connection)
        side.execute(f"PREPARE explained_generic AS {numbered}")
        try:
            with self.connection.transaction(force_rollback=True):
                side.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                plan = [row["QUERY PLAN"] for row in side.execute(
                    f"EXPLAIN {self.options}EXECUTE explained_generic({', '.join(['%s'] * len(names))})",
                    [params[n] for n in names]).fetchall()]
        finally:
            side.execute("DEALLOCATE explained_generic")
        return super().execute('SELECT unnest(%s::text[]) AS "QUERY PLAN"', [plan], binary=binary)


class _Analysed(_Explained):
    options = "(ANALYZE) "


class _Generic(_Explained):
    generic = True


@contextmanager
def explaining(conn: psycopg.Connection[Any], *, analyse: bool = False, generic: bool = False) -> Iterator[None]:
    """In the block, every statement the code runs on ``conn`` is EXPLAINed with its own bound values (and,
    ``analyse``, run: EXPLAIN ANALYZE; or, ``generic``, planned without its values, as a statement a connection
    keeps is), and what the code gets back is the plan's lines ({"QUERY PLAN": line}): the store's own call
    shows the plan of exactly the statement it sends."""
    if analyse and generic:
        raise ValueError("explain either the analysed or the generic plan")
    saved = conn.cursor_factory
    conn.cursor_factory = _Analysed if analyse else _Generic if generic else _Explained
    try:
        yield
    finally:
        conn.cursor_factory = saved


def timings(plan: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The planning and execution times (ms) of an EXPLAIN ANALYZE."""
    found = (re.fullmatch(r"(Planning|Execution) Time: ([0-9.]+) ms", row["QUERY PLAN"]) for row in plan)
    return {m[1].lower(): float(m[2]) for m in found if m}


def partitions_in(plan: Sequence[Mapping[str, Any]], table: str) -> set[str]:
    """The partitions of engine.<table> a plan (rows of EXPLAIN) reads."""
    return {name for row in plan for name in re.findall(rf"\b({table}_p[0-9]+)\b", row["QUERY PLAN"])}
