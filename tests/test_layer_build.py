"""The Lambda layer holds compiled code of the architecture it is built for (layers/eros/Makefile, LAMBDA_ARCH):
every shared object's ELF machine and every wheel's platform tag, for arm64 (the template's default
Architecture) and x86_64. The build installs requirements.lock with --require-hashes, so it also shows that the
lock has the hashes of both platforms' wheels. It downloads the wheels (pip's cache makes a second run quick)."""

from __future__ import annotations

import os
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


def elf_machine(path: Path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and header[5] == 1, f"{path}: not a little-endian ELF file"
    return int.from_bytes(header[18:20], "little")


@pytest.fixture(scope="module", params=["arm64", "x86_64"])
def built(request, tmp_path_factory) -> tuple[str, Path]:
    arch = request.param
    artifacts = tmp_path_factory.mktemp(f"layer-{arch}")
    env = {**os.environ, "LAMBDA_ARCH": arch, "ARTIFACTS_DIR": str(artifacts), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT / "layers/eros"), "build-ErosLayer",
                    f"PYTHON={sys.executable}"], env=env, check=True, capture_output=True, timeout=600)
    return arch, artifacts / "python"


def test_every_shared_object_is_for_the_architecture(built):
    arch, site = built
    objects = [p for p in site.rglob("*.so*") if p.is_file()]
    # psycopg's libpq and its C extension, pydantic-core, wrapt: compiled code that must match.
    assert {p.relative_to(site).parts[0] for p in objects} >= {"psycopg_binary", "pydantic_core"}
    wrong = {str(p.relative_to(site)): elf_machine(p) for p in objects if elf_machine(p) != MACHINES[arch]}
    assert wrong == {}, f"{arch} layer holds other machines' code"


def test_every_platform_wheel_is_tagged_for_the_architecture(built):
    arch, site = built
    tags = {path.parent.name: re.findall(r"^Tag: (\S+)$", path.read_text(), re.M)
            for path in site.glob("*.dist-info/WHEEL")}
    platform = {name: t for name, t in tags.items() if not all(tag.endswith("-any") for tag in t)}
    assert {name.split("-")[0] for name in platform} >= {"psycopg_binary", "pydantic_core"}
    wrong = {name: t for name, t in platform.items()
             if not all(tag.endswith(WHEEL_PLATFORMS[arch]) and "manylinux" in tag for tag in t)}
    assert wrong == {}


def test_an_unknown_architecture_is_refused(tmp_path):
    env = {**os.environ, "LAMBDA_ARCH": "aarch64", "ARTIFACTS_DIR": str(tmp_path)}
    run = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT / "layers/eros"), "build-ErosLayer"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and 'LAMBDA_ARCH must be arm64 or x86_64, not "aarch64"' in run.stderr
    assert list(tmp_path.iterdir()) == []
