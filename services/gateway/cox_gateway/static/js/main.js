// The console's controller: token, session list, opening a session (its backlog, then the live
// stream), the composer and its keys. Everything goes through the v1 API.

import { Api } from "./api.js";
import { Attachments } from "./attach.js";
import { $, clear, focusMovedSince, h } from "./dom.js";
import { Inspector } from "./inspector.js";
import { Review } from "./review.js";
import { EventStream } from "./sse.js";
import { SessionModel } from "./state.js";
import { runLabel, tickElapsed, View } from "./view.js";

const TOKEN_KEY = "cox.token";
const HINT_BUSY = "A turn is running: Send is refused. Choose Queue (Ctrl+O) or Steer (Ctrl+S), or Lead (Ctrl+L) to join this turn.";
const HINT_RUN = "Refused: a run drives this session (409 run_active), so nothing was sent. Stop (Esc) ends the run; after that a message goes on with the task as a chat. Your text is still in the box.";
const SESSIONS_EVERY_MS = 5000; // the list follows runs started elsewhere
const PROGRAMS_EVERY_MS = 2000; // programs' output tails, while the inspector shows running ones

const app = {
  api: null, model: null, stream: null, view: null, inspector: null, models: [],
  drawTimer: null, sessionTimer: null, workspaces: [], noteCtx: null,
  needs: new Map(),       // sid -> pending approvals, from the session list (the open one: live)
  titles: new Map(),      // sid -> title, for what the tab title and announcements say
};
window.cox = app; // for a person's console and the browser tests

// ---------------------------------------------------------------- token
/** How many times logging in, or opening a session, asks before it shows the error. */
const OPEN_TRIES = 10;

/** The gateway busy or restarting: a 5xx, or no answer at all (status 0). A 4xx is an answer. */
function isTransient(err) {
  return err.status === 0 || err.status >= 500;
}

/** The wait before asking again: 0.5 s more each time, at most 3 s (about 20 s over OPEN_TRIES). */
function pause(attempt) {
  return new Promise((resolve) => setTimeout(resolve, Math.min(500 * attempt, 3000)));
}

function showLogin(message = "") {
  app.stream?.stop();
  $("#app").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message;
  $("#login-token").focus();
}

function forget(message) {
  localStorage.removeItem(TOKEN_KEY);
  showLogin(message);
}

$("#login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const token = $("#login-token").value.trim();
  if (!token) return;
  const api = new Api(token);
  for (let attempt = 1; ; attempt++) {
    try {
      await api.sessions();
      break;
    } catch (err) {
      // A 401 is an answer; the gateway busy or restarting is asked again, as opening a session is.
      if (!isTransient(err) || attempt >= OPEN_TRIES) {
        $("#login-error").textContent = err.status === 401 ? "That token is not known to this server." : (err.detail || err.message);
        return;
      }
      $("#login-error").textContent = "The server is not answering; trying again.";
      await pause(attempt);
    }
  }
  $("#login-error").textContent = "";
  localStorage.setItem(TOKEN_KEY, token);
  $("#login-token").value = "";
  start(token);
});

$("#logout").addEventListener("click", () => forget(""));

// ---------------------------------------------------------------- sessions
async function loadModels() {
  try {
    const m = await app.api.models();
    app.models = m.models || [];
    const opts = (sel) => clear(sel, app.models.map((n) => h("option", { value: n }, n)));
    opts($("#new-model")); opts($("#model"));
    if (m.default) $("#new-model").value = m.default;
  } catch (err) {
    $("#new-error").textContent = `models: ${err.detail || err.message}`;
  }
}

async function loadWorkspaces() {
  try {
    const r = await app.api.workspaces();
    app.workspaces = r.workspaces || [];
  } catch { app.workspaces = []; }
  clear($("#workspace-list"), app.workspaces.map((w) => h("option", { value: w })));
  clear($("#workspace-pick"), h("option", { value: "" }, app.workspaces.length ? "existing workspaces…" : "no workspaces yet"),
    app.workspaces.map((w) => h("option", { value: w }, w)));
}

$("#workspace-pick").addEventListener("change", () => {
  if ($("#workspace-pick").value) { $("#new-workspace").value = $("#workspace-pick").value; $("#new-create").checked = false; }
  $("#new-error").textContent = "";
});
$("#new-workspace").addEventListener("input", () => { $("#new-error").textContent = ""; });

async function loadSessions() {
  let list;
  // "Runs only": the caller's runs (GET /v1/runs), running and ended, newest first.
  const runsOnly = $("#runs-only").checked;
  try { list = runsOnly ? (await app.api.runs()).runs : await app.api.sessions(); } catch { return; }
  if (runsOnly !== $("#runs-only").checked) return; // the filter changed meanwhile: its own load draws
  const cur = app.model?.sid;
  // The open session's run is the live one (its events move it); the list's may be a poll old.
  const live = (s) => (s.id === cur && app.model?.info.run ? app.model.info.run : s.run);
  const before = new Map(app.needs);
  for (const s of list) {
    app.titles.set(s.id, s.title || "untitled");
    if (Array.isArray(s.approvals)) app.needs.set(s.id, s.approvals.length);
  }
  // A session elsewhere that starts waiting for a person: a notification (when allowed and this
  // tab is not in front). The open session says so itself, live.
  for (const s of list) {
    if (s.id !== cur && (app.needs.get(s.id) || 0) > (before.get(s.id) || 0)) notifyNeeds(s.id, `“${s.title || "untitled"}” waits for your approval.`);
  }
  clear($("#sessions"), list.length ? list.map((s) => {
    const run = live(s);
    const needs = needsOf(s.id);
    return h("a", {
      href: `#/s/${s.id}`, class: s.id === cur ? "current" : "", dataset: { sid: s.id, run: run ? run.state : "", state: needs ? "needs" : s.busy ? "busy" : "" },
    }, h("div", {}, s.title || "untitled", sessionMark(s.busy, needs)),
    run ? h("div", { class: `run-badge run-${run.state}`, title: "a run: the program drives this session" }, runLabel(run)) : null,
    h("div", { class: "ws" }, s.workspace.split("/").pop()));
  }) : h("p", { class: "muted empty-list" }, runsOnly ? "No runs yet (POST /v1/runs starts one)." : "No sessions yet."));
  drawAttention(); // the count in the title and the favicon follows the list
}
$("#runs-only").addEventListener("change", () => loadSessions());

// ---------------------------------------------------------------- needs you
/** Pending approvals of a session: the open one from its live model, the others from the list. */
function needsOf(sid) { return app.model?.sid === sid && !app.model.replaying ? app.model.approvals.size : app.needs.get(sid) || 0; }

function sessionMark(busy, needs) {
  if (needs) return h("span", { class: "needs-badge", title: "waiting for your approval" }, needs > 1 ? `needs you (${needs})` : "needs you");
  return busy ? h("span", { class: "dot", title: "working" }) : null;
}

/** The tab title and the favicon count the sessions waiting for a person; the open session's
 *  entry in the list follows it live. */
function drawAttention() {
  if (app.model && !app.model.replaying) app.needs.set(app.model.sid, app.model.approvals.size);
  const waiting = [...app.needs.entries()].filter(([, n]) => n > 0).length;
  const here = app.model ? app.model.info.title || "untitled" : "";
  document.title = (waiting ? `(${waiting}) Needs you · ` : "") + (here ? `${here} · coxswain` : "coxswain");
  document.documentElement.dataset.needs = String(waiting);
  setFavicon(waiting);
  const a = app.model && $(`#sessions a[data-sid="${CSS.escape(app.model.sid)}"]`);
  if (a) {
    const n = app.model.approvals.size;
    a.dataset.state = n ? "needs" : app.model.info.busy ? "busy" : "";
    a.querySelector(".needs-badge, .dot")?.remove();
    const mark = sessionMark(app.model.info.busy, n);
    if (mark) a.firstChild.append(mark);
  }
}

let faviconFor = null;
function setFavicon(n) {
  if (faviconFor === n) return;
  faviconFor = n;
  const c = document.createElement("canvas");
  c.width = c.height = 32;
  const g = c.getContext("2d");
  if (!g) return;
  g.fillStyle = "#2456c7"; g.beginPath(); g.arc(16, 16, 14, 0, 2 * Math.PI); g.fill();
  g.fillStyle = "#fff"; g.font = "bold 18px sans-serif"; g.textAlign = "center"; g.textBaseline = "middle"; g.fillText("c", 16, 17);
  if (n) {
    g.fillStyle = "#b3261e"; g.beginPath(); g.arc(22, 10, 10, 0, 2 * Math.PI); g.fill();
    g.fillStyle = "#fff"; g.font = "bold 14px sans-serif"; g.fillText(n > 9 ? "9+" : String(n), 22, 11);
  }
  const link = $("#favicon");
  link.href = c.toDataURL("image/png");
  link.dataset.count = String(n);
}

/** Say it to a screen reader (an assertive live region), and for a new approval of the open
 *  session move focus to its first button, unless the person is typing a message. */
function announce(text) {
  const el = $("#announce");
  el.textContent = "";
  setTimeout(() => { el.textContent = text; }, 30);
}

function newApprovals(model, added) {
  if (!added.length || model.replaying) return;
  const a = model.approvals.get(added[0]);
  const what = a ? `${a.security ? "Security confirm" : "Approval needed"}: ${a.name || "a tool"}` : "Approval needed";
  const active = document.activeElement;
  // Typing: a text box holding text, unless it is the message just sent (its reply not in yet).
  const typing = active && (active.tagName === "TEXTAREA" || active.tagName === "INPUT") && active.value
    && !(active.id === "draft" && active.value === app.sending);
  const card = $(`#approvals [data-approval="${CSS.escape(added[0])}"]`);
  if (card && !typing && !openDrawer()) card.querySelector("button")?.focus();
  announce(`${what}.${typing && card ? " Alt+A goes to it." : ""}`);
  notifyNeeds(model.sid, `“${model.info.title || "untitled"}”: ${what}.`);
}

// The browser's notification: optional, asked once (the button goes after it is answered), and
// only shown while this tab is not in front.
const NOTIFY_KEY = "cox.notify-asked";
function drawNotify() {
  const supported = "Notification" in window;
  const asked = localStorage.getItem(NOTIFY_KEY) || (supported && Notification.permission !== "default");
  $("#notify").hidden = !supported || !!asked;
  $("#notify-state").textContent = !supported ? "" : Notification.permission === "granted" ? "Notifications on: you hear of a session that needs you."
    : Notification.permission === "denied" ? "Notifications are blocked in this browser." : asked ? "Notifications off." : "";
}
$("#notify").addEventListener("click", async () => {
  localStorage.setItem(NOTIFY_KEY, "1");
  try { await Notification.requestPermission(); } catch { /* an old browser: no promise */ }
  drawNotify();
  $("#draft").offsetParent ? $("#draft").focus() : $("#logout").focus();
});
function notifyNeeds(sid, body) {
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  if (!document.hidden && document.hasFocus()) return;
  try {
    const n = new Notification("coxswain: needs you", { body, tag: `cox-${sid}` });
    n.onclick = () => { window.focus(); location.hash = `#/s/${sid}`; n.close(); };
  } catch { /* notifications from a page need a service worker on some platforms */ }
}

$("#new-session").addEventListener("submit", async (e) => {
  e.preventDefault();
  $("#new-error").textContent = "";
  const workspace = $("#new-workspace").value.trim().replace(/\/+$/, "");
  const model = $("#new-model").value || undefined;
  // A typo must not quietly make a new folder: the server creates one only when "Create a new
  // folder" is ticked (create: false refuses a missing folder with 404 not_found).
  const create = $("#new-create").checked;
  try {
    const s = await app.api.create({ workspace, create, ...(model ? { model } : {}) });
    $("#new-workspace").value = "";
    $("#new-create").checked = false;
    app.focusDraft = true; // the next action is the first message
    location.hash = `#/s/${s.id}`;
    closeDrawers();
    await loadSessions();
    loadWorkspaces();
  } catch (err) {
    $("#new-error").textContent = !create && err.code === "not_found"
      ? `No workspace “${workspace}” under the root. Pick one from the list, or tick “Create a new folder”.`
      : err.detail || err.message;
  }
});

function route() {
  const m = /^#\/s\/([A-Za-z0-9_-]+)$/.exec(location.hash);
  if (m) openSession(m[1]);
  else {
    // Leave the session entirely, so coming back (Back/Forward) opens it again from the log.
    app.stream?.stop();
    app.stream = null;
    app.model = null;
    $("#session").hidden = true; $("#inspector").hidden = true; $("#empty").hidden = false;
    drawAttention();
  }
}
window.addEventListener("hashchange", route);


async function openSession(sid) {
  if (app.model?.sid === sid && !$("#session").hidden) return;
  app.stream?.stop();
  const model = new SessionModel(sid);
  app.model = model;
  for (const d of document.querySelectorAll("dialog[open]")) d.close(); // Review or Rewind of the session left
  app.view.reset();
  app.inspector.reset();
  app.attach.reset();
  $("#empty").hidden = true; $("#session").hidden = false; $("#inspector").hidden = false;
  setStream("loading");
  note("");
  for (let attempt = 1; ; attempt++) {
    try {
      // The backlog first, as JSON pages: what settled before this page opened goes to the
      // transcript only. Then the session object (what is pending now), then the live stream.
      for (;;) {
        const batch = await app.api.events(sid, model.lastSeq);
        if (app.model !== model) return;
        if (!batch.length) break;
        for (const ev of batch) model.apply(ev);
      }
      model.applySession(await app.api.session(sid));
      break;
    } catch (err) {
      if (app.model !== model) return;
      // A 4xx is an answer (no such session, a token refused). The gateway busy or restarting
      // (a 5xx, or no answer at all: status 0) is asked again, for about 20 s, from where the
      // backlog got to: a session opened once stayed "down" for good after one 503.
      if (!isTransient(err) || attempt >= OPEN_TRIES) {
        clear($("#transcript"), h("p", { class: "error" }, err.status === 404 ? "No such session." : (err.detail || err.message)));
        setStream("down");
        return;
      }
      setStream("reconnecting");
      await pause(attempt);
      if (app.model !== model) return;
    }
  }
  if (app.model !== model) return;
  model.replaying = false;
  const from = document.activeElement;
  if (app.focusDraft || !from || from === document.body || from.closest?.("#sessions, #login")) { app.focusDraft = false; setTimeout(focusNext, 0); }
  model.openedWith = new Set(model.approvals.keys()); // pending when the page opened: not "new"
  model.mark("head", "approvals", "outbox", "plan");
  flush();
  loadSessions();
  app.stream = new EventStream({
    url: app.api.eventsUrl(sid), token: app.api.token, after: model.lastSeq,
    onEvent: (ev) => { if (app.model === model) { model.apply(ev); scheduleDraw(); } },
    onStatus: (status) => { if (app.model === model) setStream(status); },
    onUnauthorized: () => forget("The token was refused."),
  }).start();
}

function setStream(status) {
  const el = $("#stream");
  el.textContent = status;
  el.className = "badge " + (status === "live" ? "live" : status === "reconnecting" || status === "down" ? "down" : "muted");
}

function scheduleDraw() {
  if (app.drawTimer) return;
  app.drawTimer = setTimeout(() => { app.drawTimer = null; flush(); }, 16);
}

function flush() {
  const model = app.model;
  if (!model) return;
  const changed = model.changed;
  const added = app.view.draw(model, {
    answer: (aid, body) => app.api.answer(model.sid, aid, body),
    queue: (op, id, pos) => queueOp(model, op, id, pos),
    turn: (op, n, turnId) => turnOp(model, op, n, turnId),
    diff: (vid) => app.api.diff(model.sid, vid),
    attachment: (aid) => app.api.attachment(model.sid, aid),
  });
  checkNote(model);
  if (changed.has("plan")) app.inspector.drawPlan(model.plan);
  if (changed.has("mcp") || changed.has("head")) app.inspector.drawMcp(model.info.mcp_servers, model.info.busy);
  if (changed.has("programs")) app.inspector.drawPrograms(model.programs);
  app.inspector.refresh(changed);
  if (changed.has("review")) app.review?.refresh();
  if (changed.has("sessions")) loadSessions();
  if (changed.has("need-session")) refreshSession();
  model.changed = new Set();
  newApprovals(model, (added || []).filter((id) => !model.openedWith?.has(id)));
  drawAttention();
}

function refreshSession() {
  clearTimeout(app.sessionTimer);
  const model = app.model;
  app.sessionTimer = setTimeout(async () => {
    try { const s = await app.api.session(model.sid); if (app.model === model) { model.applySession(s); flush(); } } catch { /* the stream goes on */ }
  }, 100);
}

// ---------------------------------------------------------------- composer
/** A note under the composer describes a state; it goes when that state does. ``about`` names
 * the waiting message it reports on (cleared when its fate changes); any note also goes when
 * another turn starts, and a "busy" refusal when the session is idle again. */
function note(text, error = false, about = {}) {
  const el = $("#composer-note");
  el.textContent = text;
  el.className = "note" + (error ? " error" : "");
  const m = app.model;
  app.noteCtx = text && m ? { turn: m.info.turn_id || null, id: about.id, fate: about.id ? m.outbox.get(about.id)?.fate : undefined,
    untilIdle: !!about.untilIdle, reorders: m.reorders || 0, position: !!about.position } : null;
}

function checkNote(model) {
  const c = app.noteCtx;
  if (!c || model !== app.model) return;
  const turn = model.info.turn_id || null;
  const gone = (c.id && model.outbox.get(c.id)?.fate !== c.fate)
    || (turn && turn !== c.turn)
    || (c.untilIdle && !model.info.busy)
    || (c.position && (model.reorders || 0) !== c.reorders); // a position said before a reorder is stale
  if (gone) note("");
}

async function queueOp(model, op, id, pos) {
  try {
    if (op === "remove") await app.api.queueRemove(model.sid, id);
    else {
      const ids = [...model.outbox.values()].filter((o) => o.fate === "queued" && o.kind === "queue").map((o) => o.id);
      const from = ids.indexOf(id);
      if (from < 0 || pos < 0 || pos >= ids.length) return;
      ids.splice(from, 1); ids.splice(pos, 0, id);
      await app.api.queueOrder(model.sid, ids);
    }
  } catch (err) {
    note(err.status === 409 ? `Too late: ${err.detail || "that message has already started"}.` : `Queue not changed: ${err.detail || err.message}`, true);
  }
}

/** Fork at, or rewind to, the end of turn ``n`` (docs/api.md, Fork and rewind). */
async function turnOp(model, op, n, turnId) {
  if (op === "review") { app.review.open(turnId); return; }
  try {
    if (op === "fork") {
      const s = await app.api.fork(model.sid, n);
      note(`Forked at turn ${n} into “${s.title || s.id}” (${s.workspace}).`);
      location.hash = `#/s/${s.id}`;
      loadSessions();
      return;
    }
    rewindDialog(model, n);
  } catch (err) {
    note(err.code === "busy" ? `Not now: ${err.detail || "a turn is running"}.` : `${op === "fork" ? "Fork" : "Rewind"} refused: ${err.detail || err.message}`, true, { untilIdle: err.code === "busy" });
  }
}

/** Rewind asks with a dialog: three buttons, each saying what it does, over a preview of the
 *  files that change and the turns that leave the model's view. */
function rewindDialog(model, n) {
  const d = $("#rewind");
  const p = model.rewindPreview(n);
  $("#rewind-title").textContent = `Rewind to the end of turn ${n}`;
  clear($("#rewind-files"), p.files.length ? p.files.map((f) => h("li", { dataset: { path: f.path } }, h("span", { class: "mono" }, f.path), " — ",
    f.created ? "deleted (created after this turn)" : `put back as it was at the end of turn ${n}`))
    : h("li", { class: "muted" }, `No file this session wrote changed after turn ${n}.`));
  clear($("#rewind-turns"), p.turns.length ? p.turns.map((t) => h("li", { dataset: { turn: t.n } }, `Turn ${t.n}`, t.text ? `: “${t.text.split("\n")[0].slice(0, 120)}”` : ""))
    : h("li", { class: "muted" }, "No later turn: the model's view stays as it is."));
  $("#rewind-error").textContent = "";
  d.dataset.turn = String(n);
  const opener = document.activeElement;
  d.returnTo = opener?.isConnected && opener !== document.body ? opener : $("#draft");
  d.onclose = () => { d.returnTo?.focus?.(); d.returnTo = null; };
  d.showModal();
  $("#rewind-cancel").focus();
}
for (const b of document.querySelectorAll("#rewind [data-scope]")) {
  b.addEventListener("click", async () => {
    const model = app.model, d = $("#rewind");
    const n = Number(d.dataset.turn), scope = b.dataset.scope;
    if (!model) return;
    for (const x of document.querySelectorAll("#rewind button")) x.disabled = true;
    try {
      const out = await app.api.rewind(model.sid, n, scope);
      const files = out.restored_files.length ? `; files put back: ${out.restored_files.join(", ")}` : "";
      d.returnTo = $("#draft"); // done: the next action is a message
      d.close();
      note(`Rewound (${out.scope}) to the end of turn ${n}${files}.`);
    } catch (err) {
      $("#rewind-error").textContent = err.code === "busy" ? `Not now: ${err.detail || "a turn is running"}.` : `Rewind refused: ${err.detail || err.message}`;
    } finally {
      for (const x of document.querySelectorAll("#rewind button")) x.disabled = false;
    }
  });
}
$("#rewind-cancel").addEventListener("click", () => $("#rewind").close());

const REFUSALS = {
  busy: HINT_BUSY,
  run_active: HINT_RUN,
  no_turn: "No turn is running, so there is nothing to Lead: Send it instead. Your text is still in the box.",
  lead_closed: "This turn is finishing and no longer takes a Lead: Queue it instead. Your text is still in the box.",
  lead_text_only: "A Lead carries text only: Send, Queue or Steer this message with its attachments, or remove them (✕) to Lead. Your text and attachments are still here.",
};

/** The message to send: the box's text, or (attachments alone) a line naming them. */
function draftText() {
  const text = $("#draft").value;
  if (text.trim()) return text;
  if (app.attach.count() && !app.attach.blocker()) return `Attached: ${app.attach.items.map((x) => x.name).join(", ")}`;
  note("Type a message first.", true);
  return null;
}

/** Why the inspector's programs are worth polling now: some run, and the person can see them. */
function programsShown() {
  const m = app.model;
  if (!m || document.hidden || $("#inspector").hidden || !m.runningPrograms().length) return false;
  return !matchMedia("(max-width: 999px)").matches || $("#inspector").classList.contains("open");
}

async function pollPrograms() {
  const model = app.model;
  if (!programsShown() || app.polling) return;
  app.polling = true;
  try {
    const s = await app.api.session(model.sid);
    if (app.model === model) { model.programTails(s.programs); flush(); }
  } catch { /* the next poll tries again; the stream goes on */ } finally { app.polling = false; }
}

async function act(kind) {
  const model = app.model;
  if (!model) return;
  if (kind === "stop") return stop();
  const blocker = app.attach.blocker();
  if (blocker) { note(blocker, true); return; }
  const text = draftText();
  if (text === null) return;
  const ids = app.attach.ids();
  // While a run drives, the server refuses (409 run_active) and the refusal says why.
  if (kind === "send" && model.info.busy && !model.runDriving()) { note(HINT_BUSY, true, { untilIdle: true }); return; }
  const box = $("#draft");
  app.sending = text;
  try {
    if (kind === "lead") {
      const r = await app.api.lead(model.sid, text, undefined, ids);
      model.sent(r.lead_id, "lead", text);
      note(`Lead saved: it joins this turn at its next safe boundary (${r.pending} pending).`, false, { id: r.lead_id });
    } else {
      const mode = kind === "send" ? undefined : kind;
      const r = await app.api.send(model.sid, text, mode, undefined, ids);
      if (r.disposition === "started") { model.localTexts.set(r.message_id, text); note(""); }
      else {
        model.sent(r.message_id, mode === "steer" ? "steer" : "queue", text);
        note(r.disposition === "steered" ? "Steering: the running turn stops and this runs next."
          : `Queued (position ${r.position}): it runs when this turn ends.`, false, { id: r.message_id, position: r.disposition !== "steered" });
      }
    }
    if (box.value === text) box.value = ""; // only now: a refused message stays in the box
    if (ids.length) app.attach.sent(); // and so do its attachments
    app.sending = null;
    flush();
  } catch (err) {
    app.sending = null;
    const lead = kind === "lead" && err.code === "run_active"
      ? "Refused: this run is not supervised (its confirm is not “person”, or it is unattended), so it takes no Lead. Stop (Esc) ends the run. Your text is still in the box." : null;
    const kept = ids.length ? "Your text and attachments are still here." : "Your text is still in the box.";
    const why = err.code === "not_accepting" && ids.length
      ? `Not sent: ${err.detail || err.message}. Choose a model that takes images, or remove the image (✕). ${kept}` : null;
    note(lead || why || REFUSALS[err.code] || `${kind === "lead" ? "Lead not saved" : "Not sent"}: ${err.detail || err.message}. ${kept}`, true,
      err.code === "busy" || err.code === "run_active" ? { untilIdle: true } : {});
  }
}

async function stop() {
  const model = app.model;
  // Read before the call: the run's run.end can reach the stream before Stop's reply does.
  const runDriving = Boolean(model.runDriving());
  const programs = !$("#stop-programs-wrap").hidden && $("#stop-programs").checked;
  try {
    const r = await app.api.stop(model.sid, programs);
    if (programs) $("#stop-programs").checked = false; // asked each time, never left on
    if (!r.turn_id) { note(programs ? "Nothing was running; its programs are stopped." : "Nothing was running."); return; }
    const parts = runDriving ? ["the run ends (run.end stopped)"] : [];
    if (programs) parts.push("its programs stopped too");
    if (r.discarded?.length) parts.push(`${r.discarded.length} queued discarded`);
    if (r.unapplied_leads?.length) parts.push(`${r.unapplied_leads.length} Lead(s) saved but not applied`);
    note(`Stopped.${parts.length ? " " + parts.join("; ") + "." : ""}`);
  } catch (err) {
    note(`Stop failed: ${err.detail || err.message}`, true);
  }
}

for (const [id, kind] of [["#btn-send", "send"], ["#btn-queue", "queue"], ["#btn-steer", "steer"], ["#btn-lead", "lead"], ["#btn-stop", "stop"]]) {
  $(id).addEventListener("click", () => act(kind));
}

// Enter sends; Ctrl+O queue, Ctrl+S steer, Ctrl+L Lead, Esc stop (the terminal chat's keys).
// The keys work wherever the composer has focus (the box or one of its buttons) or nothing does.
const KEYS = { o: "queue", s: "steer", l: "lead" };
/** A touch keyboard has no Shift+Enter to speak of: there Enter is a new line and Send is the button. */
function touchKeyboard() { return navigator.maxTouchPoints > 0 || matchMedia("(pointer: coarse)").matches; }
function drawPlaceholder() {
  $("#draft").placeholder = touchKeyboard() ? "Message (Enter is a new line; send with the Send button)" : "Message (Enter sends, Shift+Enter new line)";
}
$("#draft").addEventListener("focus", drawPlaceholder);
drawPlaceholder();
const typingIn = (el) => el && (el.tagName === "TEXTAREA" || el.tagName === "SELECT" || (el.tagName === "INPUT" && !["checkbox", "radio", "button", "submit"].includes(el.type)) || el.isContentEditable);
document.addEventListener("keydown", (e) => {
  if (document.querySelector("dialog[open]")) return; // a dialog has the keyboard (Esc closes it)
  if (!e.ctrlKey && !e.altKey && !e.metaKey && !typingIn(e.target) && !$("#app").hidden) {
    if (e.key === "?") { e.preventDefault(); showKeys(); return; }
    if (e.key === "/" && !$("#session").hidden) { e.preventDefault(); $("#draft").focus(); return; }
    if ((e.key === "r" || e.key === "R") && !$("#session").hidden && app.model) { e.preventDefault(); app.review.open(null); return; }
  }
  if (e.key === "Escape" && openDrawer()) { e.preventDefault(); closeDrawers(true); return; }
  if ($("#session").hidden || !app.model) return;
  if (e.altKey && !e.ctrlKey && !e.metaKey && e.key.toLowerCase() === "a") {
    const b = $("#approvals .approval button");
    if (b) { e.preventDefault(); b.focus(); }
    return;
  }
  const inDraft = e.target === $("#draft");
  const inComposer = inDraft || !!e.target.closest?.("#composer") || e.target === document.body || e.target === document.documentElement;
  if (inDraft && e.key === "Enter" && !touchKeyboard() && !e.shiftKey && !e.ctrlKey && !e.altKey && !e.metaKey && !e.isComposing) {
    e.preventDefault(); act("send"); return;
  }
  const k = e.key.toLowerCase();
  if (e.ctrlKey && !e.altKey && !e.metaKey && !e.shiftKey && KEYS[k]) {
    e.preventDefault(); // never the browser's Open File / Save Page / address bar while a session is open
    if (inComposer) act(KEYS[k]);
    return;
  }
  if (e.key === "Escape" && inComposer && (app.model.info.busy || app.model.runDriving())) {
    e.preventDefault(); act("stop");
  }
});

// ---------------------------------------------------------------- the shortcut sheet
let keysOpener = null;
function showKeys() {
  keysOpener = document.activeElement;
  $("#keys").showModal();
  $("#keys-close").focus();
}
$("#btn-keys").addEventListener("click", showKeys);
$("#btn-review").addEventListener("click", () => app.review.open(null));
$("#keys").addEventListener("close", () => {
  // The close event comes a task after the dialog closed, and the browser runs key presses first:
  // a key typed meanwhile ("/" to the composer) may have moved focus already; then it stays there.
  if (!focusMovedSince($("#keys"), keysOpener)) (keysOpener && keysOpener !== document.body ? keysOpener : $("#draft")).focus?.();
  keysOpener = null;
});

/** Focus where the next action is: the message box of the open session (after login, after
 *  creating or opening a session), or the new-session form when none is open. */
function focusNext() {
  if (!$("#session").hidden && !$("#draft").disabled) $("#draft").focus();
  else if (!$("#app").hidden && !openDrawer()) $("#new-workspace").focus();
}

// ---------------------------------------------------------------- drawers (narrow screens)
function openDrawer() { return ["sidebar", "inspector"].find((id) => $(`#${id}`).classList.contains("open")) || null; }
function closeDrawers(restoreFocus = false) {
  const was = openDrawer();
  for (const id of ["sidebar", "inspector"]) $(`#${id}`).classList.remove("open");
  $("#scrim").hidden = true;
  $("#toggle-sidebar").setAttribute("aria-expanded", "false");
  $("#toggle-inspector").setAttribute("aria-expanded", "false");
  if (restoreFocus && was) $(`#toggle-${was}`).focus();
}
function toggleDrawer(id) {
  const open = !$(`#${id}`).classList.contains("open");
  closeDrawers();
  if (!open) return;
  $(`#${id}`).classList.add("open");
  $("#scrim").hidden = false;
  $(`#toggle-${id}`).setAttribute("aria-expanded", "true");
  $(`#${id}`).querySelector("input, select, button, [tabindex]")?.focus();
}
$("#toggle-sidebar").addEventListener("click", () => toggleDrawer("sidebar"));
$("#toggle-inspector").addEventListener("click", () => toggleDrawer("inspector"));
$("#scrim").addEventListener("click", () => closeDrawers(true));
for (const b of document.querySelectorAll(".drawer-close")) b.addEventListener("click", () => closeDrawers(true));
$("#sessions").addEventListener("click", (e) => { if (e.target.closest("a")) closeDrawers(); });
$("#draft").addEventListener("input", () => { if (app.noteCtx && $("#composer-note").classList.contains("error") && !app.noteCtx.untilIdle) note(""); });
setInterval(tickElapsed, 1000);

$("#outbox-clear").addEventListener("click", () => { app.model?.clearSettled(); flush(); });

// ---------------------------------------------------------------- title, model, don't ask
function startRename() {
  $("#rename-form").hidden = false;
  $("#title").hidden = true;
  const input = $("#rename-input");
  input.value = app.model?.info.title || "";
  input.focus(); input.select();
}
function endRename() {
  const wasOpen = !$("#rename-form").hidden;
  $("#rename-form").hidden = true; $("#title").hidden = false;
  if (wasOpen && document.activeElement === document.body) $("#rename").focus();
}
let renaming = false;
async function saveRename() {
  if (renaming || $("#rename-form").hidden) return;
  const title = $("#rename-input").value.trim();
  if (!title || title === (app.model?.info.title || "")) { endRename(); return; }
  renaming = true;
  try { await patch({ title }); endRename(); } catch { /* patch showed it; the form stays open */ } finally { renaming = false; }
}
$("#title").addEventListener("click", startRename);
$("#rename").addEventListener("click", startRename);
// Enter or leaving the box saves; Esc cancels (and is not a Stop).
$("#rename-input").addEventListener("keydown", (e) => {
  if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); $("#rename-input").value = app.model?.info.title || ""; endRename(); }
});
$("#rename-input").addEventListener("blur", () => { saveRename(); });
$("#rename-form").addEventListener("submit", (e) => { e.preventDefault(); saveRename(); });
$("#model").addEventListener("change", () => patch({ model: $("#model").value }).catch(() => {}));
$("#dont-ask").addEventListener("change", () => patch({ dont_ask: $("#dont-ask").checked }).catch(() => {}));

async function patch(body) {
  const model = app.model;
  try {
    const s = await app.api.patch(model.sid, body);
    model.applySession(s);
    flush();
    loadSessions();
  } catch (err) {
    note(err.detail || err.message, true);
    model.mark("head"); flush(); // show the state as it is, not as it was asked for
    throw err;
  }
}

// ---------------------------------------------------------------- start
async function start(token) {
  app.api = new Api(token, () => forget("The token was refused."));
  app.view = new View(document);
  app.inspector = app.inspector || new Inspector(app.api, () => app.model?.sid, (m) => note(m, true));
  app.inspector.api = app.api;
  app.review = app.review || new Review(app.api, () => app.model, () => {});
  app.review.api = app.api;
  app.attach = app.attach || new Attachments(app.api, () => app.model?.sid, (m, error) => note(m, error));
  app.attach.api = app.api;
  $("#login").hidden = true;
  $("#app").hidden = false;
  await loadModels();
  await Promise.all([loadSessions(), loadWorkspaces()]);
  clearInterval(app.listTimer);
  app.listTimer = setInterval(() => { if (!$("#app").hidden) loadSessions(); }, SESSIONS_EVERY_MS);
  clearInterval(app.programsTimer);
  app.programsTimer = setInterval(pollPrograms, PROGRAMS_EVERY_MS);
  app.model = null;
  drawNotify();
  route();
  drawAttention();
  if ($("#session").hidden || !/^#\/s\//.test(location.hash)) focusNext(); // else openSession focuses the box once it is open
}

const saved = localStorage.getItem(TOKEN_KEY);
if (saved) start(saved); else showLogin();
