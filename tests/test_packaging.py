"""The lock files: the layers ship what the tests run, and the virtualenv is the one the lock describes.

requirements-dev.lock pins everything the virtualenv installs (tests, `make run`, the tools);
layers/eros/requirements.lock (ErosLayer, every function's) and layers/auth/requirements.lock (AuthLayer, the stream
function's token check) pin, with hashes, what the Lambda layers ship. `make lock` writes them all.
The layers ship what Lambda runs and nothing of the local stack (``eros_dev``) nor what only it needs."""

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
AUTH_LAYER = ROOT / "layers" / "auth"
AUTH_LOCK = AUTH_LAYER / "requirements.lock"
LAYER_FOLDERS = [LAYER, AUTH_LAYER]
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


def requirements(folder: Path) -> set[str]:
    """The packages a layer's requirements.txt asks for (canonical names, without extras or bounds)."""
    return {canonical(re.split(r"[<>=!\[; ]", line, maxsplit=1)[0])
            for line in (folder / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")}


@pytest.mark.parametrize("folder", LAYER_FOLDERS, ids=lambda f: f.name)
def test_the_layer_ships_exactly_the_versions_the_tests_run(folder):
    layer, dev = pins(folder / "requirements.lock"), pins(DEV_LOCK)
    assert layer and dev
    differing = {name: (version, dev.get(name)) for name, version in layer.items() if dev.get(name) != version}
    assert differing == {}, f"layers/{folder.name}/requirements.lock and requirements-dev.lock disagree: `make lock`"


@pytest.mark.parametrize("folder", LAYER_FOLDERS, ids=lambda f: f.name)
def test_the_layer_lock_has_a_hash_for_every_package_and_leaves_the_runtimes_sdk_out(folder):
    lock = folder / "requirements.lock"
    text = lock.read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert all("--hash=sha256:" in block for block in blocks if "==" in block)
    assert RUNTIME_PROVIDED.isdisjoint(pins(lock))
    makefile = (ROOT / "Makefile").read_text()
    assert set(re.search(r"^RUNTIME_PROVIDED := (.+)$", makefile, re.M)[1].split()) == RUNTIME_PROVIDED
    # `make lock` writes it from the folder's requirements.txt with the flags above.
    assert re.search(rf"^\t\$\(LAYER_LOCK\) --output-file layers/{folder.name}/requirements.lock "
                     rf"layers/{folder.name}/requirements.txt$", makefile, re.M)


@pytest.mark.parametrize("folder", LAYER_FOLDERS, ids=lambda f: f.name)
def test_every_runtime_requirement_is_locked_for_the_layer(folder):
    assert requirements(folder) - RUNTIME_PROVIDED <= set(pins(folder / "requirements.lock"))


def test_the_layers_share_no_package_and_together_are_the_packages_dependencies():
    """Lambda extracts a function's layers into one /opt: a package in both would be the later layer's copy.
    pyproject.toml's dependencies (what the virtualenv and the tests get) are both layers' requirements."""
    assert set(pins(LAYER_LOCK)).isdisjoint(pins(AUTH_LOCK))
    pyproject = (ROOT / "pyproject.toml").read_text()
    listed = re.search(r"^dependencies = \{ file = \[(.+)\] \}$", pyproject, re.M)[1]
    expected = sorted(f"layers/{folder.name}/requirements.txt" for folder in LAYER_FOLDERS)
    assert sorted(re.findall(r'"([^"]+)"', listed)) == expected


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


# PyJWT's crypto extra and what it brings (~15 MB unzipped): AuthLayer's alone.
TOKEN_PACKAGES = {"pyjwt", "cryptography", "cffi", "pycparser"}


def test_the_token_verification_of_the_stream_function_is_its_own_layer():
    """A function URL has no JWT authorizer: the stream function verifies RS256 tokens itself (eros.auth), with
    PyJWT and its crypto extra, in AuthLayer at the versions the tests run; ErosLayer, which every function loads,
    holds none of them (nothing else of it needs them: the lock would name them otherwise)."""
    assert set(pins(AUTH_LOCK)) == TOKEN_PACKAGES
    assert re.search(r"^PyJWT\[crypto\]>=2\.8,<3$", (AUTH_LAYER / "requirements.txt").read_text(), re.M)
    assert TOKEN_PACKAGES.isdisjoint(pins(LAYER_LOCK)) and TOKEN_PACKAGES.isdisjoint(requirements(LAYER))
    assert "jwt" in imported_packages(LAYER / "eros" / "auth.py")
    assert "pyjwt" in pins(DEV_LOCK)  # the tests and the local stack (eros_dev.tokens) still have it


FUNCTIONS = ROOT / "functions"


def module_path(name: str, local: Path) -> Path | None:
    """The file of module ``name`` in the layer's eros package or in a function's own folder, else None."""
    for base in (LAYER, local):
        for path in (base / f"{name.replace('.', '/')}.py", base / name.replace(".", "/") / "__init__.py"):
            if path.is_file():
                return path
    return None


def reachable_imports(handler: Path) -> set[str]:
    """Every module a handler file can import, following the eros package and the function's own modules through
    their imports anywhere in a file (at module level or in a function): more than one invocation runs."""
    local, seen, found = handler.parent, set(), set()
    todo: list[tuple[str, Path]] = [(handler.stem, handler)]
    while todo:
        name, path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*parts, *([node.module] if node.module else [])])
                names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for imported in names:
                if (target := module_path(imported, local)) is not None:
                    todo.append((imported, target))
                    found.add(imported)
                elif imported.partition(".")[0] not in {"eros", *(p.stem for p in local.iterdir())}:
                    found.add(imported.partition(".")[0])
    return found


def test_only_the_stream_function_imports_the_token_check():
    """Every function but the stream one has ErosLayer alone: none of their handlers can reach eros.auth or jwt."""
    handlers = sorted(FUNCTIONS.glob("*/app.py"))
    assert len(handlers) == 4  # chat, sweeper, extract, migrate
    for handler in handlers:
        reached = reachable_imports(handler)
        assert "eros.config" in reached, handler  # the scan follows the eros package
        assert not {"eros.auth", "jwt", "cryptography"} & reached, f"{handler.relative_to(ROOT)} reaches eros.auth"
    assert {"eros.auth", "jwt"} <= reachable_imports(FUNCTIONS / "chat" / "stream.py")
