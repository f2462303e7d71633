"""The memory console in a real browser: the OS's headless Chromium (apt: chromium) driven by Playwright,
against the local stack on loopback with the fake providers. A person signs in, chats, sees what a reply
recalled and why, sweeps, watches the memory appear, edits, deletes and restores, and another user sees
none of it. Screenshots of the main states are written to CONSOLE_SCREENSHOTS (default
.artifacts/console/); the ones docs/img/ holds are made by

    CONSOLE_SCREENSHOTS=docs/img .venv/bin/python -m pytest tests/test_console_browser.py \
        -k "refused_edit or empty or offline or word_by_word"
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

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
# How long the page may take to show what a step waits for. The local stack answers on 2 shared cores, and a
# tab's first turn and first sweep also load their function "containers" (the handlers' imports, ~0.4 s idle):
# at a load average of 15 that outlasted Playwright's default of 5 s. A deadline, not a pause: every expect and
# action goes on as soon as its condition holds.
WITHIN_MS = 60_000
expect.set_options(timeout=WITHIN_MS)
# A reply the page has whole: not one whose words are still arriving (a step that waits for a reply's text would
# otherwise go on, to a sweep say, while the turn is still being answered).
REPLY = "#messages li.assistant:not(.streaming)"
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
        self.context.set_default_timeout(WITHIN_MS)
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

    def sign_in(self, user: str, app: str | None = None) -> None:
        # The page enables "Sign in" once it knows how to sign in (console.js boot()); Enter in the form before that
        # submits nothing, and on a busy machine a fresh tab can be that slow.
        expect(self.page.locator("#signin-button")).to_be_enabled()
        if app is not None:
            self.page.get_by_label("App").fill(app)
        self.page.get_by_label("User").fill(user)
        self.page.get_by_label("User").press("Enter")  # the keyboard alone signs in
        who = f"{user} @ {app}" if app else user
        expect(self.page.locator("#me")).to_have_text(who)
        expect(self.page.locator("#status")).to_have_text(f"Signed in as {who}.")  # its sessions are loaded

    def memory(self, text: str):
        return self.page.locator("#memory-groups li.memory", has_text=text)

    def shot(self, name: str, part: str | None = None) -> None:
        """The page (or only the element ``part`` selects) as SHOTS/name.png."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        if part:
            self.page.locator(part).screenshot(path=str(SHOTS / f"{name}.png"))
        else:
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
    expect(page.get_by_label("Message", exact=True)).to_be_focused()  # the new session is open (see below)
    page.get_by_label("Message", exact=True).fill("I had a long shift as a nurse today")
    page.get_by_label("Message", exact=True).press("Enter")
    reply = page.locator(REPLY).last
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


def test_episodes_show_in_the_relationship_view_with_their_session_and_event_time(browser, stack, providers):
    episode = "Alice told Kai she was nervous about the Siemens interview; Kai helped her rehearse."
    providers[0].responder = lambda body: json.dumps({
        "memories": [{"content": "Has a job interview at Siemens", "category": "event", "importance": 0.8,
                      "occurred_at": "2026-12-04"}],
        "episode": {"content": episode, "occurred_at": "2026-12-03"}}) if body.get("response_format") \
        else "You will do well. Shall we rehearse?"
    alice = Visit(browser, stack.url)
    page = alice.page
    alice.sign_in("alice")
    page.get_by_label("Persona").select_option("kai")
    page.get_by_role("button", name="New session").click()
    box = page.get_by_label("Message", exact=True)
    expect(box).to_be_focused()  # the new session is open: its (empty) history is on the page
    box.fill("I have the Siemens interview tomorrow and I am nervous")
    box.press("Enter")
    expect(page.locator(REPLY).last).to_contain_text("rehearse", timeout=15_000)
    page.get_by_role("button", name="Sweep now").click()
    expect(page.locator("#sweep-result")).to_contain_text("extracted (1 new), episode written")
    group = page.locator("section[aria-label='episodes · kai']")
    item = group.locator("li.memory.episode")
    expect(item).to_contain_text(episode)
    expect(item.locator(".episode-badge")).to_contain_text("episode of session")
    expect(item.locator(".when")).to_have_text("when: 2026-12-03")
    expect(item).to_contain_text("episode · session")  # its provenance: source, session, messages, model
    expect(page.locator("section[aria-label='relationship · kai']")).to_contain_text("Siemens interview tomorrow")
    alice.shot("5-episodes")

    # Corrected in place: no category or importance to set, and no second version.
    item.get_by_role("button", name="Edit").click()
    expect(item.get_by_label("Category")).to_have_count(0)
    item.get_by_label("Content").fill(episode + " They rehearsed twice.")
    item.get_by_role("button", name="Save").click()
    expect(page.locator("#status")).to_have_text("Saved: the episode is corrected.")
    expect(group.locator("li.memory")).to_have_count(1)
    expect(group).to_contain_text("They rehearsed twice.")
    assert alice.errors == []
    alice.close()


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


def test_a_user_of_another_app_signs_in_with_the_app_and_sees_that_apps_personas_alone(browser, stack, db):
    from eros.store import apps as app_store
    from eros.store import personas as persona_store

    app_store.create("acme", "Acme", {}, db)
    persona_store.keep_app("acme", "nova", "Nova", "a patient tutor", "You are Nova, a patient tutor.")
    visit = Visit(browser, stack.url)
    page = visit.page
    expect(page.locator("#signin-button")).to_be_enabled()
    page.get_by_label("App").fill("globex")  # no such app: said, and not signed in
    page.get_by_label("User").fill("alice")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#status")).to_contain_text("Sign-in failed: app: there is no app 'globex'")
    expect(page.locator("#app")).to_be_hidden()

    visit.sign_in("alice", app="acme")
    expect(page.locator("#persona option")).to_have_text(["Nova (nova)"])  # acme's personas, not luna, kai, mei
    expect(page.locator("#memory-groups")).to_contain_text("No memories yet")  # not the first app's alice's
    page.reload()  # the tab keeps its sign-in, app and all
    expect(page.locator("#me")).to_have_text("alice @ acme")
    page.get_by_role("button", name="Sign out").click()
    visit.sign_in("alice", app="")  # empty: the first app's alice, as before apps
    expect(visit.memory("Works as a nurse in Leeds")).to_be_visible()
    assert "Nova" not in page.locator("#persona").inner_text()
    assert visit.errors == ["Failed to load resource: the server responded with a status of 422 (Unprocessable Entity)"]
    visit.close()


# --- ?api=: where the console sends the bearer token ----------------------------------------------------------
# Served without the local stack's Content-Security-Policy (as the README's deployment recipe allows: any static
# host), the page itself must refuse to send the token to an origin nobody allowed.

class Recorder(BaseHTTPRequestHandler):
    """An origin that keeps every request it gets (method, path, Authorization) and allows any cross-origin
    call, so that only the console can be what stops a request to it."""

    def _any(self) -> None:
        self.server.seen.append((self.command, self.path, self.headers.get("authorization")))  # type: ignore[attr-defined]
        self.send_response(200)
        for name, value in (("Access-Control-Allow-Origin", "*"), ("Access-Control-Allow-Headers", "*"),
                            ("Access-Control-Allow-Methods", "*"), ("Content-Type", "application/json"),
                            ("Content-Length", "2")):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PATCH = do_DELETE = do_OPTIONS = _any

    def log_message(self, format: str, *args) -> None:
        pass


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


def serving(handler) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def origin(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def foreign():
    """Some other origin a link's ?api= can name: it records whatever reaches it."""
    yield from serving(Recorder)


@pytest.fixture
def deployed(tmp_path, foreign):
    """The console's files on a plain static server (no CSP), as a deployer would host them; a second copy whose
    <meta name="eros-api-origins"> lists the foreign origin (what a deployer writes for their API)."""
    allowing = tmp_path / "allowing"
    shutil.copytree(ROOT / "console", tmp_path / "console")
    shutil.copytree(ROOT / "console", allowing)
    page = (allowing / "index.html").read_text()
    assert '<meta name="eros-api-origins" content="">' in page
    (allowing / "index.html").write_text(page.replace('<meta name="eros-api-origins" content="">',
                                                      f'<meta name="eros-api-origins" content="{origin(foreign)}/">'))
    yield from serving(partial(Quiet, directory=str(tmp_path)))


def open_console(browser: Browser, url: str) -> Visit:
    """A tab that already holds a signed-in token (as one does after sign-in and a reload), opening ``url``."""
    visit = Visit.__new__(Visit)
    visit.context = browser.new_context()
    visit.context.set_default_timeout(WITHIN_MS)
    visit.context.add_init_script('sessionStorage.setItem("eros-console", JSON.stringify('
                                  '{"token": "secret-token", "user": "alice"}))')
    visit.page = visit.context.new_page()
    visit.requests, visit.errors = [], []
    visit.page.on("request", lambda request: visit.requests.append(request.url))
    visit.page.on("pageerror", lambda error: visit.errors.append(str(error)))
    visit.page.goto(url)
    return visit


@pytest.mark.parametrize("named", ["{foreign}", "{foreign}/", "{foreign}/v1/", "//127.0.0.1:{port}",
                                   "http://localhost:{port}", "{foreign_https}", "javascript:alert(1)",
                                   "data:text/plain,x", "http://127.0.0.1:{port}@evil.invalid/"])
def test_a_foreign_api_origin_gets_no_request_and_the_person_is_told_why(browser, foreign, deployed, named):
    port = foreign.server_address[1]
    api = named.format(foreign=origin(foreign), port=port, foreign_https=f"https://127.0.0.1:{port}")
    visit = open_console(browser, f"{origin(deployed)}/console/index.html?api={quote(api, safe='')}")
    visit.page.wait_for_function("() => document.querySelector('#status').textContent !== ''")  # boot is done
    visit.page.wait_for_load_state("networkidle")
    assert foreign.seen == []
    status = visit.page.locator("#status")
    expect(status).to_contain_text("Not signing in: this console sends your token only to its own origin")
    expect(status).to_contain_text("eros-api-origins")
    expect(visit.page.locator("#signin")).to_be_hidden()
    expect(visit.page.locator("#app")).to_be_hidden()
    assert all(url.startswith(origin(deployed) + "/console/") for url in visit.requests), visit.requests
    assert visit.errors == []
    visit.close()


def test_an_api_origin_the_deployer_allowed_gets_the_token(browser, foreign, deployed):
    visit = open_console(browser, f"{origin(deployed)}/allowing/index.html?api={quote(origin(foreign), safe='')}")
    expect(visit.page.locator("#signin")).to_be_attached()
    visit.page.wait_for_function("() => document.querySelector('#status').textContent !== ''")  # boot is done
    assert ("GET", "/v1/personas", "Bearer secret-token") in foreign.seen, foreign.seen
    visit.close()


def test_a_person_makes_a_character_and_chats_with_it(browser, stack, providers):
    visit = Visit(browser, stack.url)
    page = visit.page
    visit.sign_in("alice")
    page.locator("#new-persona-box summary").click()
    page.get_by_label("Name").fill("Juniper")
    page.get_by_label("Prompt").fill("x" * 10)
    page.get_by_label("Prompt").fill("")  # the browser refuses an empty prompt: nothing is sent
    page.get_by_role("button", name="Make character").click()
    expect(page.locator("#new-persona-box")).to_have_attribute("open", "")
    page.get_by_label("Description").fill("a grumpy lighthouse keeper")
    page.get_by_label("Prompt").fill("You are Juniper, a grumpy lighthouse keeper.")
    page.get_by_role("button", name="Make character").click()
    expect(page.locator("#status")).to_have_text("Character Juniper made: start a session with it.")
    expect(page.locator("#persona option:checked")).to_have_text("Juniper (yours)")
    page.get_by_role("button", name="New session").click()
    expect(page.get_by_label("Message", exact=True)).to_be_focused()  # the new session is open
    page.get_by_label("Message", exact=True).fill("Is the lamp lit?")
    page.get_by_label("Message", exact=True).press("Enter")
    expect(page.locator("#messages")).to_contain_text("That sounds tiring.")
    chats = [r["json"] for r in providers[0].requests if not r["json"].get("response_format")]
    assert chats[-1]["messages"][0]["content"].startswith("You are Juniper, a grumpy lighthouse keeper.")
    visit.shot("console-character")
    visit.close()
    # Another person never sees it.
    other = Visit(browser, stack.url)
    other.sign_in("bob")
    expect(other.page.locator("#persona option", has_text="Juniper")).to_have_count(0)
    assert not visit.errors and not other.errors, (visit.errors, other.errors)
    other.close()


def test_an_imported_history_shows_how_far_dreaming_has_got(browser, stack):
    from apiclient import Api

    conversations = [{"conversation_id": f"c{i}", "persona_id": "luna", "messages": [
        {"role": "user", "content": f"Back in 2024, month {i}", "created_at": f"2024-0{i + 1}-01T10:00:00Z"}]}
        for i in range(3)]
    assert Api().call("POST", "/v1/imports", {"conversations": conversations})[0] == 200
    visit = Visit(browser, stack.url)
    page = visit.page
    visit.sign_in("alice")
    progress = page.locator("#import-progress")
    expect(progress).to_have_text("Imported history: 0 of 3 conversation(s) extracted · 3 to go, oldest first")
    page.get_by_role("button", name="Sweep now").click()
    expect(progress).to_have_text("Imported history: 3 of 3 conversation(s) extracted · done"
                                  " · distilled through 2024-03-01")
    assert not visit.errors, visit.errors
    visit.close()


# --- when something goes wrong, and first steps ------------------------------------------------------------------

def refused(status: int, reason: str) -> str:
    """What Chromium logs for an answer that is an error (the page itself logs nothing)."""
    return f"Failed to load resource: the server responded with a status of {status} ({reason})"


def test_a_refused_edit_keeps_the_form_and_says_why_beside_it(browser, stack):
    alice = Visit(browser, stack.url)
    page = alice.page
    alice.sign_in("alice")
    nurse = alice.memory("Works as a nurse in Leeds")
    nurse.get_by_role("button", name="Edit").click()
    form = nurse.get_by_role("form", name="Edit memory")
    form.get_by_label("Content").fill("Works as a nurse in York")
    form.get_by_label("When").fill("March 2019")  # not a form the API takes
    form.get_by_role("button", name="Save").click()
    problem = form.locator(".form-error")
    expect(problem).to_have_text("When must be a week (2026-W47), a month (2019-03), a year (2019) or a day "
                                 "(2026-12-03).")
    expect(problem).to_have_attribute("role", "alert")
    expect(form.get_by_label("Content")).to_have_value("Works as a nurse in York")  # what was typed is kept
    expect(form.get_by_label("When")).to_have_value("March 2019")
    expect(form.get_by_label("When")).to_have_attribute("aria-invalid", "")
    expect(form.get_by_label("When")).to_be_focused()
    expect(form.get_by_role("button", name="Save")).to_be_enabled()
    alice.shot("console-edit-error", "#memories")
    # A poll meanwhile leaves the form as it is; the memory is unchanged.
    page.wait_for_timeout(3500)
    expect(form.get_by_label("Content")).to_have_value("Works as a nurse in York")
    expect(nurse.locator(".memory-text")).to_have_text("Works as a nurse in Leeds")

    form.get_by_label("Content").fill("   ")  # the browser's `required` lets spaces through; the API does not
    form.get_by_label("When").fill("2019-03")
    form.get_by_role("button", name="Save").click()
    expect(problem).to_have_text("Content cannot be empty.")
    expect(form.get_by_label("When")).not_to_have_attribute("aria-invalid", "")
    expect(form.get_by_label("Content")).to_have_attribute("aria-invalid", "")
    text = page.locator("#memories").inner_text()
    assert "body." not in text and "Value error" not in text and "String should" not in text, text

    form.get_by_label("Content").fill("Works as a nurse in York")
    form.get_by_role("button", name="Save").click()
    expect(page.locator("#status")).to_have_text("Saved: a new version supersedes the old one.")
    expect(alice.memory("Works as a nurse in York").locator(".when")).to_have_text("when: March 2019")
    expect(page.locator("#memory-groups form")).to_have_count(0)
    assert alice.errors == [refused(422, "Unprocessable Entity")] * 2, alice.errors
    alice.close()


def test_a_refused_memory_keeps_what_was_typed(browser, stack):
    visit = Visit(browser, stack.url)
    page = visit.page
    visit.sign_in("alice")
    page.locator("#add-memory-box summary").click()
    form = page.locator("#add-memory")
    form.get_by_label("Content").fill("Ran the Leeds half marathon")
    form.get_by_label("When").fill("last May")
    form.get_by_role("button", name="Add memory").click()
    expect(form.locator(".form-error")).to_contain_text("When must be a week (2026-W47)")
    expect(form.get_by_label("Content")).to_have_value("Ran the Leeds half marathon")
    form.get_by_label("When").fill("2026-05")
    form.get_by_role("button", name="Add memory").click()
    expect(visit.memory("Ran the Leeds half marathon")).to_be_visible()
    expect(form.locator(".form-error")).to_be_hidden()
    expect(form.get_by_label("Content")).to_have_value("")
    visit.close()


# Every visible control of the page, with no visible <label> of its own (a placeholder or aria-label is no label).
UNLABELLED = """() => [...document.querySelectorAll("input, select, textarea")]
  .filter((control) => control.offsetParent !== null)
  .filter((control) => ![...control.labels].some((label) => {
    const box = label.getBoundingClientRect();
    return box.width > 4 && box.height > 4 && label.textContent.trim() !== control.value.trim();
  }))
  .map((control) => control.id || control.outerHTML.slice(0, 80))"""


def test_every_field_has_a_visible_label(browser, stack):
    visit = Visit(browser, stack.url)
    page = visit.page
    expect(page.locator("#signin-button")).to_be_enabled()
    assert page.evaluate(UNLABELLED) == []
    visit.sign_in("alice")
    page.get_by_role("button", name="New session").click()
    expect(page.get_by_label("Message", exact=True)).to_be_focused()
    for box in ("#new-persona-box", "#add-memory-box"):
        page.locator(f"{box} summary").click()
    nurse = visit.memory("Works as a nurse in Leeds")
    nurse.get_by_role("button", name="Edit").click()
    expect(nurse.locator("form")).to_be_visible()
    assert page.evaluate(UNLABELLED) == []
    visit.close()


def test_an_empty_account_is_told_that_new_session_comes_first(browser, stack):
    visit = Visit(browser, stack.url)
    page = visit.page
    visit.sign_in("carol")
    hint = page.locator("#first-steps")
    expect(hint).to_be_visible()
    expect(hint).to_contain_text("No sessions yet: pick a persona above and press “New session” first")
    expect(page.locator("#memory-groups")).to_contain_text("No memories yet")
    expect(page.locator("#session")).to_be_hidden()  # no empty picker
    expect(page.locator("#offline-note")).to_have_attribute("data-offline", "")  # real (fake) providers: no notice
    expect(page.locator("#offline-note")).to_be_hidden()
    visit.shot("console-empty")
    page.get_by_role("button", name="New session").click()
    expect(page.get_by_label("Message", exact=True)).to_be_focused()
    expect(hint).to_be_hidden()
    expect(page.locator("#session")).to_be_visible()
    page.get_by_role("button", name="Sign out").click()
    visit.sign_in("carol")  # now with a session: no hint
    expect(hint).to_be_hidden()
    assert visit.errors == []
    visit.close()


def test_a_stopped_stack_is_said_on_screen(browser, stack):
    visit = Visit(browser, stack.url)
    page = visit.page
    visit.sign_in("alice")
    # What the browser meets when the stack is stopped: nothing listens on its port. (Stopping the server itself
    # would leave the tab's open keep-alive connections answered by their handler threads.)
    page.context.route(f"{stack.url}/**", lambda route: route.abort("connectionrefused"))
    status = page.locator("#status")
    expect(status).to_have_text("The local stack is not running: start it with make run, then reload this page.")
    expect(status).to_have_class("error")  # said by the poll, without any action of the person's
    page.get_by_role("button", name="Refresh").click()
    expect(status).to_have_text("The local stack is not running: start it with make run, then reload this page.")
    page.context.unroute(f"{stack.url}/**")
    expect(status).to_have_text("The stack answers again.")
    assert visit.errors and all("ERR_CONNECTION_REFUSED" in error for error in visit.errors), visit.errors
    visit.close()


def test_offline_mode_says_why_memories_look_crude(browser, local_server):
    """No key and no base URL (the offline stand-ins, as `make run` without keys): said on screen."""
    visit = Visit(browser, local_server.url)
    page = visit.page
    note = page.locator("#offline-note")
    expect(note).to_be_visible()
    expect(note).to_have_attribute("data-offline", "llm embedder")
    expect(note).to_contain_text("Offline mode: no model is configured, so replies are echoes and memories look crude")
    expect(note).to_contain_text("recall matches words, not meaning")
    visit.sign_in("dana")
    page.get_by_role("button", name="New session").click()
    box = page.get_by_label("Message", exact=True)
    expect(box).to_be_focused()
    box.fill("I adopted a dog named Biscuit last week. I work night shifts as a nurse in Leeds.")
    box.press("Enter")
    expect(page.locator(REPLY).last).to_contain_text("(offline model)")
    page.get_by_role("button", name="Sweep now").click()
    expect(page.locator("#sweep-result")).to_contain_text("Claimed 1 session(s)")
    expect(page.locator("#memory-groups li.memory").first).to_be_visible()
    expect(note).to_be_visible()
    visit.shot("console-offline")
    assert visit.errors == []
    visit.close()


def test_offline_shanghai_to_tokyo_keeps_the_job(browser, local_server):
    """The newcomer's demo with no keys (issue 30): the stand-in writes one memory a clause in the third person,
    skips the question, and a move to Tokyo supersedes the home only; the history shows Shanghai as changed."""
    visit = Visit(browser, local_server.url)
    page = visit.page
    visit.sign_in("erin")

    def a_session_then_a_sweep(said: str) -> None:
        page.get_by_role("button", name="New session").click()
        box = page.get_by_label("Message", exact=True)
        box.fill(said)
        box.press("Enter")
        expect(page.locator(REPLY).last).to_contain_text(said[-12:])  # the offline echo
        page.get_by_role("button", name="Sweep now").click()

    a_session_then_a_sweep("Hi! I live in Shanghai and I'm a nurse. Where do I live now?")
    expect(visit.memory("Lives in Shanghai")).to_be_visible()
    expect(visit.memory("Works as a nurse")).to_be_visible()
    profile = page.locator("#memory-groups section.memory-group[aria-label^='profile'] li.memory")
    expect(profile).to_have_count(2)  # no question, no greeting
    visit.shot("console-offline-shanghai")
    a_session_then_a_sweep("Guess what, I moved to Tokyo!")
    expect(visit.memory("Moved to Tokyo")).to_be_visible()
    expect(visit.memory("Works as a nurse")).to_be_visible()
    expect(visit.memory("Lives in Shanghai")).to_have_count(0)  # superseded: out of the current view
    visit.shot("console-offline-tokyo")
    page.get_by_label("Show history (superseded)").check()
    expect(visit.memory("Lives in Shanghai")).to_contain_text("changed")
    visit.shot("console-offline-history")
    assert visit.errors == []
    visit.close()


def test_the_local_stack_shows_the_memory_events_its_sweeps_published(browser, local_server):
    """Memory events (issue 32, docs/EVENTS.md) where a developer can watch them: the console's panel lists the
    signed-in user's, newest first, after a sweep; a deletion is published by the next sweep."""
    visit = Visit(browser, local_server.url)
    page = visit.page
    visit.sign_in("events-demo")
    page.get_by_role("button", name="New session").click()
    box = page.get_by_label("Message", exact=True)
    box.fill("I live in Lisbon and I'm a nurse.")
    box.press("Enter")
    expect(page.locator(REPLY).last).to_contain_text("a nurse")
    page.get_by_role("button", name="Sweep now").click()
    events = page.get_by_role("list", name="Memory events").locator("li")
    expect(events).to_have_count(4)  # two memories and the episode, then the session extracted
    expect(events.first).to_contain_text("#4 session.extracted")
    expect(events.last).to_contain_text("#1 memory.created")
    visit.shot("console-events")
    assert visit.errors == []
    visit.close()


# --- a streamed turn: the reply's words as they arrive (POST .../turns/stream, Server-Sent Events) ----------------

def sse(*events: tuple[str, dict]) -> str:
    from eros.streaming import sse as event

    return b"".join(event(name, data) for name, data in events).decode()


def turns_sent(page: Page) -> list[tuple[str, dict]]:
    """Every turn the page sends, as it sends it: ("stream" or "json", its body)."""
    sent: list[tuple[str, dict]] = []

    def seen(request) -> None:
        if request.method == "POST" and request.url.endswith(("/turns", "/turns/stream")):
            sent.append(("stream" if request.url.endswith("/stream") else "json", request.post_data_json))

    page.on("request", seen)
    return sent


def start_chat(visit: Visit, user: str = "alice"):
    visit.sign_in(user)
    page = visit.page
    page.get_by_role("button", name="New session").click()
    box = page.get_by_label("Message", exact=True)
    expect(box).to_be_focused()  # the new session is open
    return page, box


# The reply as it stands on the page while it streams (null: no reply arriving), and whether the person's message
# is still marked as being sent, read in one go.
ARRIVING = """() => {
  const reply = document.querySelector('#messages li.assistant.streaming p');
  const said = [...document.querySelectorAll('#messages li.user')].pop();
  return reply ? [reply.textContent, said.classList.contains('pending')] : null;
}"""
SLOW_REPLY = ("Night shifts are hard on anyone, and a long one more so. Did you at least get a proper break, and "
              "something warm to eat before you slept?")


def test_a_reply_arrives_word_by_word(browser, stack, providers):
    """A slow model (a word piece every 150 ms): the reply's text grows on the page before the turn is done, each
    state a beginning of the next; then the reply is whole, with its recalled memories. The screenshots
    console-stream-1..3 show it arriving, console-stream-4 done."""
    fake_llm = providers[0]
    fake_llm.responder = lambda body: EXTRACTED if body.get("response_format") else SLOW_REPLY
    fake_llm.first_token_delay, fake_llm.token_interval = 0.2, 0.15
    visit = Visit(browser, stack.url)
    page, box = start_chat(visit)
    box.fill("I had a long night shift as a nurse")
    box.press("Enter")
    seen: list[str] = []
    shots = 0
    deadline = time.monotonic() + WITHIN_MS / 1000
    while time.monotonic() < deadline:
        arriving = page.evaluate(ARRIVING)
        if arriving is None and seen:
            break  # the streaming reply was replaced by the whole one
        text, pending = arriving or ("", True)
        if text and (not seen or text != seen[-1]):
            assert not pending  # the message is stored (the `turn` event) before the first word
            assert box.input_value() == ""  # and out of the box
            seen.append(text)
            if shots < 3 and len(text.split()) >= (3, 9, 16)[shots]:
                shots += 1
                visit.shot(f"console-stream-{shots}", "#chat")
        page.wait_for_timeout(40)
    reply = page.locator(REPLY).last
    expect(reply.locator("p").first).to_have_text(SLOW_REPLY)
    expect(reply).not_to_have_class("message assistant streaming")
    reply.locator("summary").click()
    expect(reply.locator(".recalled-item", has_text="Works as a nurse in Leeds")).to_contain_text("similarity")
    visit.shot("console-stream-4", "#chat")  # done: the whole reply, and what it recalled
    assert len(seen) >= 3, seen  # it grew on the page, more than once, before it was done
    assert all(SLOW_REPLY.startswith(text) for text in seen), seen
    assert all(len(a) < len(b) for a, b in zip(seen, seen[1:], strict=False)), seen  # never went back
    assert shots == 3, seen
    assert visit.errors == []
    visit.close()


def test_an_error_event_is_said_in_words_and_no_half_reply_stays(browser, stack):
    """The model failed half-way (an `error` event after a delta): the partial reply goes (the server stores none),
    the message is marked failed, the code is said in words; sent again, it keeps its client_turn_id."""
    visit = Visit(browser, stack.url)
    page, box = start_chat(visit)
    sent = turns_sent(page)
    failed = {"statusCode": 504, "code": "model_timeout", "retryable": True,
              "message": "the model took too long; your message was kept, retry with the same client_turn_id"}

    def fails_half_way(route) -> None:
        route.fulfill(status=200, content_type="text/event-stream", body=sse(
            ("turn", {"client_turn_id": route.request.post_data_json["client_turn_id"], "user_message_id": 1}),
            ("delta", {"delta": "Half a "}), ("error", failed)))

    page.route("**/turns/stream", fails_half_way)
    box.fill("Tell me about my day")
    box.press("Enter")
    status = page.locator("#status")
    expect(status).to_have_text("The turn failed. The model took too long to answer: try again.")
    expect(status).to_have_class("error")
    expect(page.locator("#messages li.user.failed")).to_contain_text("Tell me about my day")
    expect(page.locator("#messages li.assistant")).to_have_count(0)  # "Half a " is not left on the page
    expect(box).to_have_value("Tell me about my day")  # kept, to send again
    visit.shot("console-stream-error")
    page.unroute("**/turns/stream")
    box.press("Enter")
    expect(page.locator(REPLY).last).to_contain_text("That sounds tiring.")
    assert [path for path, _ in sent] == ["stream", "stream"]
    assert sent[0][1]["client_turn_id"] == sent[1][1]["client_turn_id"]  # the same turn: stored once
    assert visit.errors == []
    visit.close()


def test_a_stream_that_breaks_off_is_asked_again_once_with_the_same_turn_id(browser, stack, db):
    """The connection drops after the first word: the console asks again with the same client_turn_id, the server
    replays the reply it stored (once), the words on screen never go back; twice dropped, the person is told."""
    visit = Visit(browser, stack.url)
    page, box = start_chat(visit)
    sent = turns_sent(page)
    drops = {"left": 1}

    def drops_once(route) -> None:
        if drops["left"] <= 0:
            return route.continue_()
        drops["left"] -= 1
        # The server answers the turn whole (and stores it); the page gets its first events, then the end.
        answered = route.fetch().text()
        first_delta = answered.index("\n\n", answered.index("event: delta")) + 2
        route.fulfill(status=200, content_type="text/event-stream", body=answered[:first_delta])

    page.route("**/turns/stream", drops_once)
    box.fill("I had a long shift")
    box.press("Enter")
    reply = page.locator(REPLY).last
    expect(reply).to_contain_text("That sounds tiring.")
    expect(reply.locator("summary")).to_contain_text("Recalled")  # the done event's recalled memories
    assert [path for path, _ in sent] == ["stream", "stream"]
    assert sent[0][1]["client_turn_id"] == sent[1][1]["client_turn_id"]
    expect(page.locator("#messages li.user.failed")).to_have_count(0)
    stored = db.execute("SELECT role, client_turn_id FROM engine.chat_messages ORDER BY id").fetchall()
    assert [(m["role"], m["client_turn_id"]) for m in stored] == [("user", sent[0][1]["client_turn_id"]),
                                                                 ("assistant", sent[0][1]["client_turn_id"])]

    drops["left"] = 2
    box.fill("And another one")
    box.press("Enter")
    expect(page.locator("#status")).to_have_text("The turn failed. The connection kept breaking while the reply "
                                                 "was arriving: send the message again (its reply is kept, not "
                                                 "written twice).")
    expect(page.locator(REPLY)).to_have_count(1)
    assert len(sent) == 4 and sent[2][1]["client_turn_id"] == sent[3][1]["client_turn_id"]

    # No answer at all the first time (the connection reset before the status): asked once more, answered.
    page.unroute("**/turns/stream")
    resets = {"left": 1}

    def resets_once(route) -> None:
        if resets["left"] <= 0:
            return route.continue_()
        resets["left"] -= 1
        route.abort("connectionreset")

    page.route("**/turns/stream", resets_once)
    box.press("Enter")  # "And another one" again, kept in the box
    expect(page.locator(REPLY)).to_have_count(2)
    assert len(sent) == 6 and len({body["client_turn_id"] for _, body in sent[2:]}) == 1  # one turn, four asks
    assert visit.errors == ["Failed to load resource: net::ERR_CONNECTION_RESET"], visit.errors
    visit.close()


def test_an_api_without_the_stream_route_gets_the_json_route(browser, stack):
    """An API deployed before streaming (API Gateway's own 404 for a route it lacks): the turn goes to the JSON route
    with the same client_turn_id, and every later turn straight there."""
    visit = Visit(browser, stack.url)
    page, box = start_chat(visit)
    sent = turns_sent(page)
    page.route("**/turns/stream", lambda route: route.fulfill(status=404, content_type="application/json",
                                                               body='{"message":"Not Found"}'))
    box.fill("Hello there")
    box.press("Enter")
    expect(page.locator(REPLY).last).to_contain_text("That sounds tiring.")
    box.fill("Hello again")
    box.press("Enter")
    expect(page.locator(REPLY)).to_have_count(2)
    assert [path for path, _ in sent] == ["stream", "json", "json"]
    assert sent[0][1]["client_turn_id"] == sent[1][1]["client_turn_id"] != sent[2][1]["client_turn_id"]
    assert visit.errors == [refused(404, "Not Found")], visit.errors
    visit.close()


def test_a_stream_url_nobody_allowed_gets_no_request(browser, foreign, deployed):
    """?stream= (a deployed API's stream URL, another origin) is held to the same allow-list as ?api=."""
    named = quote(origin(foreign), safe="")
    visit = open_console(browser, f"{origin(deployed)}/console/index.html?stream={named}")
    visit.page.wait_for_function("() => document.querySelector('#status').textContent !== ''")  # boot is done
    visit.page.wait_for_load_state("networkidle")
    assert foreign.seen == []
    expect(visit.page.locator("#status")).to_contain_text(f"and ?stream= names {origin(foreign)}")
    expect(visit.page.locator("#signin")).to_be_hidden()
    assert all(url.startswith(origin(deployed) + "/console/") for url in visit.requests), visit.requests
    visit.close()
