// The memory console: chat with a persona, see what each reply recalled and why, watch the user's memories
// form and change, and follow each session through dreaming. Plain DOM, no build step, no third-party
// request: it talks to the API it was served with (the local stack) or the one named by ?api=, if allowed.
// Every text from the API is put in the page with textContent, never parsed as HTML.

const CATEGORIES = ["fact", "preference", "event", "emotion", "relation"];
const POLL_MS = 3000;
const params = new URLSearchParams(location.search);

// ?api= decides where the bearer token goes, and anyone can send a person a link with any ?api= in it: only
// this page's own origin, or an origin the deployer listed in index.html's <meta name="eros-api-origins">
// (space-separated, e.g. "https://api.example.com"), is used. Any other makes the console refuse to start:
// not one request is made to it (served without the local stack's Content-Security-Policy, nothing else
// would stop the token from going there).
function allowedOrigins() {
  const listed = document.querySelector('meta[name="eros-api-origins"]')?.content || "";
  const origins = new Set([location.origin]);
  for (const entry of listed.split(/\s+/).filter(Boolean)) {
    try { origins.add(new URL(entry).origin); } catch { /* not a URL: allows nothing */ }
  }
  return origins;
}

function apiOf(named) {
  if (!named) return { base: "" };
  let url = null;
  try { url = new URL(named, location.href); } catch { /* refused below */ }
  if (!url || !["http:", "https:"].includes(url.protocol)) return { refused: "an address that is not an http(s) URL" };
  if (!allowedOrigins().has(url.origin)) return { refused: url.origin };  // never the rest of what the link says
  return { base: `${url.origin}${url.pathname}`.replace(/\/+$/, "") };
}

const TARGET = apiOf(params.get("api"));
const API = TARGET.base || "";
// ?stream= names where a chat turn's streamed reply is asked for (POST .../turns/stream): a deployed API answers
// it from a Lambda function URL, another origin than the API's (docs/DEPLOY.md), allowed as ?api= is. Without it,
// the API's own address. The JSON routes always go to API.
const STREAM_TARGET = params.get("stream") ? apiOf(params.get("stream")) : TARGET;
const STREAM = STREAM_TARGET.base || API;
const REFUSED = TARGET.refused || STREAM_TARGET.refused;

const state = {
  local: false, token: null, user: null, app: null, personas: [], sessions: [], session: null,
  memories: new Map(), listed: "", live: new Map(), timer: null, down: false,
  streams: null,  // false once the API answered that it has no stream route
  unsent: null,  // the message whose turn failed, {key: session and text, id: its client_turn_id}
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function say(text, isError = false) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("error", isError);
}

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;  // 0: no answer at all (the stack is stopped, or the network is down)
    this.body = body;
  }
}

async function call(method, path, body) {
  if (REFUSED) throw new Error("this console may not send requests to that API");
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(`${path.startsWith("/local/") ? "" : API}${path}`,
      { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch {  // the browser's own words ("Failed to fetch", "NetworkError when…") say nothing of why
    throw new ApiError(0, { code: "unreachable", message: "the API cannot be reached" });
  }
  const data = await jsonOf(response);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

async function jsonOf(response) {
  const text = await response.text();
  try { return text ? JSON.parse(text) : null; } catch { return { message: text }; }
}

// --- a streamed turn ------------------------------------------------------------------------------------------------
// POST /v1/sessions/{id}/turns/stream answers Server-Sent Events (layers/eros/eros/streaming.py): `turn` once the
// message is stored, `delta` for each piece of the reply as the model writes it, then `done` (the JSON route's
// answer) or `error` (the API's error body). Read with fetch and a ReadableStream: EventSource cannot POST, nor send
// the bearer token.

// The events of a fetch's body as they arrive: {event, data} with data the event's JSON.
async function* serverEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

// The stream route is not there (an API deployed before it): the JSON route takes the turn instead.
class NoStreamRoute extends Error {}

// API Gateway's own 404 for a route it does not have is {"message": "Not Found"}; the chat function's (Powertools')
// {"code": "not_found", "message": "Not found"}. A 404 that says more ("session not found") is the API's answer
// about the session: said as it is.
const routeMissing = (status, body) => status === 405
  || (status === 404 && (!body?.code || /^(not found|no route .*)$/i.test(body.message || "")));

// One turn through the stream route. ``stored()`` is called once the server has stored the message (the `turn`
// event), ``shown(text)`` with the reply so far each time it grows; resolves to the `done` event's data. A stream
// that breaks off before its last event is asked for once more with the same client_turn_id: the server replays the
// stored reply (or waits for the turn it is still finishing), and what is on screen never goes back.
async function streamTurn(path, body, { stored, shown }) {
  if (REFUSED) throw new Error("this console may not send requests to that API");
  const headers = { Accept: "text/event-stream", "Content-Type": "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  let said = "";
  for (let attempt = 0; attempt < 2; attempt += 1) {
    let response;
    try {
      response = await fetch(`${STREAM}${path}/stream`, { method: "POST", headers, body: JSON.stringify(body) });
    } catch {
      continue;  // no answer at all: once more, then said as unreachable
    }
    if (!response.ok) {
      const data = await jsonOf(response);
      if (routeMissing(response.status, data)) throw new NoStreamRoute();
      throw new ApiError(response.status, data);
    }
    let heard = "";
    try {
      for await (const { event, data } of serverEvents(response)) {
        if (event === "turn") {
          stored();
        } else if (event === "delta") {
          heard += data.delta;
          if (heard.length > said.length) { said = heard; shown(said); }
        } else if (event === "done") {
          return data;
        } else if (event === "error") {
          throw new ApiError(data.statusCode || 500, data);
        }
      }
    } catch (error) {
      if (error instanceof ApiError) throw error;  // the server's last word: not a broken stream
    }
    // Ended (or broke) before `done` or `error`: the connection was lost on the way.
    if (attempt === 1) throw new ApiError(0, { code: "stream_broken", message: "the reply's stream broke off" });
  }
  throw new ApiError(0, { code: "unreachable", message: "the API cannot be reached" });
}

// A turn's id, made once per message: a message sent again after a failure (the same text, in the same session)
// keeps it, so the server stores it once and replays a reply it already has.
function newTurnId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return [...crypto.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// --- what went wrong, in words for a person ---------------------------------------------------------------------
// The API's `code` is stable (docs/API.md, "Errors"): each a person can meet here is said in a sentence of its own,
// and a refused field by its label and what it takes, never in the validator's wording. A code not named here
// keeps the API's message, which is written for people.
const FIELDS = { content: "Content", category: "Category", importance: "Importance", occurred_at: "When",
  name: "Name", description: "Description", system_prompt: "Prompt", persona_id: "Persona" };
const TAKES = {
  occurred_at: "a week (2026-W47), a month (2019-03), a year (2019) or a day (2026-12-03)",
  importance: "a number from 0 to 1", category: `one of ${CATEGORIES.join(", ")}`,
};
const SAID = {
  unauthorized: "Your sign-in has expired: sign out and sign in again.",
  not_found: "That is not there any more (deleted meanwhile?): press Refresh to see what is.",
  memory_not_current: "This memory changed meanwhile: press Refresh, then edit its current version.",
  memory_active: "This memory is already the current one: there is nothing to restore.",
  not_an_episode_field: "An episode has only its text and its time to correct.",
  payload_too_large: "That is too much to send at once: shorten it.",
  rate_limited: "Too many requests just now: wait a moment, then try again.",
  budget_exhausted: "Today's allowance is used up: try again tomorrow.",
  database_unavailable: "The database is not answering: try again in a moment.",
  database_busy: "The database was busy with another change: try again.",
  model_unavailable: "The model is not answering: try again in a moment.",
  model_timeout: "The model took too long to answer: try again.",
  model_error: "The model refused this request.",
  turn_in_progress: "This message is still being answered: wait a moment, then send it again (it is answered "
    + "once).",
  stream_broken: "The connection kept breaking while the reply was arriving: send the message again (its reply "
    + "is kept, not written twice).",
  internal_error: "Something broke on the server (a bug): try again, and report it if it happens again.",
};
const BY_STATUS = { 0: "unreachable", 401: "unauthorized", 413: "payload_too_large" };

function fieldProblem({ field = "", problem = "" }) {
  const name = field.split(".").pop();
  const label = FIELDS[name];
  if (!label) return null;
  if (TAKES[name]) return `${label} must be ${TAKES[name]}.`;
  if (/at least 1 character/.test(problem)) return `${label} cannot be empty.`;
  const most = /at most (\d+) characters/.exec(problem);
  if (most) return `${label} is too long: at most ${Number(most[1]).toLocaleString("en")} characters.`;
  if (/stored/.test(problem)) return `${label} has a character that cannot be stored: remove it.`;
  return `${label} is not accepted: check it.`;
}

function plainly(error) {
  const body = error.body || {};
  const code = body.code || BY_STATUS[error.status];
  if (code === "unreachable") {
    return state.local ? "The local stack is not running: start it with make run, then reload this page."
      : `The API at ${API || location.origin} cannot be reached: check your connection, or whether it is up.`;
  }
  if (code === "invalid_request" && Array.isArray(body.errors)) {
    const said = [...new Set(body.errors.map(fieldProblem).filter(Boolean))];
    return said.length ? said.join(" ") : "The server did not accept what was sent: check what you typed.";
  }
  return SAID[code] || error.message;
}

// The fields a refusal names (for aria-invalid), by their API names.
const refusedFields = (error) => (Array.isArray(error.body?.errors)
  ? error.body.errors.map((e) => String(e.field || "").split(".").pop()) : []);

// A form's own error line, beside what it is about (role=alert: a screen reader says it); null clears it.
function formError(form, error) {
  let line = form.querySelector(".form-error");
  if (!line) {
    line = el("p", { class: "form-error", role: "alert" });
    form.querySelector(".actions, button[type=submit]").before(line);
  }
  line.textContent = error ? plainly(error) : "";
  line.hidden = !error;
}

// --- time and numbers ----------------------------------------------------------------------------------------
function ago(iso) {
  if (!iso) return "never";
  const seconds = Math.round((Date.now() - Date.parse(iso)) / 1000);
  const future = seconds < 0;
  const s = Math.abs(seconds);
  const text = s < 60 ? `${s} s` : s < 3600 ? `${Math.round(s / 60)} min` : s < 86400 ? `${Math.round(s / 3600)} h`
    : `${Math.round(s / 86400)} d`;
  return future ? `in ${text}` : `${text} ago`;
}

// A memory's event time ("2026-W47", "2019-03", "2019" or "2026-12-03", with its precision) in words, as the
// chat prompt puts it: a week by its Monday, a month by its name; a day and a year read as they are.
const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
  "November", "December"];

function when(memory) {
  const text = memory.occurred_at;
  if (!text) return null;
  if (memory.occurred_precision === "week") {
    const [year, week] = text.split("-W").map(Number);
    const jan4 = Date.UTC(year, 0, 4);  // always in ISO week 1
    const monday = jan4 - ((new Date(jan4).getUTCDay() + 6) % 7) * 86400000 + (week - 1) * 7 * 86400000;
    return `the week of ${new Date(monday).toISOString().slice(0, 10)}`;
  }
  if (memory.occurred_precision === "month") return `${MONTHS[Number(text.slice(5, 7)) - 1]} ${text.slice(0, 4)}`;
  return text;
}

const num = (value, digits = 3) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));
const short = (id) => String(id).slice(0, 8);

// --- signing in ------------------------------------------------------------------------------------------------
function subjectOf(token) {
  try {
    const payload = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(payload)).sub || "(token)";
  } catch { return "(token)"; }
}

// Who is signed in, as the page shows it: the user, and their app when it is not the first one ("alice @ acme").
// A pasted token's app is not shown: its claim's name is the deployment's setting (APP_CLAIM).
function whoAmI() {
  return state.app && state.app !== "default" ? `${state.user} @ ${state.app}` : state.user;
}

async function signIn(event) {
  event.preventDefault();
  try {
    if (state.local) {
      // The app field is optional: empty signs in a user of the first app, "default", as before apps.
      const app = $("app-id").value.trim();
      const asked = app ? { user: $("user").value, app } : { user: $("user").value };
      const answer = await call("POST", "/local/token", asked);
      state.token = answer.token;
      state.user = answer.user;
      state.app = answer.app || null;
    } else {
      state.token = $("token").value.trim();
      state.user = subjectOf(state.token);
      state.app = null;
    }
    sessionStorage.setItem("eros-console", JSON.stringify({ token: state.token, user: state.user, app: state.app }));
    await start();
  } catch (error) {
    state.token = null;
    say(`Sign-in failed: ${plainly(error)}`, true);
  }
}

function signOut() {
  sessionStorage.removeItem("eros-console");
  clearInterval(state.timer);
  Object.assign(state, { token: null, user: null, app: null, session: null, sessions: [], listed: "" });
  state.memories.clear();
  state.live.clear();
  $("app").hidden = true;
  $("whoami").hidden = true;
  $("signin").hidden = false;
  $("messages").replaceChildren();
  composing(false);
  $("memory-groups").replaceChildren();
  $("dream-sessions").replaceChildren();
  $("first-steps").hidden = true;
  say("Signed out.");
}

async function loadPersonas(selected) {
  const personas = await call("GET", "/v1/personas");
  state.personas = personas.personas;
  $("persona").replaceChildren(...state.personas.map((p) => el("option", { value: p.id, selected: p.id === selected },
    p.own ? `${p.name} (yours)` : `${p.name} (${p.id})`)));
}

async function start() {
  await loadPersonas();
  $("me").textContent = whoAmI();
  $("signin").hidden = true;
  $("whoami").hidden = false;
  $("app").hidden = false;
  $("sweep").hidden = !state.local;
  await refresh();
  // A session the person opened meanwhile ("New session" pressed during sign-in) stays the open one: opening the
  // newest session as well would toggle the message box under their typing.
  if (!state.session) {
    if (state.sessions.length) await openSession(state.sessions[0].id);
    else composing(false);
  }
  clearInterval(state.timer);
  state.timer = setInterval(() => { if (!document.hidden) poll(); }, POLL_MS);
  say(`Signed in as ${whoAmI()}.`);
}

// The poll's refresh: a stack that stopped answering is said at once (the page would only look frozen), and so is
// its coming back; other failures wait for the person's next action to be said.
async function poll() {
  try {
    await refresh();
    if (state.down) say("The stack answers again.");
    state.down = false;
  } catch (error) {
    if (error.status === 0) say(plainly(error), true);
    state.down = error.status === 0;
  }
}

// --- chat ---------------------------------------------------------------------------------------------------------
function personaOf(session) {
  const persona = state.personas.find((p) => p.id === session.persona_id);
  return persona ? persona.name : session.persona_id;
}

function currentPersona() {
  const session = state.sessions.find((s) => s.id === state.session);
  return session ? personaOf(session) : "persona";
}

function renderSessionPicker() {
  const picker = $("session");
  picker.replaceChildren(...state.sessions.map((s) =>
    el("option", { value: s.id, selected: s.id === state.session }, `${personaOf(s)} · ${short(s.id)} · ${ago(s.created_at)}`)));
}

// The message box is enabled only while a session's history is on the page (openSession): from the page's load,
// and from the moment "New session" is pressed, a message typed waits for its session instead of going to the
// previous one, or nowhere (send() has no session yet).
async function newSession(event) {
  event.preventDefault();
  const previous = state.session;
  composing(false);
  try {
    const session = await call("POST", "/v1/sessions", { persona_id: $("persona").value });
    await refreshSessions();
    await openSession(session.id);
    $("message").focus();
  } catch (error) {
    if (previous && state.session === previous) composing(true);  // still on the session it was on
    say(plainly(error), true);
  }
}

// A character of the person's own (POST /v1/personas): visible to them alone; picked for the next session. What the
// server refuses keeps the form as it was, with the reason said.
async function newPersona(event) {
  event.preventDefault();
  const body = { name: $("persona-name").value.trim(), description: $("persona-description").value.trim(),
                 system_prompt: $("persona-prompt").value.trim() };
  try {
    const made = await call("POST", "/v1/personas", body);
    await loadPersonas(made.id);
    for (const field of ["persona-name", "persona-description", "persona-prompt"]) $(field).value = "";
    $("new-persona-box").open = false;
    formError($("new-persona"), null);
    say(`Character ${made.name} made: start a session with it.`);
  } catch (error) {
    formError($("new-persona"), error);
  }
}

function composing(enabled) {
  for (const control of [$("message"), $("send").querySelector("button")]) control.disabled = !enabled;
}

async function openSession(id) {
  composing(false);  // until the session's history is on the page (a message sent meanwhile would be wiped)
  state.session = id;
  renderSessionPicker();
  const page = await call("GET", `/v1/sessions/${id}/messages?limit=200`);
  if (state.session !== id) return;  // another session was picked meanwhile
  $("messages").replaceChildren(...page.messages.slice().reverse().map(renderMessage));
  scrollMessages();
  composing(true);
}

function scrollMessages() {
  const list = $("messages");
  list.scrollTop = list.scrollHeight;
}

function renderMessage(message) {
  const recalled = state.live.get(message.id) || message.recalled;
  return el("li", { class: `message ${message.role}`, "data-id": message.id },
    el("span", { class: "who" }, message.role === "user" ? state.user : currentPersona()),
    el("p", {}, message.content),
    message.role === "assistant" ? renderRecalled(recalled || []) : null);
}

function renderRecalled(recalled) {
  if (!recalled.length) return el("p", { class: "recalled-none" }, "Recalled nothing.");
  const groups = new Map();
  for (const item of recalled) {
    const key = item.layer === "profile" ? `profile · ${item.category}` : "relationship";
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(item);
  }
  return el("details", { class: "recalled" },
    el("summary", {}, `Recalled ${recalled.length} memor${recalled.length === 1 ? "y" : "ies"}`),
    ...[...groups].map(([key, items]) => el("div", { class: "recalled-group" },
      el("h4", {}, key),
      el("ul", {}, items.map((item) => {
        const known = state.memories.get(item.id);
        const text = item.content || (known ? known.content : "(not in the memory panel: deleted or history)");
        const p = item.parts || {};
        return el("li", { class: "recalled-item", "data-id": item.id },
          el("span", { class: "recalled-text" }, text),
          el("span", { class: "score" }, `score ${num(item.score)} = similarity ${num(p.similarity)}`
            + ` + recency ${num(p.recency)} + importance ${num(p.importance)} + lexical ${num(p.lexical)}`
            + ` − demotion ${num(p.demotion)}`));
      })))));
}

async function send(event) {
  event.preventDefault();
  const box = $("message");
  const content = box.value.trim();
  if (!content || !state.session) return;
  composing(false);
  const pending = el("li", { class: "message user pending" }, el("span", { class: "who" }, state.user),
    el("p", {}, content));
  $("messages").append(pending);
  scrollMessages();
  const key = `${state.session}\n${content}`;
  if (state.unsent?.key !== key) state.unsent = { key, id: newTurnId() };
  const path = `/v1/sessions/${state.session}/turns`;
  const body = { content, client_turn_id: state.unsent.id };
  let arriving = null;  // the reply, as its words arrive
  const shown = (text) => {
    if (!arriving) {
      arriving = el("li", { class: "message assistant streaming", "aria-busy": "true" },
        el("span", { class: "who" }, currentPersona()), el("p", {}));
      $("messages").append(arriving);
    }
    arriving.querySelector("p").textContent = text;
    scrollMessages();
  };
  const stored = () => {  // the server has the message: it is no longer only in the box
    pending.classList.remove("pending");
    box.value = "";
  };
  try {
    let turn = null;
    if (state.streams !== false) {
      try {
        turn = await streamTurn(path, body, { stored, shown });
      } catch (error) {
        if (!(error instanceof NoStreamRoute)) throw error;
        state.streams = false;  // an API without the stream route: every turn goes to the JSON route from now on
      }
    }
    turn ||= await call("POST", path, body);
    state.unsent = null;
    box.value = "";
    state.live.set(turn.assistant_message_id, turn.recalled);
    pending.replaceWith(renderMessage({ id: turn.user_message_id, role: "user", content }));
    const reply = renderMessage({ id: turn.assistant_message_id, role: "assistant", content: turn.reply,
      recalled: turn.recalled });
    if (arriving) arriving.replaceWith(reply);
    else $("messages").append(reply);
    scrollMessages();
    await refresh();
  } catch (error) {
    arriving?.remove();  // a reply that failed half-way is not stored, so not shown either
    pending.classList.add("failed");
    box.value ||= content;  // to send again (with the same client_turn_id)
    const said = plainly(error);
    say(`The turn failed. ${said}${error.body?.retryable && !/try again/.test(said) ? " Try again." : ""}`, true);
  } finally {
    composing(true);
    box.focus();
  }
}

// --- memories ----------------------------------------------------------------------------------------------------
// A poll does not redraw the panel while the person is in the middle of something there (an edit, a history,
// a delete awaiting its confirmation); an action of theirs (``force``) always does.
async function refreshMemories(force = false) {
  const history = $("show-history").checked ? "&include=superseded" : "";
  const page = await call("GET", `/v1/memories?limit=500${history}`);
  const listed = JSON.stringify(page.memories);
  state.memories = new Map(page.memories.map((m) => [m.id, m]));
  const editing = document.querySelector("#memory-groups form, #memory-groups .history, #memory-groups [data-armed]");
  if (!force && (listed === state.listed || editing)) return;
  state.listed = listed;
  renderMemories(page.memories);
}

function renderMemories(memories) {
  const groups = new Map();
  for (const category of CATEGORIES) groups.set(`profile · ${category}`, []);
  for (const memory of memories) {
    const key = memory.layer === "profile" ? `profile · ${memory.category}`
      : `${memory.source === "episode" ? "episodes" : "relationship"} · ${memory.persona_id}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(memory);
  }
  const shown = [...groups].filter(([, items]) => items.length);
  $("memory-groups").replaceChildren(...(shown.length ? shown.map(([key, items]) => el("section",
    { class: "memory-group", "aria-label": key }, el("h3", {}, `${key} (${items.length})`),
    el("ul", {}, items.map(renderMemory)))) : [el("p", { class: "note" }, "No memories yet. Chat, then sweep.")]));
}

function provenance(memory) {
  const parts = [`${memory.source}`];
  if (memory.session_id) parts.push(`session ${short(memory.session_id)}`);
  if (memory.from_message_id) {
    parts.push(memory.from_message_id === memory.through_message_id ? `message ${memory.from_message_id}`
      : `messages ${memory.from_message_id}–${memory.through_message_id}`);
  }
  if (memory.model) parts.push(`by ${memory.model}`);
  return parts.join(" · ");
}

function renderMemory(memory) {
  const superseded = Boolean(memory.superseded_at);
  const episode = memory.source === "episode";
  const item = el("li", { class: `memory${superseded ? " superseded" : ""}${episode ? " episode" : ""}`,
    "data-id": memory.id },
    episode ? el("p", { class: "meta badge episode-badge" }, `episode of session ${short(memory.session_id || "")}`)
      : null,
    el("p", { class: "memory-text" }, memory.content),
    when(memory) ? el("p", { class: "meta when" }, `when: ${when(memory)}`) : null,
    el("p", { class: "meta" },
      `importance ${num(memory.importance, 2)} · written ${ago(memory.created_at)} · `
      + (memory.last_confirmed_at ? `last confirmed ${ago(memory.last_confirmed_at)}` : "not repeated yet")
      + ` · mentioned ${memory.mention_count}×`),
    el("p", { class: "meta" }, provenance(memory)),
    superseded ? el("p", { class: "meta badge" },
      `superseded (${memory.superseded_reason}) ${ago(memory.superseded_at)}`) : null);
  const actions = el("div", { class: "actions" });
  actions.append(el("button", { type: "button", onclick: () => toggleHistory(item, memory) }, "History"));
  if (superseded) {
    actions.append(el("button", { type: "button", onclick: () => act("POST", `/v1/memories/${memory.id}/restore`,
      undefined, "Restored.") }, "Restore"));
  } else if (memory.layer === "profile" || episode) {
    actions.append(el("button", { type: "button", onclick: () => editForm(item, memory) }, "Edit"));
  }
  const remove = el("button", { type: "button", class: "danger" }, "Delete");
  remove.addEventListener("click", () => {
    if (remove.dataset.armed) return act("DELETE", `/v1/memories/${memory.id}`, undefined, "Deleted.");
    remove.dataset.armed = "1";
    remove.textContent = "Confirm delete";
    remove.focus();
  });
  actions.append(remove);
  item.append(actions);
  return item;
}

// A change, then the panels that show it; what the server refuses goes to ``refused`` (the form it came from), else
// to the status line. True once the change is made.
async function act(method, path, body, done, refused = (error) => say(plainly(error), true)) {
  try {
    await call(method, path, body);
  } catch (error) { refused(error); return false; }
  try {
    await Promise.all([refreshMemories(true), refreshSessions()]);
    say(done);  // once the panel shows it
  } catch (error) { say(plainly(error), true); }
  return true;
}

async function toggleHistory(item, memory) {
  const open = item.querySelector(".history");
  if (open) { open.remove(); return refreshMemories(true); }
  try {
    const chain = await call("GET", `/v1/memories/${memory.id}`);
    item.append(el("ol", { class: "history", "aria-label": "History, oldest first" },
      chain.history.map((version) => el("li", { class: version.id === memory.id ? "this" : "" },
        el("span", {}, version.content), " ",
        when(version) ? el("span", { class: "meta" }, `(${when(version)}) `) : null,
        el("span", { class: "meta" }, version.superseded_at
          ? `→ ${version.superseded_reason} ${ago(version.superseded_at)}` : "current")))));
  } catch (error) { say(plainly(error), true); }
}

// The form stays, with what the person typed, until the server takes the change: a refusal is said inside it, in
// words, and the field it names is marked.
function editForm(item, memory) {
  if (item.querySelector("form")) return;
  const content = el("textarea", { rows: 2, maxlength: 4000, required: true });
  content.value = memory.content;
  const category = el("select", {},
    CATEGORIES.map((c) => el("option", { value: c, selected: c === memory.category }, c)));
  const importance = el("input", { type: "number", min: 0, max: 1, step: 0.05, value: memory.importance ?? "" });
  const occurred = whenInput(memory.occurred_at);
  const episode = memory.source === "episode";  // an episode has no category or importance: corrected in place
  const save = el("button", { type: "submit" }, "Save");
  const form = el("form", { class: "stack edit", "aria-label": "Edit memory" },
    el("label", {}, "Content", content),
    episode ? null : el("label", {}, "Category", category),
    episode ? null : el("label", {}, "Importance", importance),
    el("label", {}, "When", occurred),
    el("div", { class: "actions" }, save,
      el("button", { type: "button", onclick: () => { form.remove(); refreshMemories(true); } },
        "Cancel")));
  const fields = { content, category, importance, occurred_at: occurred };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const changes = {};
    if (content.value.trim() !== memory.content) changes.content = content.value.trim();
    if (!episode && category.value !== memory.category) changes.category = category.value;
    if (!episode && importance.value !== "" && Number(importance.value) !== memory.importance) {
      changes.importance = Number(importance.value);
    }
    if (occurred.value.trim() !== (memory.occurred_at || "")) changes.occurred_at = occurred.value.trim() || null;
    if (!Object.keys(changes).length) { form.remove(); return refreshMemories(true); }
    save.disabled = true;
    const refused = (error) => {
      formError(form, error);
      const named = refusedFields(error);
      for (const [name, field] of Object.entries(fields)) field.toggleAttribute("aria-invalid", named.includes(name));
      (Object.entries(fields).find(([name]) => named.includes(name))?.[1] || content).focus();
    };
    const saved = await act("PATCH", `/v1/memories/${memory.id}`, changes,
      episode ? "Saved: the episode is corrected." : "Saved: a new version supersedes the old one.", refused);
    if (saved) form.remove();  // the panel's redraw has already replaced it
    else save.disabled = false;
  });
  item.append(form);
  content.focus();
}

// The event time as the API takes it; empty: none (an edit sends null, which clears it).
function whenInput(value) {
  return el("input", { type: "text", maxlength: 10, value: value || "",
    placeholder: "optional: 2026-W47, 2019-03, 2019 or 2026-12-03" });
}

async function addMemory(event) {
  event.preventDefault();
  const content = $("new-content").value.trim();
  if (!content) return;
  const body = { content, category: $("new-category").value };
  if ($("new-when").value.trim()) body.occurred_at = $("new-when").value.trim();
  const form = $("add-memory");
  if (!await act("POST", "/v1/memories", body, "Memory added.", (error) => formError(form, error))) return;
  formError(form, null);
  $("new-content").value = "";  // only once it is stored: a refusal keeps what was typed
  $("new-when").value = "";
}

// --- dreaming ----------------------------------------------------------------------------------------------------
const STATES = {
  active: "chatting: dreamt about once quiet", waiting: "quiet: the next sweep takes it",
  claimed: "being extracted", retrying: "failed, will retry", extracted: "extracted",
  nothing: "extracted: nothing in it to remember", failed: "given up",
};

// An imported history (eros import, POST /v1/imports) and how far dreaming has distilled it, oldest first.
async function refreshImport() {
  const progress = await call("GET", "/v1/imports");
  const line = $("import-progress");
  line.hidden = progress.state === "none";
  if (line.hidden) return;
  const through = progress.distilled_through ? ` · distilled through ${progress.distilled_through.slice(0, 10)}` : "";
  line.textContent = `Imported history: ${progress.extracted} of ${progress.sessions} conversation(s) extracted`
    + (progress.failed ? `, ${progress.failed} given up` : "")
    + (progress.state === "done" ? " · done" : ` · ${progress.waiting + progress.in_progress} to go, oldest first`)
    + through;
}

async function refreshSessions() {
  refreshImport().catch(() => {});
  const body = await call("GET", "/v1/sessions");
  state.sessions = body.sessions;
  $("first-steps").hidden = state.sessions.length > 0;
  $("session").closest("label").hidden = !state.sessions.length;  // an empty picker says nothing
  renderSessionPicker();
  $("dream-sessions").replaceChildren(...state.sessions.map((s) => {
    const d = s.dreaming;
    return el("li", { class: `dream ${d.state}`, "data-id": s.id },
      el("span", { class: `badge state-${d.state}` }, d.state),
      ` ${personaOf(s)} · ${short(s.id)} · last message ${ago(s.last_active_at)} · ${STATES[d.state]}`,
      (d.state === "active" || d.state === "retrying") && d.due_at ? ` (${ago(d.due_at)})` : "",
      d.attempts ? ` · attempts ${d.attempts}` : "",
      d.error && d.state !== "nothing" ? el("span", { class: "error-text" }, ` · ${d.error}`) : null);
  }));
}

async function sweepNow() {
  const button = $("sweep");
  button.disabled = true;
  $("sweep-result").textContent = "Sweeping…";
  try {
    const result = await call("POST", "/local/sweep", { idle_now: true });
    const jobs = result.jobs.map((job) => job.kind === "session"
      ? `session ${short(job.session_id)}: ${job.outcome}${job.memories ? ` (${job.memories} new)` : ""}`
        + (job.episode ? `, episode ${job.episode}` : "")
      : `deep pass: ${job.outcome}`);
    $("sweep-result").textContent = `Claimed ${result.claimed} session(s)${jobs.length ? ": " : "."}${jobs.join("; ")}`;
    await Promise.all([refreshMemories(true), refreshSessions(), refreshEvents()]);
  } catch (error) {
    $("sweep-result").textContent = `Sweep failed: ${plainly(error)}`;
  } finally { button.disabled = false; }
}

async function refresh() {
  await Promise.all([refreshMemories(), refreshSessions(), refreshEvents()]);
}

// The local stack's memory events of the signed-in user (GET /local/events: what its sweeps published), newest
// first. A deployed API has none to show here: its events are on an EventBridge bus (docs/EVENTS.md).
async function refreshEvents() {
  $("events").hidden = !state.local;
  if (!state.local) return;
  const { events } = await call("GET", "/local/events");
  $("event-list").replaceChildren(...events.slice().reverse().map((e) => el("li", { "data-type": e.type },
    `#${e.seq} ${e.type}`, el("span", { class: "note" },
      ` · ${ago(e.occurred_at)}${e.memory_id ? ` · memory ${short(e.memory_id)}` : ""}`
      + `${e.session_id ? ` · session ${short(e.session_id)}` : ""}`
      + `${e.detail && e.detail.reason ? ` · ${e.detail.reason}` : ""}`))));
}

// Without a model (the local stack with no key: the offline stand-ins), replies are echoes and memories a crude pick
// of the person's own words: said on screen, so that nobody takes that for what the engine does. /v1/health needs no
// token; an API that does not say (an older one) shows nothing.
async function showOfflineNote() {
  let report;
  try { report = await call("GET", "/v1/health"); } catch (error) { report = error.body; }  // degraded: a 503
  const offline = Array.isArray(report?.offline) ? report.offline : [];
  const said = [];
  if (offline.includes("llm")) {
    said.push("Offline mode: no model is configured, so replies are echoes and memories look crude (a stand-in "
      + "writes them from your own sentences by rule). Set OPENROUTER_API_KEY (or LLM_BASE_URL and CHAT_MODEL) and "
      + "restart the stack for real ones.");
  }
  if (offline.includes("embedder")) {
    said.push(`No embedding model is configured${said.length ? " either" : ""}: recall matches words, not meaning `
      + "(set VOYAGE_API_KEY or EMBED_BASE_URL).");
  }
  $("offline-note").textContent = said.join(" ");
  $("offline-note").hidden = !said.length;
  $("offline-note").dataset.offline = offline.join(" ");  // what the API said (empty: real providers, or unsaid)
}

// --- start ---------------------------------------------------------------------------------------------------------
async function boot() {
  $("new-category").replaceChildren(...CATEGORIES.map((c) => el("option", { value: c }, c)));
  $("signin").addEventListener("submit", signIn);
  $("signout").addEventListener("click", signOut);
  $("new-session").addEventListener("submit", newSession);
  $("new-persona").addEventListener("submit", newPersona);
  $("session").addEventListener("change", (event) => openSession(event.target.value)
    .catch((e) => say(plainly(e), true)));
  $("send").addEventListener("submit", send);
  $("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("send").requestSubmit(); }
  });
  $("show-history").addEventListener("change", () => refreshMemories(true));
  $("refresh").addEventListener("click", () => Promise.all([refreshMemories(true), refreshSessions()])
    .catch((e) => say(plainly(e), true)));
  $("add-memory").addEventListener("submit", addMemory);
  $("sweep").addEventListener("click", sweepNow);
  if (REFUSED) {
    const [name, origin] = TARGET.refused ? ["api", TARGET.refused] : ["stream", STREAM_TARGET.refused];
    $("signin").hidden = true;
    say(`Not signing in: this console sends your token only to its own origin (${location.origin}) or to one its `
      + `deployer allowed, and ?${name}= names ${origin}. Open the console without ?${name}=, or ask whoever `
      + "deployed it to add that origin to eros-api-origins in index.html.", true);
    return;
  }
  showOfflineNote().catch(() => {});
  try {
    const stack = await call("GET", "/local/stack");
    state.local = Boolean(stack && stack.local) && !API;
    if (state.local) $("idle-note").textContent = `Sessions are dreamt about after ${stack.dreaming_idle_secs} s `
      + "of quiet; “Sweep now” takes every session with new messages at once.";
  } catch { state.local = false; }
  $("user-field").hidden = !state.local;
  $("app-field").hidden = !state.local;
  $("user").required = state.local;
  $("token-field").hidden = state.local;
  $("token").required = !state.local;
  // Until here a click on "Sign in" would have taken the token path even on the local stack (an empty token:
  // a 401 instead of the local sign-in), so the button waits for this.
  $("signin-button").disabled = false;
  const saved = JSON.parse(sessionStorage.getItem("eros-console") || "null");
  if (saved && saved.token) {
    Object.assign(state, saved);
    try { await start(); return; } catch { signOut(); }
  }
  say(state.local ? "Local stack: sign in as any user." : `Paste a bearer token for ${API || location.origin}.`);
  (state.local ? $("user") : $("token")).focus();
}

boot();
