"""Cold start: what a new Lambda container pays before its first answer, and how big the deployment is.

    .venv/bin/python bench/cold_start.py                      # sam build --cached, then 10 runs a function
    .venv/bin/python bench/cold_start.py --reuse --runs 20    # measure the build already in .aws-sam/build

For every function of the build, in fresh processes laid out as the Lambda Python 3.12 runtime lays
them out: the function's code as the working directory and first on ``sys.path`` (``/var/task``), the
layer's ``python/`` folder next (``/opt/python``), then the runtime's own packages (``/var/runtime``:
boto3 and its dependencies, which the layer does not ship; copied here from the virtualenv, compiled, as
the runtime's are). The code and the layer are copied into a sandbox and made read-only, as Lambda
mounts them: Python cannot write bytecode there, so whatever the build did not compile is compiled from
source by every cold start. The environment is a deployed function's (names and ARNs, tracing on, no
``PYTHONDONTWRITEBYTECODE``), never the shell's.

Measured, medians of ``--runs`` processes each:

* **import**: ``import app`` inside the process, timed around the statement (what the runtime's init
  does before it can call the handler), after the standard modules the runtime's own bootstrap has
  imported by then (``RUNTIME_PRELOADED``); beside it the process's whole wall time minus a bare
  ``python -c pass`` (the figure that includes the interpreter's own start and exit, and those modules);
* **the floor** of the chat function: the same import of only the libraries its first request cannot do
  without (``FIRST_REQUEST_LIBRARIES``): what no laziness in the engine's own code can take away;
* the same with the other bytecode state (a build that does not compile: everything compiled in the
  sandbox; one that does: the eros package's bytecode removed), so the effect of compiling is measured;
* **first request** of the chat function: its import, then the handler on ``events/chat_turn.json``
  against a local Postgres with offline providers (opening the database connection included; the two
  secret fetches a deployed container makes first are not reachable here and are not in it);
* the unzipped and zipped size of every function and of the layer, and the layer's ten largest packages.

Results go to stdout and ``bench/results/cold_start.md`` (text below ``<!-- notes -->`` is kept).
"""

from __future__ import annotations

import argparse
import compileall
import io
import json
import os
import py_compile
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path

from _common import RESULTS, ROOT, command_line, database, describe_machine, git_commit, write_results

RESULTS_FILE = RESULTS / "cold_start.md"
FUNCTIONS = {"ChatFunction": "chat", "SweeperFunction": "sweeper", "ExtractFunction": "extract",
             "MigrateFunction": "migrate"}
GOAL_MS = 250
# The standard modules the Lambda Python runtime's bootstrap (awslambdaric, /var/runtime) has imported
# before it imports the handler (its bootstrap, marshaller, log utils and context modules, 4.2.x).
RUNTIME_PRELOADED = ("decimal", "enum", "importlib", "json", "logging", "math", "os", "sys", "time", "traceback")
# What any first request of the chat function runs: the database driver, the resolver with request
# validation (pydantic), the HTTP client of the providers, and the X-Ray SDK that traces them.
FIRST_REQUEST_LIBRARIES = ("psycopg", "pydantic", "aws_lambda_powertools.event_handler",
                           "aws_lambda_powertools.event_handler.openapi.params", "httpx", "aws_xray_sdk.core")
# What the Lambda Python runtime provides in /var/runtime and the layer leaves out (template.yaml says why).
RUNTIME_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six.py", "urllib3")
SAMPLE_SESSION = ("6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b", "user-123")  # what events/chat_turn.json names
SAMPLE_INSTANCE = "0b9e8d7c-6a5f-4e3d-9c2b-1a0f9e8d7c6b"


def lambda_environment(function: str, task: Path) -> dict[str, str]:
    """A deployed function's environment (template.yaml's variables with example values), tracing on.
    LAMBDA_TASK_ROOT matters: without it the X-Ray SDK believes it is on a server and makes a botocore
    client for centralised sampling at import (~300 ms that Lambda never pays)."""
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:eros-{}-AbCdEf"
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "en_US.UTF-8", "TZ": ":UTC",
        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
        "AWS_LAMBDA_FUNCTION_NAME": f"eros-{function}", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST", "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "LAMBDA_TASK_ROOT": str(task), "_HANDLER": "app.lambda_handler",
        "AWS_XRAY_CONTEXT_MISSING": "LOG_ERROR", "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000",
        "_X_AMZN_TRACE_ID": "Root=1-67d1d9de-5f0a1b2c3d4e5f6a7b8c9d0e;Parent=53995c3f42cd8ad8;Sampled=1",
        "POWERTOOLS_LOG_LEVEL": "INFO", "DATABASE_SECRET_ARN": arn.format("app-db"),
        "PROVIDER_SECRET_ARN": arn.format("providers"), "EXTRACT_FUNCTION_NAME": "eros-extract",
        "AWS_ACCESS_KEY_ID": "bench-not-a-key", "AWS_SECRET_ACCESS_KEY": "bench-not-a-secret",
    }


# --- the sandbox ---------------------------------------------------------------------------------------

def runtime_packages(target: Path, source: Path) -> Path:
    """/var/runtime: the runtime's packages, copied from ``source`` (the virtualenv's site-packages) and compiled."""
    for name in RUNTIME_PACKAGES:
        path = source / name
        if path.is_dir():
            shutil.copytree(path, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif path.exists():
            shutil.copy2(path, target / name)
    compileall.compile_dir(target, quiet=1, workers=0)
    return target


def sandbox(build: Path, root: Path, *, compiled: bool | None) -> Path:
    """Copy the build into ``root`` (task/<function>, opt/python); ``compiled``: strip all bytecode (False),
    compile everything (True) or keep the build's (None). Then make it read-only, as Lambda mounts it."""
    for logical in FUNCTIONS:
        shutil.copytree(build / logical, root / "task" / logical, symlinks=True)
    shutil.copytree(build / "ErosLayer", root / "opt", symlinks=True)
    if compiled is False:
        for cache in list(root.rglob("__pycache__")):
            shutil.rmtree(cache)
    elif compiled:
        compileall.compile_dir(root, quiet=1, workers=0,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    read_only(root, True)
    return root


def read_only(root: Path, on: bool) -> None:
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222 if on else mode | 0o200)


def has_bytecode(layer: Path) -> bool:
    return any((layer / "python" / "eros").rglob("*.pyc"))


# --- one process -------------------------------------------------------------------------------------

CHILD = """
import json, sys, time
import {preloaded}
sys.path[:0] = {paths!r}
started = time.perf_counter()
{statement}
imported = time.perf_counter()
result = {{"import": imported - started}}
if {invoke!r}:
    # Lambda's runtime makes the context; the local stack's stands in (its folder last: eros is the layer's), untimed.
    sys.path.append({devstack!r})
    from eros_dev.lambda_runtime import LambdaContext
    event = json.load(open({event!r}))
    invoked = time.perf_counter()
    response = app.lambda_handler(event, LambdaContext("eros-chat", 29))
    result["invoke"] = time.perf_counter() - invoked
    result["status"] = response["statusCode"]
print("RESULT " + json.dumps(result))
"""


def run_child(task: Path, paths: list[str], env: dict[str, str], *, invoke: bool = False,
              statement: str = "import app") -> dict:
    code = CHILD.format(paths=paths, invoke=invoke, event=str(ROOT / "events" / "chat_turn.json"),
                        devstack=str(ROOT / "devstack"),
                        preloaded=", ".join(RUNTIME_PRELOADED), statement=statement)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=task, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"the cold process failed in {task.name}:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][7:]) | {"wall": wall}


def bare_start(runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-S", "-c", "pass"], env={"PATH": "/usr/bin:/bin"}, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure_imports(root: Path, runtime: Path, runs: int, bare: float, only: list[str]) -> dict[str, dict[str, float]]:
    """Per function: median import ms in the process, and median process wall minus the bare start. For the
    chat function also the floor (FIRST_REQUEST_LIBRARIES alone), its processes alternating with the
    handler's so that both see the same load (this machine's is shared)."""
    figures = {}
    floor_statement = "import " + ", ".join(FIRST_REQUEST_LIBRARIES)
    for logical, function in FUNCTIONS.items():
        if function not in only:
            continue
        task = root / "task" / logical
        paths = [str(task), str(root / "opt" / "python"), str(runtime)]
        env = lambda_environment(function, task)
        samples, floors = [], []
        for _ in range(runs):
            samples.append(run_child(task, paths, env))
            if function == "chat":
                floors.append(run_child(task, paths, env, statement=floor_statement))
        figures[function] = {"import": 1000 * statistics.median(s["import"] for s in samples),
                             "process": 1000 * (statistics.median(s["wall"] for s in samples) - bare)}
        if floors:
            figures[function]["floor"] = 1000 * statistics.median(s["import"] for s in floors)
    return figures


def measure_first_request(root: Path, runtime: Path, runs: int, url: str) -> dict[str, float]:
    """The chat function's import + first invoke of events/chat_turn.json, on a freshly seeded session."""
    import psycopg

    task = root / "task" / "ChatFunction"
    paths = [str(task), str(root / "opt" / "python"), str(runtime)]
    env = lambda_environment("chat", task) | {"DATABASE_URL": url}
    for name in ("DATABASE_SECRET_ARN", "PROVIDER_SECRET_ARN"):  # local: the URL itself, offline providers
        env.pop(name)
    samples = []
    for _ in range(runs):
        with psycopg.connect(url, autocommit=True) as conn:
            seed_sample_session(conn)
        sample = run_child(task, paths, env, invoke=True)
        if sample["status"] != 200:
            raise RuntimeError(f"the sample turn answered {sample['status']}")
        samples.append(sample)
    imports = [s["import"] for s in samples]
    invokes = [s["invoke"] for s in samples]
    return {"import": 1000 * statistics.median(imports), "invoke": 1000 * statistics.median(invokes),
            "total": 1000 * statistics.median(a + b for a, b in zip(imports, invokes, strict=True))}


def seed_sample_session(conn) -> None:
    """The session the sample event names, empty (each run's turn is then a first turn, not a replay)."""
    session, user = SAMPLE_SESSION
    conn.execute("DELETE FROM engine.chat_sessions WHERE id = %s", (session,))
    conn.execute("DELETE FROM engine.persona_instances WHERE id = %s", (SAMPLE_INSTANCE,))
    conn.execute("INSERT INTO engine.persona_instances (id, user_id, persona_id) VALUES (%s, %s, 'luna')",
                 (SAMPLE_INSTANCE, user))
    conn.execute("INSERT INTO engine.chat_sessions (id, user_id, instance_id) VALUES (%s, %s, %s)",
                 (session, user, SAMPLE_INSTANCE))


# --- sizes -------------------------------------------------------------------------------------------

def sizes(path: Path) -> tuple[int, int]:
    """Unzipped bytes (files) and the bytes of a deflated zip of the folder, as sam package makes one."""
    total, buffer = 0, io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            total += file.stat().st_size
            archive.write(file, file.relative_to(path))
    return total, buffer.tell()


def largest_packages(layer: Path, n: int = 10) -> list[tuple[str, int]]:
    """The layer's top-level entries by unzipped size (a package's .dist-info and .libs counted with it)."""
    totals: dict[str, int] = {}
    for entry in (layer / "python").iterdir():
        name = entry.name.split("-")[0].removesuffix(".libs").removesuffix(".py").lower()
        size = entry.stat().st_size if entry.is_file() else sum(p.stat().st_size for p in entry.rglob("*")
                                                                 if p.is_file())
        totals[name] = totals.get(name, 0) + size
    return sorted(totals.items(), key=lambda item: -item[1])[:n]


# --- the report --------------------------------------------------------------------------------------

def report(args, built: dict, other: dict, first: dict | None, floor: float | None, size_rows: list,
           packages: list, bare: float, compiled: bool) -> str:
    now = datetime.now(UTC)
    shipped = "compiled at build time" if compiled else "not compiled by the build"
    # A compiled build's dependencies have no sources left to fall back to: only eros's bytecode can go.
    other_name = "eros's bytecode removed" if compiled else "everything compiled in the sandbox"
    worst = max(v["import"] for v in built.values())
    lines = [
        "# Cold start: handler import, first request, deployment size", "",
        "Written by `bench/cold_start.py`; re-running overwrites everything above the notes marker.", "",
        f"* **Command:** `{command_line(__file__, args.argv)}`",
        f"* **Date:** {now:%Y-%m-%d %H:%M} UTC; code at {git_commit()}",
        f"* **Machine:** {describe_machine()}. Bare interpreter start (`python -S -c pass`): {bare * 1000:.0f} ms.",
        f"* **Layout:** function code read-only as `/var/task`, the layer read-only as `/opt`, boto3 & co as "
        f"`/var/runtime`; tracing on; {args.runs} fresh processes per figure, medians; the import is timed after "
        f"the standard modules the runtime's bootstrap has already imported ({', '.join(RUNTIME_PRELOADED)}). "
        f"The build ships **{shipped}**.", "",
        f"**Slowest handler import as shipped: {worst:.0f} ms — goal ≤ {GOAL_MS} ms: "
        f"{'met' if worst <= GOAL_MS else 'not met'}.**", "",
        f"| function | import as shipped ({shipped}) ms | process − bare start ms | import, {other_name} ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for function, figures in built.items():
        lines.append(f"| {function} | **{figures['import']:.0f}** | {figures['process']:.0f} | "
                     f"{other[function]['import']:.0f} |")
    if floor is not None and "chat" in built:
        lines += ["", f"**Floor:** importing only the libraries any first chat request runs "
                  f"({', '.join(f'`{name}`' for name in FIRST_REQUEST_LIBRARIES)}) takes **{floor:.0f} ms** in the "
                  f"same sandbox (its processes alternating with the chat handler's); the engine's package and the "
                  f"handler module add {built['chat']['import'] - floor:.0f} ms to it."]
    if first:
        lines += ["", "First request of a new chat container (import + the handler on `events/chat_turn.json`, "
                  "local Postgres over a Unix socket, offline providers; the deployed container's two secret "
                  "fetches and its TLS connection to RDS Proxy are not in it):", "",
                  "| | import ms | first invoke ms | total ms |", "| --- | ---: | ---: | ---: |",
                  f"| chat | {first['import']:.0f} | {first['invoke']:.0f} | **{first['total']:.0f}** |"]
    lines += ["", "| artifact | unzipped MB | zipped MB |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {raw / 1e6:.2f} | {packed / 1e6:.2f} |" for name, raw, packed in size_rows]
    lines += ["", "Largest packages of the layer (unzipped):", "", "| package | MB |", "| --- | ---: |"]
    lines += [f"| {name} | {size / 1e6:.2f} |" for name, size in packages]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", type=Path, default=ROOT / ".aws-sam" / "build")
    parser.add_argument("--reuse", action="store_true", help="measure the build as it is (no sam build)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--runtime-packages", type=Path, default=None,
                        help="a folder standing for /var/runtime (default: boto3 & co copied from the virtualenv)")
    parser.add_argument("--pgdata", default="/tmp/eros-bench-cold-start")
    parser.add_argument("--database-url", default="", help="a disposable database for the first-request runs")
    parser.add_argument("--no-first-request", action="store_true")
    parser.add_argument("--only", default=",".join(FUNCTIONS.values()), help="functions to time (comma-separated)")
    parser.add_argument("--out", default=str(RESULTS_FILE), help="results file ('-': none)")
    args = parser.parse_args(argv)
    args.argv = argv
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if not args.reuse:  # sam build looks for python3.12 on PATH: the virtualenv's interpreter is one
        venv_bin = str(Path(sys.executable).parent)
        subprocess.run([f"{venv_bin}/sam", "build", "--cached", "--build-dir", str(args.build_dir)], cwd=ROOT,
                       check=True, env=os.environ | {"PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"})
    compiled = has_bytecode(args.build_dir / "ErosLayer")
    with tempfile.TemporaryDirectory(prefix="eros-cold-") as tmp:
        work = Path(tmp)
        runtime = args.runtime_packages or runtime_packages(work / "runtime", _site_packages())
        bare = bare_start(args.runs)
        try:
            only = args.only.split(",")
            built = measure_imports(sandbox(args.build_dir, work / "built", compiled=None), runtime, args.runs, bare,
                                    only)
            other = measure_imports(sandbox(args.build_dir, work / "other", compiled=not compiled), runtime,
                                    args.runs, bare, only)
            first = None
            if not args.no_first_request:
                url = database(args.pgdata, url=args.database_url)
                first = measure_first_request(work / "built", runtime, args.runs, url)
        finally:
            for name in ("built", "other"):
                if (work / name).exists():
                    read_only(work / name, False)
    size_rows = [(logical, *sizes(args.build_dir / logical)) for logical in [*FUNCTIONS, "ErosLayer"]]
    packages = largest_packages(args.build_dir / "ErosLayer")
    floor = built.get("chat", {}).get("floor")
    text = report(args, built, other, first, floor, size_rows, packages, bare, compiled)
    print(text)
    write_results(args.out, text)
    return {"import": built, "other": other, "floor": floor, "first_request": first, "sizes": size_rows,
            "compiled": compiled}


def _site_packages() -> Path:
    import boto3

    return Path(boto3.__file__).parents[1]


if __name__ == "__main__":
    main()
