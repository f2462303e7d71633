"""The memory console in a real browser: the OS's headless Chromium (apt: chromium) driven by Playwright,
against the local stack on loopback with the fake providers. A person signs in, chats, sees what a reply
recalled and why, sweeps, watches the memory appear, edits, deletes and restores, and another user sees
none of it. Screenshots of the main states are written to CONSOLE_SCREENSHOTS (default
.artifacts/console/)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import ROOT
from pgvector import Vector
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from eros.providers.offline import hash_embed

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(os.environ.get("CONSOLE_SCREENSHOTS") or ROOT / ".artifacts" / "console")
EXTRACTED = json.dumps({"memories": [{"content": "Has a dog named Biscuit", "category": "relation",
                                      "importance": 0.8, "occurred_at": "2026-W47"}]})
# What a closed network needs: no first-run, sync, component or background fetches (all refused here).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), "Chromium is not installed: apt-get install -y chromium (make test does)"
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def stack(providers, local_server, db):
    providers[0].responder = lambda body: EXTRACTED if body.get("response_format") else "That sounds tiring."
    db.execute("INSERT INTO engine.companion_memories (user_id, content, embedding, category, importance, source)"
               " VALUES ('alice', 'Works as a nurse in Leeds', %s, 'fact', 0.7, 'dreaming')",
               (Vector(hash_embed("Works as a nurse in Leeds")),))
    return local_server


class Visit:
    """One person's tab: every request it makes and every console error it logs are kept."""

    def __init__(self, browser: Browser, url: str):
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.page: Page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("console", self._logged)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(f"{url}/console/")

    def _logged(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def sign_in(self, user: str) -> None:
        self.page.get_by_label("User").fill(user)
        self.page.get_by_label("User").press("Enter")  # the keyboard alone signs in
        expect(self.page.locator("#me")).to_have_text(user)

    def memory(self, text: str):
        return self.page.locator("#memory-groups li.memory", has_text=text)

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()


def test_a_person_watches_memory_form_and_curates_it(browser, stack):
    alice = Visit(browser, stack.url)
    page = alice.page
    alice.sign_in("alice")
    expect(alice.memory("Works as a nurse in Leeds")).to_be_visible()

    # Chat: a reply shows what was recalled for it, by layer and category, with the parts of its score.
    page.get_by_role("button", name="New session").click()
    page.get_by_label("Message", exact=True).fill("I had a long shift as a nurse today")
    page.get_by_label("Message", exact=True).press("Enter")
    reply = page.locator("#messages li.assistant").last
    expect(reply).to_contain_text("That sounds tiring.")
    reply.locator("summary").click()
    recalled = reply.locator(".recalled-item", has_text="Works as a nurse in Leeds")
    expect(recalled).to_contain_text("similarity")
    expect(recalled).to_contain_text("demotion")
    expect(reply.locator("h4", has_text="profile · fact")).to_be_visible()
    expect(page.locator("#dream-sessions li.dream").first).to_contain_text("active")
    alice.shot("1-chat-with-recall")

    # Dreaming: "sweep now" turns the session into a memory, which appears in the panel.
    page.get_by_role("button", name="Sweep now").click()
    expect(page.locator("#sweep-result")).to_contain_text("Claimed 1 session(s)")
    expect(page.locator("#sweep-result")).to_contain_text("extracted (1 new)")
    biscuit = alice.memory("Has a dog named Biscuit")
    expect(biscuit).to_be_visible()
    expect(biscuit).to_contain_text("dreaming · session")
    expect(biscuit.locator(".when")).to_have_text("when: the week of 2026-11-16")  # the event time, in words
    expect(page.locator("section[aria-label='profile · relation']")).to_contain_text("Biscuit")
    expect(page.locator("#dream-sessions li.dream").first).to_contain_text("extracted")
    alice.shot("2-after-sweep")

    # Edit: a new version supersedes the old; the history shows both; restore brings the old one back.
    nurse = alice.memory("Works as a nurse in Leeds")
    nurse.get_by_role("button", name="Edit").click()
    nurse.get_by_label("Content").fill("Works as a nurse in York")
    nurse.get_by_label("When").fill("2019-03")
    nurse.get_by_role("button", name="Save").click()
    expect(alice.memory("Works as a nurse in York")).to_be_visible()
    expect(alice.memory("Works as a nurse in York").locator(".when")).to_have_text("when: March 2019")
    expect(alice.memory("Works as a nurse in Leeds")).to_have_count(0)
    york = alice.memory("Works as a nurse in York")
    york.get_by_role("button", name="History").click()
    expect(york.locator(".history li")).to_have_count(2)
    expect(york.locator(".history")).to_contain_text("edited")
    alice.shot("3-history")
    york.get_by_role("button", name="History").click()
    page.get_by_label("Show history (superseded)").check()
    old = page.locator("#memory-groups li.memory.superseded", has_text="Works as a nurse in Leeds")
    expect(old).to_contain_text("superseded (edited)")
    old.get_by_role("button", name="Restore").click()
    expect(page.locator("#memory-groups li.memory:not(.superseded)", has_text="in Leeds")).to_be_visible()
    expect(page.locator("#memory-groups li.memory.superseded", has_text="in York")).to_contain_text("reverted")
    page.get_by_label("Show history (superseded)").uncheck()

    # Delete takes a second, deliberate press.
    biscuit = alice.memory("Has a dog named Biscuit")
    biscuit.get_by_role("button", name="Delete").click()
    expect(biscuit.get_by_role("button", name="Confirm delete")).to_be_focused()
    page.keyboard.press("Enter")
    expect(alice.memory("Has a dog named Biscuit")).to_have_count(0)
    expect(page.locator("#status")).to_have_text("Deleted.")

    # Another person sees none of it.
    bob = Visit(browser, stack.url)
    bob.sign_in("bob")
    expect(bob.page.locator("#memory-groups")).to_contain_text("No memories yet")
    expect(bob.page.locator("#dream-sessions li")).to_have_count(0)
    assert "nurse" not in bob.page.content() and "Biscuit" not in bob.page.content()
    bob.shot("4-another-user")

    for visit in (alice, bob):
        assert all(url.startswith(stack.url) for url in visit.requests), visit.requests  # no third party
        assert visit.errors == []
        visit.close()


def test_a_memory_stated_in_the_console_and_a_failed_sign_in(browser, stack):
    visit = Visit(browser, stack.url)
    page = visit.page
    page.get_by_label("User").fill(" spaced")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#status")).to_contain_text("Sign-in failed")
    expect(page.locator("#app")).to_be_hidden()

    visit.sign_in("alice")
    page.locator("#add-memory-box summary").click()
    page.get_by_label("Content").fill("Prefers tea to coffee")
    page.locator("#new-category").select_option("preference")
    page.get_by_role("button", name="Add memory").click()
    stated = visit.memory("Prefers tea to coffee")
    expect(stated).to_contain_text("user")
    expect(page.locator("section[aria-label='profile · preference']")).to_contain_text("Prefers tea")

    page.reload()  # the tab keeps its sign-in
    expect(page.locator("#me")).to_have_text("alice")
    page.get_by_role("button", name="Sign out").click()
    expect(page.locator("#app")).to_be_hidden()
    # The browser logs the refused sign-in's answer; nothing else went wrong.
    assert visit.errors == ["Failed to load resource: the server responded with a status of 422 (Unprocessable Entity)"]
    visit.close()
