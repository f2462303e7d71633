"""The lock files: the layer ships what the tests run, and the virtualenv is the one the lock describes.

requirements-dev.lock pins everything the virtualenv installs (tests, `make run`, the tools);
layers/eros/requirements.lock pins, with hashes, what the Lambda layer ships. `make lock` writes both."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
LAYER_LOCK = ROOT / "layers" / "eros" / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"
# What the Lambda Python runtime provides and the layer leaves out (the Makefile's RUNTIME_PROVIDED).
RUNTIME_PROVIDED = {"boto3", "botocore", "s3transfer", "urllib3", "python-dateutil", "six"}


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
