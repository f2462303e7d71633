"""The console in Firefox too: the OS's firefox-esr (apt), driven over WebDriver BiDi by puppeteer-core from
tests/browser (npm; no browser download), against the local stack with the fake providers. The flow is in
tests/browser/firefox.mjs; this judges what it saw."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT
from pgvector import Vector

from eros.providers.offline import hash_embed

pytestmark = pytest.mark.e2e

BROWSER_TESTS = ROOT / "tests" / "browser"
FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox") or "/usr/bin/firefox-esr"
EXTRACTED = json.dumps({"memories": [{"content": "Keeps bees in the garden", "category": "preference",
                                      "importance": 0.7}]})


def test_the_console_works_in_firefox(providers, local_server, db):
    assert Path(FIREFOX).exists(), "Firefox is not installed: apt-get install -y firefox-esr (make test does)"
    driver = BROWSER_TESTS / "node_modules" / "puppeteer-core"
    assert driver.is_dir(), "npm ci --prefix tests/browser (make test does)"
    providers[0].responder = lambda body: EXTRACTED if body.get("response_format") else "Bees are wonderful."
    db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance, source)"
               " VALUES ('fiona', 'Lives near the river', %s, 'fact', 0.6, 'dreaming')",
               (Vector(hash_embed("Lives near the river")),))
    done = subprocess.run(["node", str(BROWSER_TESTS / "firefox.mjs"), local_server.url, FIREFOX],
                          capture_output=True, text=True, timeout=600)  # each step's own deadline is 60 s
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "failure" not in seen, seen
    assert seen["version"].startswith("firefox/")
    assert "Lives near the river" in seen["memoriesBefore"]
    assert seen["reply"] == "Bees are wonderful."
    assert "Lives near the river" in seen["recalled"] and "similarity" in seen["recalled"]
    assert seen["sweep"].startswith("Claimed 1 session(s)") and "extracted (1 new)" in seen["sweep"]
    assert "Keeps bees in the garden" in seen["memoriesAfter"] and "profile · preference" in seen["memoriesAfter"]
    assert "extracted" in seen["dreaming"]
    assert seen["focusedAfterFirstPress"] == "Confirm delete"  # the keyboard confirms it
    assert "Keeps bees in the garden" not in seen["memoriesDeleted"]
    assert "Lives near the river" in seen["memoriesDeleted"]
    assert seen["editRefused"].startswith("When must be a week (2026-W47)")  # beside the form, in plain words
    assert seen["editKept"] == "Lives near the canal"
    network = [url for url in seen["requests"] if not url.startswith("data:")]  # the inline favicon
    assert network and all(url.startswith(local_server.url) for url in network), network
    turns = [url.rsplit("/", 1)[-1] for url in network if "/turns" in url]
    assert turns == ["stream"], turns  # the reply was streamed (fetch and a ReadableStream work in Firefox too)
    assert seen["errors"] == [], seen["errors"]
