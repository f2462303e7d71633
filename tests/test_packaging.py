"""The lock files: the layer ships what the tests run, and the virtualenv is the one the lock describes.

requirements-dev.lock pins everything the virtualenv installs (tests, `make run`, the tools);
layers/eros/requirements.lock pins, with hashes, what the Lambda layer ships. `make lock` writes both.
The layer ships what Lambda runs and nothing of the local stack (``eros_dev``) nor what only it needs."""

from __future__ import annotations

import ast
import re
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
LAYER = ROOT / "layers" / "eros"
LAYER_LOCK = LAYER / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"
# What the Lambda Python runtime provides and the layer leaves out (the Makefile's RUNTIME_PROVIDED).
RUNTIME_PROVIDED = {"boto3", "botocore", "s3transfer", "urllib3", "python-dateutil", "six"}
DEV_STACK = ROOT / "devstack" / "eros_dev"
# What only the local stack imports: itself and the embedded Postgres. (PyJWT was here until the stream function
# verified its own tokens: eros.auth, behind a function URL, which has no JWT authorizer.)
DEV_ONLY = {"eros_dev", "pgserver"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", path.read_text(), re.M)
    return {canonical(name): version for name, version in found}


def test_the_layer_ships_exactly_the_versions_the_tests_run():
    layer, dev = pins(LAYER_LOCK), pins(DEV_LOCK)
    assert layer and dev
    differing = {name: (version, dev.get(name)) for name, version in layer.items() if dev.get(name) != version}
    assert differing == {}, "layers/eros/requirements.lock and requirements-dev.lock disagree: run `make lock`"


def test_the_layer_lock_has_a_hash_for_every_package_and_leaves_the_runtimes_sdk_out():
    text = LAYER_LOCK.read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert all("--hash=sha256:" in block for block in blocks if "==" in block)
    assert RUNTIME_PROVIDED.isdisjoint(pins(LAYER_LOCK))
    makefile = (ROOT / "Makefile").read_text()
    assert set(re.search(r"^RUNTIME_PROVIDED := (.+)$", makefile, re.M)[1].split()) == RUNTIME_PROVIDED


def test_every_runtime_requirement_is_locked_for_the_layer():
    wanted = {canonical(re.split(r"[<>=!\[; ]", line, maxsplit=1)[0])
              for line in (ROOT / "layers" / "eros" / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert wanted - RUNTIME_PROVIDED <= set(pins(LAYER_LOCK))


def test_the_virtualenv_has_the_locked_versions():
    """A stale virtualenv (the lock changed, `make venv` not re-run) shows here, not as a puzzling failure."""
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}
    wrong = {name: (version, installed.get(name)) for name, version in pins(DEV_LOCK).items()
             if installed.get(name) != version}
    assert wrong == {}, "the virtualenv does not match requirements-dev.lock: run `make venv` (or `make clean venv`)"


def shipped_modules() -> list[Path]:
    """The layer's own modules: what layers/eros/Makefile copies beside the locked dependencies (`cp -R eros`)."""
    assert re.findall(r"^\tcp -R (\S+) ", (LAYER / "Makefile").read_text(), re.M) == ["eros"]
    return sorted((LAYER / "eros").rglob("*.py"))


def imported_packages(path: Path) -> set[str]:
    """The top-level packages ``path`` imports anywhere in it, at module level or in a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return found


def test_the_layer_ships_no_module_of_the_local_stack_nor_what_only_it_needs():
    shipped = shipped_modules()
    assert len(shipped) > 40 and LAYER not in DEV_STACK.parents  # the local stack is outside what SAM builds from
    importing = {str(path.relative_to(LAYER)): found for path in shipped
                 if (found := imported_packages(path) & DEV_ONLY)}
    assert importing == {}, "a module of the Lambda layer imports the local stack or what only it needs"
    assert "pgserver" not in pins(LAYER_LOCK) and "pgserver" in pins(DEV_LOCK)
    # The same scan sees them where they are: pgserver inside the functions that start Postgres.
    assert "pgserver" in imported_packages(DEV_STACK / "stack.py")


def test_the_layer_ships_the_token_verification_of_the_stream_function():
    """A function URL has no JWT authorizer: the stream function verifies RS256 tokens itself (eros.auth), with
    PyJWT and its crypto extra, both in the layer at the versions the tests run."""
    layer = pins(LAYER_LOCK)
    assert {"pyjwt", "cryptography"} <= set(layer)
    assert re.search(r"^PyJWT\[crypto\]", (LAYER / "requirements.txt").read_text(), re.M)
    assert "jwt" in imported_packages(LAYER / "eros" / "auth.py")
