"""What every bench shares: the machine line and the code's commit, the command line a result was made
with, the environment a bench runs in, its embedded Postgres (or a given database) migrated by the
package's own ``eros.migrate``, percentile statistics, and the results writer that keeps hand-written notes.

Benches import it as ``_common`` (a script's own folder is on ``sys.path``; the tests put ``bench/`` there).
Nothing here starts anything at import time: every bench can run in-process from the tests, through its
``main(argv)``, and leaves the process as it found it.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
NOTES_MARKER = "<!-- notes -->"  # text below it in a results file is hand-written and survives re-runs

# A bench never reaches a provider, AWS or another database because of what the shell exports.
CLEARED_ENV = ("OPENROUTER_API_KEY", "VOYAGE_API_KEY", "LLM_BASE_URL", "EMBED_BASE_URL", "PROVIDER_SECRET_ARN",
               "DATABASE_SECRET_ARN", "EXTRACT_FUNCTION_NAME", "DATABASE_URL")
PROVIDER_ENV = ("OPENROUTER_API_KEY", "LLM_BASE_URL", "VOYAGE_API_KEY", "EMBED_BASE_URL")


# --- the machine and the code ------------------------------------------------------------------------

def machine() -> dict[str, str]:
    """nproc, cpu, memory, loadavg (1 / 5 / 15 min), python, kernel: the cores here are shared, say what they were."""
    cpu, mem = platform.processor() or "unknown CPU", "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
                break
    except OSError:
        pass
    try:
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"nproc": str(nproc), "cpu": cpu, "memory": mem, "loadavg": load,
            "python": platform.python_version(), "kernel": platform.release()}


def describe_machine(with_load: bool = True) -> str:
    """The machine line of a results file: ``nproc=2, <cpu>, Linux <kernel>, Python <version>[, load ...]``."""
    m = machine()
    text = f"nproc={m['nproc']}, {m['cpu']}, Linux {m['kernel']}, Python {m['python']}"
    if with_load and m["loadavg"] != "unknown":
        text += ", load average at start " + m["loadavg"].replace(" / ", " ")
    return text


def git_commit() -> str:
    """The short commit, and whether the package had uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "layers"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + (" (+ uncommitted changes under layers/)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command_line(script: str, argv: list[str] | None) -> str:
    """The command a result was made with, as it is typed from the repository root."""
    args = sys.argv[1:] if argv is None else argv
    return f".venv/bin/python bench/{Path(script).name}" + "".join(f" {shlex.quote(a)}" for a in args)


# --- the environment ---------------------------------------------------------------------------------

def reset_process_state() -> None:
    """Forget cached settings, providers, this thread's connection and the embedding space read (after the
    environment changed)."""
    from eros import calibrated, db, providers
    from eros.config import settings

    settings.cache_clear()
    providers.reset()
    calibrated.reset()
    db.reset()


@contextlib.contextmanager
def bench_environment(**values: str) -> Iterator[None]:
    """Run a bench with no provider keys, AWS names or DATABASE_URL from the shell, tracing off, and
    ``values`` set; on the way out the environment and the package's cached state are put back as they
    were (so a bench can run inside the test process)."""
    saved = dict(os.environ)
    try:
        for name in CLEARED_ENV:
            os.environ.pop(name, None)
        os.environ.update({"POWERTOOLS_TRACE_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"})
        os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "ErosBench")
        os.environ.update(values)
        reset_process_state()
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        reset_process_state()


def use_database(url: str) -> None:
    """Point the package (``eros.db.connection()``, the handlers) at ``url``."""
    os.environ["DATABASE_URL"] = url
    reset_process_state()


@contextlib.contextmanager
def patched(*changes: tuple[object, str, object], result: object = None) -> Iterator[object]:
    """Set ``(owner, attribute, value)`` for the block and put the old values back afterwards (an attribute
    the owner only had through its class is deleted again); ``as`` gives ``result``."""
    missing = object()

    def own(owner, name) -> object:
        try:
            return vars(owner).get(name, missing)
        except TypeError:  # no __dict__
            return getattr(owner, name, missing)

    saved = [(owner, name, own(owner, name)) for owner, name, _ in changes]
    try:
        for owner, name, value in changes:
            setattr(owner, name, value)
        yield result
    finally:
        for owner, name, old in reversed(saved):
            if old is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


def test_helpers_on_path() -> None:
    """Make ``tests/fakes.py`` (fake OpenRouter and Voyage on loopback) and ``tests/apiclient.py`` (the chat
    handler called with API Gateway events) importable, as the benches that chat through the handler use them."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


# --- the database ------------------------------------------------------------------------------------

def add_database_url_option(parser) -> None:
    parser.add_argument("--database-url", default="",
                        help="run in this (disposable) database instead of the embedded Postgres: its engine tables "
                             "are emptied or reloaded by the bench")


def start_postgres(pgdata: str | Path):
    """The embedded Postgres 16 + pgvector in ``pgdata`` (started if it is not running), left running so
    that re-runs join it and reuse their data."""
    import pgserver

    Path(pgdata).mkdir(parents=True, exist_ok=True)
    return pgserver.get_server(str(pgdata), cleanup_mode=None)


def database(pgdata: str | Path, *, url: str = "", name: str | None = None, fresh: bool = False,
             from_scratch: bool = False) -> str:
    """The URL of the bench's database, migrated with ``eros.migrate``.

    ``url`` (the tests pass their server's database): used as it is. Otherwise database ``name`` (default
    ``postgres``) of the embedded Postgres in ``pgdata``, created when missing; ``fresh`` drops and
    recreates it; ``from_scratch`` drops the engine schema first, so an edited migration cannot go
    stale in a bench's long-lived folder."""
    import psycopg

    from eros.migrate import migrate

    if not url:
        server = start_postgres(pgdata)
        if name:
            with psycopg.connect(server.get_uri(), autocommit=True) as admin:
                exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
                if exists and fresh:
                    admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
                    exists = None
                if not exists:
                    admin.execute(f'CREATE DATABASE "{name}"')
        url = server.get_uri(database=name) if name else server.get_uri()
        if from_scratch:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("DROP SCHEMA IF EXISTS engine CASCADE")
    migrate(url)
    return url


# Every user's rows gone (personas and the migration log stay): where a bench starts from an empty engine.
EMPTY_ENGINE = ("TRUNCATE engine.companion_memories, engine.chat_messages, engine.chat_sessions,"
                " engine.user_deep_pass, engine.persona_instances CASCADE")


def one(cursor) -> Any:
    """The row a query returns (a query of a bench that returns none is a bug of the bench)."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError("the query returned no row")
    return row


def postgres_version(url: str) -> dict[str, str]:
    """``{"postgres": "16.2", "pgvector": "0.6.2"}`` of the database at ``url``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        pg, vector = one(conn.execute("SELECT current_setting('server_version'),"
                                      " (SELECT extversion FROM pg_extension WHERE extname = 'vector')"))
    return {"postgres": pg, "pgvector": vector or "none"}


# --- statistics --------------------------------------------------------------------------------------

def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summary(seconds: list[float]) -> dict[str, float]:
    """p50, p95, p99, mean and max of durations in seconds, in milliseconds."""
    s = sorted(seconds)
    if not s:
        return dict.fromkeys(("p50", "p95", "p99", "mean", "max"), float("nan"))
    return {"p50": percentile(s, 0.50) * 1000, "p95": percentile(s, 0.95) * 1000,
            "p99": percentile(s, 0.99) * 1000, "mean": statistics.fmean(s) * 1000, "max": s[-1] * 1000}


# --- results -----------------------------------------------------------------------------------------

def write_results(path: str | Path, report: str, *, notes: bool = True) -> Path | None:
    """Write ``report`` to ``path`` (``-``: nowhere). Anything below the ``<!-- notes -->`` line of the file
    already there is hand-written analysis and is kept. ``notes``: the report ends with a notes section
    (the marker, empty on a first run); without it the file is the report alone unless it had notes."""
    if str(path) == "-":
        return None
    path = Path(path)
    report = report.split(NOTES_MARKER, 1)[0]
    kept = ""
    if path.exists():
        old = path.read_text(encoding="utf-8")
        if NOTES_MARKER in old:
            kept = old[old.index(NOTES_MARKER):]
    if notes and not kept:
        kept = NOTES_MARKER + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.rstrip("\n") + "\n\n" + kept if kept else report, encoding="utf-8")
    return path
