"""The Lambda layers hold compiled code of the architecture they are built for (layers/eros/Makefile and
layers/auth/Makefile, LAMBDA_ARCH): every shared object's ELF machine and every wheel's platform tag, for arm64 (the
template's default Architecture) and x86_64. The builds install requirements.lock with --require-hashes, so they
also show that each lock has the hashes of both platforms' wheels. ErosLayer, which every function loads, holds no
token verification; AuthLayer (the stream function's) holds PyJWT with cryptography and nothing else. It downloads
the wheels (pip's cache makes a second run quick)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
# ELF e_machine values (the two bytes at offset 18 of a little-endian ELF file).
MACHINES = {"arm64": 183, "x86_64": 62}
WHEEL_PLATFORMS = {"arm64": "aarch64", "x86_64": "x86_64"}
# Each layer's folder, and the top-level names of the compiled code it must hold (the scan sees them).
LAYERS = {"ErosLayer": "layers/eros", "AuthLayer": "layers/auth"}
COMPILED = {"ErosLayer": {"psycopg_binary", "pydantic_core"}, "AuthLayer": {"cryptography", "_cffi_backend"}}
PLATFORM_WHEELS = {"ErosLayer": {"psycopg_binary", "pydantic_core"}, "AuthLayer": {"cryptography", "cffi"}}
# What AuthLayer holds: PyJWT, its crypto extra and their distributions' metadata (and cffi's command in bin/).
TOKEN_PACKAGES = {"jwt", "cryptography", "cffi", "_cffi_backend", "pycparser"}


def elf_machine(path: Path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and header[5] == 1, f"{path}: not a little-endian ELF file"
    return int.from_bytes(header[18:20], "little")


def top_name(path: Path, site: Path) -> str:
    """The importable top-level name a file of the layer belongs to (psycopg_binary.libs: psycopg_binary)."""
    return path.relative_to(site).parts[0].split(".")[0]


@pytest.fixture(scope="module", params=[(layer, arch) for layer in LAYERS for arch in MACHINES],
                ids=lambda p: "-".join(p))
def built(request, tmp_path_factory) -> tuple[str, str, Path]:
    layer, arch = request.param
    artifacts = tmp_path_factory.mktemp(f"{layer}-{arch}")
    env = {**os.environ, "LAMBDA_ARCH": arch, "ARTIFACTS_DIR": str(artifacts), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT / LAYERS[layer]), f"build-{layer}",
                    f"PYTHON={sys.executable}"], env=env, check=True, capture_output=True, timeout=600)
    return layer, arch, artifacts / "python"


def test_every_shared_object_is_for_the_architecture(built):
    layer, arch, site = built
    objects = [p for p in site.rglob("*.so*") if p.is_file()]
    # psycopg's libpq and its C extension, pydantic-core, wrapt; cryptography's Rust bindings and cffi's backend:
    # compiled code that must match.
    assert {top_name(p, site) for p in objects} >= COMPILED[layer]
    wrong = {str(p.relative_to(site)): elf_machine(p) for p in objects if elf_machine(p) != MACHINES[arch]}
    assert wrong == {}, f"{arch} {layer} holds other machines' code"


def test_every_platform_wheel_is_tagged_for_the_architecture(built):
    layer, arch, site = built
    tags = {path.parent.name: re.findall(r"^Tag: (\S+)$", path.read_text(), re.M)
            for path in site.glob("*.dist-info/WHEEL")}
    platform = {name: t for name, t in tags.items() if not all(tag.endswith("-any") for tag in t)}
    assert {name.split("-")[0] for name in platform} >= PLATFORM_WHEELS[layer]
    wrong = {name: t for name, t in platform.items()
             if not all(tag.endswith(WHEEL_PLATFORMS[arch]) and "manylinux" in tag for tag in t)}
    assert wrong == {}


def test_only_the_stream_functions_layer_holds_the_token_verification(built):
    """ErosLayer (every function) has eros.auth's code but not PyJWT nor cryptography; AuthLayer (the stream
    function's) has them, compiled (no sources: the layer is read-only), and nothing else."""
    layer, _, site = built
    names = {top_name(p, site) for p in site.iterdir() if not p.name.endswith(".dist-info")}
    if layer == "ErosLayer":
        assert "eros" in names and (site / "eros" / "auth.py").is_file()
        assert names.isdisjoint(TOKEN_PACKAGES), names & TOKEN_PACKAGES
    else:
        assert names == TOKEN_PACKAGES | {"bin"}
        assert list(site.rglob("*.pyc")) and not list(site.rglob("*.py"))


HOST_ARCH = {"x86_64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
SIGN_AND_VERIFY = """
import sys
sys.path[:0] = [sys.argv[1]]
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
token = jwt.encode({"sub": "u-1"}, key, algorithm="RS256")
assert jwt.decode(token, key.public_key(), algorithms=["RS256"]) == {"sub": "u-1"}
assert jwt.__file__.startswith(sys.argv[1]) and jwt.__file__.endswith(".pyc")
"""


@pytest.mark.parametrize("built", [("AuthLayer", HOST_ARCH)], indirect=True, ids=["AuthLayer-host"])
def test_the_token_layer_alone_signs_and_verifies_rs256_on_its_architecture(built):
    """AuthLayer as built (bytecode only, the platform's compiled code) runs PyJWT's RS256 with nothing else on the
    path (-I -S: no virtualenv). The build of the machine's own architecture only: the other's cannot load here."""
    layer, arch, site = built
    run = subprocess.run([sys.executable, "-I", "-S", "-c", SIGN_AND_VERIFY, str(site)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("layer", LAYERS)
def test_an_unknown_architecture_is_refused(layer, tmp_path):
    env = {**os.environ, "LAMBDA_ARCH": "aarch64", "ARTIFACTS_DIR": str(tmp_path)}
    run = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT / LAYERS[layer]), f"build-{layer}"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and 'LAMBDA_ARCH must be arm64 or x86_64, not "aarch64"' in run.stderr
    assert list(tmp_path.iterdir()) == []
