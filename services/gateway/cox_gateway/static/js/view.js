// Drawing the session model: each transcript item is one element, redrawn only when it changed.

import { attachedView, forgetBlobs } from "./attach.js";
import { changeView, contentView } from "./diff.js";
import { $, clear, h, short } from "./dom.js";
import { writeVerb } from "./state.js";
import { markdown } from "./md.js";

const VIA = { send: "", queue: "queued", steer: "steered", lead: "Lead", approval: "with an approval", run: "sent by the run" };

/** A run's state in a few words, for its badge here and in the session list (docs/api.md, Runs). */
export function runLabel(run) {
  if (!run) return "";
  const turns = `${run.turns ?? 0} turn${run.turns === 1 ? "" : "s"}`;
  if (run.state === "running") {
    return `run · running · confirm ${run.confirm}${run.unattended ? " · unattended" : ""} · turn ${run.turns ?? 0} of ${run.max_turns}`;
  }
  return `run · ended ${run.outcome || ""} · ${turns} · confirm ${run.confirm}${run.unattended ? " · unattended" : ""}`;
}

/** The line above the composer while a run drives: who drives, what Stop does, what comes after. */
export function runBanner(run) {
  const supervised = run.confirm === "person" && !run.unattended;
  return `A run drives this session (confirm ${run.confirm}${run.unattended ? ", unattended" : ""}, turn ${run.turns ?? 0} of ${run.max_turns}): ` +
    `messages are refused until it ends${supervised ? " (a Lead joins its turn)" : ""}. Stop (Esc) ends the run; after that a message goes on with the task as a chat.`;
}
// A person's Deny, a refusal by policy (guard, the judge, a setting) and a failure of a call
// that ran are three different things, and look different.
const STATUS = {
  proposed: "proposed", running: "running", waiting: "waiting for you", ok: "done", fail: "failed",
  denied: "denied by you", refused: "refused", skipped: "skipped", closed: "closed",
};
const LONG_OUTPUT_LINES = 12;
const LONG_OUTPUT_CHARS = 1500;
const KIND = { queue: "Queue", steer: "Steer", lead: "Lead" };

export function argsText(name, args) {
  if (args === null || args === undefined) return "";
  if (typeof args !== "object") return String(args);
  if (name === "run_command" && args.command) return args.command;
  if (name === "edit_file" && args.path) return `${args.path}${args.count ? ` (${args.count} occurrences)` : ""}`;
  if ((name === "write_file" || name === "read_file" || name === "list_dir") && args.path) {
    return args.content !== undefined ? `${args.path} (${String(args.content).length} chars)` : args.path;
  }
  return JSON.stringify(args);
}

/** A tool's output: short output shown as is; long output folded, its size in the summary. */
function output(it) {
  const text = String(it.output);
  const lines = text.replace(/\n$/, "").split("\n").length;
  const long = lines > LONG_OUTPUT_LINES || text.length > LONG_OUTPUT_CHARS;
  if (!long) return h("pre", { class: "output" }, text);
  return h("details", { class: "output", open: it.open },
    h("summary", {}, `output: ${lines} lines, ${text.length} chars`, h("span", { class: "fold-hint", "aria-hidden": "true" })), h("pre", {}, text));
}

function renderItem(it) {
  const el = renderOne(it);
  // Taken out of the model's view by a rewind: still shown, dimmed and marked.
  if (it.rewound && el) {
    el.classList.add("rewound-out");
    el.dataset.rewound = String(it.rewound);
    el.title = `Rewound: the model no longer sees this (rewind to turn ${it.rewound})`;
    if (it.cls?.includes("turn-start")) el.append(h("span", { class: "rewound-mark" }, ` — rewound: not in the model's view`));
  }
  return el;
}

function renderOne(it) {
  const attrs = { class: `item ${it.kind}`, dataset: { key: it.key } };
  switch (it.kind) {
    case "user":
      // The text stays the element's last child (what the tests and a copy read as the message).
      return h("div", attrs, it.via && VIA[it.via] ? h("span", { class: "via" }, VIA[it.via]) : null,
        attachedView(drawing.sid, it.attachments, drawing.attachment), it.text);
    case "assistant":
      return withCopy(h("div", { ...attrs, class: `item assistant md${it.streaming ? " streaming" : ""}` }, markdown(it.text)), it.streaming);
    case "agent":
      return withCopy(h("div", { ...attrs, class: "item agent md" }, markdown(it.text)));
    case "fate":
      return h("div", attrs, it.text);
    case "note":
      if (it.turnNo) return turnEnd(it, attrs);
      return h("div", { ...attrs, class: `item note ${it.cls || ""}` }, it.text);
    case "tool": {
      if (it.name === "plan_step" || it.name === "plan_write") return planLine(it, attrs);
      const status = STATUS[it.status] || it.status;
      const el = h("div", { ...attrs, dataset: { key: it.key, status: it.status } },
        h("div", { class: "head" },
          h("span", { class: "name" }, it.name || "tool"),
          h("span", { class: "args" }, short(argsText(it.name, it.args), 240)),
          h("span", { class: `status ${it.status}` }, status + (it.detail ? ` (${it.detail})` : ""))),
        // A person's Deny is said once, by the status: not again as a decision, an answer and an output.
        (it.policy || []).filter((p) => !(it.status === "denied" && /^refuse by person\b/.test(p))).map((p) => h("div", { class: "policy" }, p)),
        it.status === "denied" ? (it.message ? h("div", { class: "policy answer" }, `Your message: “${it.message}”`) : null)
          : it.answer ? h("div", { class: "policy answer" }, it.answer) : null,
        it.files?.length ? h("div", { class: "files" }, it.files.map((w) => fileChange(it, w))) : null,
        it.output && it.status !== "denied" ? output(it) : null);
      el.querySelector("details.output")?.addEventListener("toggle", (e) => { it.open = e.target.open; });
      return el;
    }
    default:
      return h("div", attrs, JSON.stringify(it));
  }
}

// How a card reaches the API for a lazily loaded diff (set by View.draw from its handlers).
let loadDiff = null;
// The session being drawn and how its attachments' bytes are fetched (View.draw sets them).
const drawing = { sid: null, attachment: null };

/** One file a call changed: created, changed or deleted, +/-, and its diff folded under it —
 *  the preview guard computed for a write (exactly what it did), or, for a command, the diff from
 *  the version kept before it to the file now. */
function fileChange(it, w) {
  it.openFiles = it.openFiles || new Set();
  const body = h("div", { class: "file-diff" });
  const det = h("details", { class: "file-change", open: it.openFiles.has(w.path), dataset: { path: w.path, kind: writeVerb(w).toLowerCase() } },
    h("summary", {}, h("span", { class: "verb" }, writeVerb(w)), " ", h("span", { class: "mono" }, w.path), " ",
      w.deleted ? null : h("span", { class: "counts" }, h("span", { class: "add" }, `+${w.added}`), " ", h("span", { class: "del" }, `−${w.removed}`))),
    body);
  const fill = () => {
    if (body.dataset.filled) return;
    body.dataset.filled = "1";
    const preview = it.files.length === 1 && it.preview && (it.name === "write_file" || it.name === "edit_file") ? it.preview : null;
    if (preview) { body.append(changeView(preview, `change to ${w.path}`)); return; }
    if (w.deleted && !w.version_id) { body.append(h("div", { class: "flag" }, `Deleted ${w.path}.`)); return; }
    if (!w.version_id || !loadDiff) { body.append(changeView(null)); return; }
    body.append(h("div", { class: "diff-label" }, "From before this call to the file as it is now:"), h("div", { class: "flag muted" }, "Loading the diff…"));
    loadDiff(w.version_id).then((d) => {
      body.lastChild.replaceWith(d.deleted ? h("div", { class: "flag" }, `Deleted: ${w.path} no longer exists.`) : changeView(d, `change to ${w.path}`));
    }, (err) => { body.lastChild.replaceWith(h("p", { class: "error" }, err.detail || err.message)); });
  };
  if (det.open) fill();
  det.addEventListener("toggle", () => { if (det.open) { it.openFiles.add(w.path); fill(); } else it.openFiles.delete(w.path); });
  return det;
}

/** plan_write and plan_step are bookkeeping: one line each, the plan itself is in the inspector. */
function planLine(it, attrs) {
  const args = it.args && typeof it.args === "object" ? it.args : {};
  const steps = Array.isArray(args.steps) ? args.steps : [];
  const text = it.name === "plan_write"
    ? `Plan: ${steps.length} step${steps.length === 1 ? "" : "s"}${steps.length ? ` — ${steps.join("; ")}` : ""}`
    : `Plan step ${args.step ?? "?"} done${it.stepText ? `: ${it.stepText}` : ""}`;
  const bad = ["fail", "denied", "refused", "skipped"].includes(it.status);
  return h("div", { ...attrs, class: `item note plan-line${bad ? " bad" : ""}`, dataset: { key: it.key, status: it.status } },
    it.name === "plan_step" && !bad ? "✓ " : "", short(text, 300), bad ? ` (${STATUS[it.status] || it.status})` : "");
}

/** A Copy button on each code block of an answer (not while it still streams). */
function withCopy(el, streaming = false) {
  if (streaming) return el;
  for (const pre of el.querySelectorAll("pre.code")) {
    const code = pre.querySelector("code")?.textContent ?? "";
    const b = h("button", { type: "button", class: "copy", "aria-label": "Copy this code" }, "Copy");
    b.addEventListener("click", async () => {
      try { await navigator.clipboard.writeText(code); }
      catch {
        const ta = h("textarea", { class: "sr-only", "aria-hidden": "true" }); ta.value = code;
        document.body.append(ta); ta.select(); document.execCommand("copy"); ta.remove();
      }
      b.textContent = "Copied"; setTimeout(() => { b.textContent = "Copy"; }, 1500);
    });
    pre.prepend(b);
  }
  return el;
}

/** A turn's end, with its Fork and Rewind actions (the View hands a click to ``handlers.turn``). */
function turnEnd(it, attrs) {
  const n = it.turnNo;
  return h("div", { ...attrs, class: `item note ${it.cls || ""}` }, it.text,
    h("span", { class: "turn-acts" },
      h("button", { type: "button", class: "link small", "data-turn-act": "fork", "data-turn": String(n),
        title: `A new session from the end of turn ${n}: its conversation, and a copy of the files as they were then` }, `Fork at turn ${n}`),
      h("button", { type: "button", class: "link small", "data-turn-act": "rewind", "data-turn": String(n),
        title: `Go back to the end of turn ${n}: the conversation, the files, or both (between turns)` }, "Rewind here"),
      it.turnId ? h("button", { type: "button", class: "link small", "data-turn-act": "review", "data-turn": String(n), "data-turn-id": it.turnId,
        title: `What turn ${n} changed, file by file` }, `Review turn ${n}`) : null));
}

export class View {
  constructor(root) {
    this.root = root;
    this.transcript = $("#transcript", root);
    this.elements = new Map();
    this.handlers = null;
    this.transcript.addEventListener("click", (e) => {
      const b = e.target.closest?.("[data-turn-act]");
      if (b && this.handlers?.turn) this.handlers.turn(b.dataset.turnAct, Number(b.dataset.turn), b.dataset.turnId);
    });
  }

  reset() { clear(this.transcript); this.elements.clear(); forgetBlobs(); }

  /** Redraw what the model marked changed; keep the view pinned to the bottom if it was. */
  draw(model, handlers) {
    this.handlers = handlers;
    loadDiff = handlers.diff || null;
    drawing.sid = model.sid; drawing.attachment = handlers.attachment || null;
    const atBottom = this.transcript.scrollHeight - this.transcript.scrollTop - this.transcript.clientHeight < 40;
    for (const c of model.changed) {
      if (!c.startsWith("item:")) continue;
      const it = model.byKey.get(c.slice(5));
      if (!it) continue;
      const el = renderItem(it);
      const old = this.elements.get(it.key);
      if (old) old.replaceWith(el); else this.transcript.append(el);
      this.elements.set(it.key, el);
    }
    if (model.changed.has("head")) this.head(model);
    const added = model.changed.has("approvals") ? this.approvals(model, handlers) : [];
    if (model.changed.has("outbox")) this.outbox(model, handlers);
    this.transcript.dataset.lastSeq = String(model.lastSeq);
    if (atBottom) this.transcript.scrollTop = this.transcript.scrollHeight;
    return added;
  }

  head(model) {
    const i = model.info;
    $("#title").textContent = i.title || "untitled";
    $("#title-source").textContent = i.title_source === "manual" ? "renamed" : i.title_source === "auto" ? "auto title" : "";
    const state = $("#state");
    state.textContent = i.busy ? "working" : "idle";
    state.className = "badge" + (i.busy ? " busy" : "");
    $("#dont-ask").checked = !!i.dont_ask;
    const sel = $("#model");
    if (i.model && ![...sel.options].some((o) => o.value === i.model)) sel.append(h("option", { value: i.model }, i.model));
    sel.value = i.next_model || i.model || "";
    $("#next-model").textContent = i.next_model && i.next_model !== i.model ? `next turn: ${i.next_model}` : "";
    $("#workspace").textContent = i.workspace || "";
    this.turnStatus(model);
    const busy = !!i.busy;
    // A run: its badge (state, confirm mode, turns); while it drives, the banner over the composer.
    const run = i.run || null, driving = model.runDriving();
    const badge = $("#run");
    badge.hidden = !run;
    badge.textContent = runLabel(run);
    badge.dataset.state = run ? run.state : "";
    badge.className = "badge run" + (driving ? " busy" : "");
    const banner = $("#run-banner");
    banner.hidden = !driving;
    banner.textContent = driving ? runBanner(driving) : "";
    // While a run drives, Send goes to the server, which refuses it (409 run_active) and says why.
    $("#btn-send").classList.toggle("primary", !busy);
    $("#btn-send").disabled = busy && !driving;
    $("#btn-send").title = driving ? "A run drives this session: messages are refused until it ends"
      : busy ? "A turn is running: choose Queue or Steer, or Lead" : "Enter";
    $("#btn-queue").classList.toggle("primary", busy && !driving);
    $("#btn-steer").classList.toggle("primary", busy && !driving);
    $("#btn-lead").disabled = !busy || (driving && (driving.confirm !== "person" || driving.unattended));
    $("#btn-stop").disabled = !busy && !driving;
    // While programs run, Stop offers to stop them too (else they run on after the turn).
    const progs = model.runningPrograms().length;
    $("#stop-programs-wrap").hidden = !progs || (!busy && !driving);
    if (!progs) $("#stop-programs").checked = false;
    $("#stop-programs-wrap").lastChild.textContent = ` Stop programs too (${progs} running)`;
  }

  /** Elapsed time, tool calls, tokens and cost of the turn and the session; what the turn waits for. */
  turnStatus(model) {
    const t = model.turn, tot = model.totals;
    const box = $("#turn-status");
    const tokens = (n) => (n >= 10000 ? `${Math.round(n / 1000)}k` : String(n));
    const cost = (c) => (c ? ` · $${c.toFixed(c < 0.01 ? 4 : 2)}` : "");
    const waiting = model.waitingFor();
    const busy = !!model.info.busy && t;
    box.dataset.waiting = waiting || "";
    box.dataset.started = t && busy ? String(t.started) : "";
    box.dataset.ended = t && !busy && t.ended ? String(t.ended - t.started) : "";
    const parts = [];
    if (t) {
      parts.push(h("span", { class: "elapsed", dataset: {} }, ""));
      parts.push(h("span", { class: "turn-tools" }, `${t.tools} tool call${t.tools === 1 ? "" : "s"}`));
      parts.push(h("span", { class: "turn-tokens" }, `${tokens(t.input + t.output)} tokens${cost(t.cost)}`));
      // The usage of the turn's other model requests (the judge, the title, a compaction), folded in.
      const extra = Object.entries(t.extra || {});
      if (extra.length) parts.push(h("span", { class: "turn-extra muted" }, `incl. ${extra.map(([k, n]) => `${k} ${tokens(n)}`).join(", ")}`));
      if (t.retry && busy) {
        parts.push(h("span", { class: "turn-retry bad", title: t.retry.error },
          `model request failed, retry ${t.retry.attempt} in ${t.retry.delay_s}s: ${short(t.retry.error, 80)}`));
      }
    }
    parts.push(h("span", { class: "session-totals muted" },
      `session: ${tot.turns} turn${tot.turns === 1 ? "" : "s"}, ${tot.tools} tool calls, ${tokens(tot.input + tot.output)} tokens${cost(tot.cost)}`));
    if (waiting) parts.unshift(h("span", { class: `waiting waiting-${waiting.split(/[ ,]/)[0]}` }, `waiting for: ${waiting}`));
    clear(box, parts);
    tickElapsed();
  }

  approvals(model, handlers) {
    const box = $("#approvals");
    // Keep a card whose message box the person is typing in: redraw only what came or went.
    const want = new Map([...model.approvals.values()].map((a) => [a.approval_id, a]));
    for (const card of [...box.children]) if (!want.has(card.dataset.approval)) card.remove();
    const added = [];
    for (const a of want.values()) {
      if (box.querySelector(`[data-approval="${CSS.escape(a.approval_id)}"]`)) continue;
      box.append(approvalCard(a, handlers));
      added.push(a.approval_id);
    }
    return added;
  }

  outbox(model, handlers) {
    // What still waits is listed; what settled is already told by the transcript (the message,
    // or a line naming what was discarded), so it folds into one line instead of growing.
    const items = model.waiting();
    const waiting = items.filter((o) => !FINAL_FATES.has(o.fate));
    const settled = items.filter((o) => FINAL_FATES.has(o.fate));
    $("#outbox").hidden = items.length === 0;
    const queued = items.filter((o) => o.fate === "queued" && o.kind === "queue");
    const focused = document.activeElement?.closest?.("#outbox li")?.dataset.id;
    const focusAct = document.activeElement?.dataset?.act;
    const li = (o) => {
      const label = o.text ? short(o.text.split("\n")[0], 80) : o.id;
      const n = queued.indexOf(o);
      // Before it starts, a queued message can be moved or removed (recorded as events).
      const tools = n >= 0 && handlers?.queue ? h("span", { class: "q-tools" },
        h("button", { type: "button", class: "icon", "data-act": "up", disabled: n === 0, "aria-label": `Move “${label}” up`, title: "Move up",
          onclick: () => handlers.queue("move", o.id, n - 1) }, "↑"),
        h("button", { type: "button", class: "icon", "data-act": "down", disabled: n === queued.length - 1, "aria-label": `Move “${label}” down`, title: "Move down",
          onclick: () => handlers.queue("move", o.id, n + 1) }, "↓"),
        h("button", { type: "button", class: "icon danger", "data-act": "remove", "aria-label": `Remove “${label}” from the queue`, title: "Remove from the queue",
          onclick: () => handlers.queue("remove", o.id) }, "✕")) : null;
      return h("li", { dataset: { id: o.id, fate: o.fate, kind: o.kind } },
        h("span", { class: `fate-badge fate-${o.fate}` }, o.fate),
        h("span", { class: "kind-badge" }, KIND[o.kind] || o.kind),
        o.text ? h("span", { class: "text", title: o.text }, short(o.text.split("\n")[0], 200))
          : h("span", { class: "muted" }, "(text not recorded)"),
        tools);
    };
    const wasOpen = $("#outbox-settled")?.open;
    clear($("#outbox-list"), waiting.map(li));
    $("#outbox-list").hidden = waiting.length === 0;
    const fold = $("#outbox-fold");
    clear(fold, settled.length ? h("details", { id: "outbox-settled", open: wasOpen },
      h("summary", {}, `${settled.length} settled — each is in the transcript`), h("ol", {}, settled.map(li))) : null);
    $("#outbox-title").textContent = waiting.length ? `Waiting (${waiting.length})` : "Nothing waiting";
    if (focused && focusAct) {
      const btn = $(`#outbox li[data-id="${CSS.escape(focused)}"] [data-act="${focusAct}"]`);
      if (btn && !btn.disabled) btn.focus();
    }
  }
}

const FINAL_FATES = new Set(["applied", "discarded", "unapplied", "skipped", "removed"]);

/** What an approval lets happen, shown before its buttons: the command, or the write's diff. */
function approvalSubject(a) {
  const args = a.args && typeof a.args === "object" ? a.args : {};
  if (a.name === "run_command" && args.command) {
    return h("div", { class: "allows" }, h("div", { class: "allows-label" }, "Allowing runs this command:"),
      h("pre", { class: "call" }, String(args.command)));
  }
  if (a.name === "write_file" || a.name === "edit_file") {
    const label = `change to ${args.path || "the file"}`;
    const body = a.preview ? changeView(a.preview, label)
      : args.content !== undefined ? contentView(args.content, label) : changeView(null, label);
    return h("div", { class: "allows" },
      h("div", { class: "allows-label" }, `Allowing writes ${args.path || "a file"}`,
        a.preview ? ` (+${a.preview.added ?? 0} −${a.preview.removed ?? 0})` : "", ":"), body);
  }
  return h("div", { class: "allows" }, h("div", { class: "allows-label" }, "Allowing runs:"),
    h("pre", { class: "call" }, argsText(a.name, a.args) || JSON.stringify(a.args)));
}

function approvalCard(a, handlers) {
  const security = !!a.security;
  const id = `appr-${a.approval_id}`;
  const msg = h("input", {
    id: `${id}-msg`, placeholder: "Message (optional): with Deny it redirects, with Allow it adds",
    "aria-label": "Message sent with your answer (optional). Enter does not answer: choose Allow or Deny.",
  });
  const status = h("span", { class: "error", role: "alert" });
  const answer = async (decision, scope, btns) => {
    const here = document.activeElement?.closest?.(".approval") || document.activeElement === document.body;
    btns.forEach((b) => (b.disabled = true));
    status.textContent = "";
    try {
      await handlers.answer(a.approval_id, { decision, scope, ...(msg.value.trim() ? { message: msg.value.trim() } : {}) });
      status.textContent = "";
      // Answered: focus goes where the next action is, the next approval or the composer.
      if (here) {
        const next = [...document.querySelectorAll("#approvals .approval")].find((c) => c.dataset.approval !== a.approval_id);
        (next?.querySelector("button") || document.getElementById("draft"))?.focus();
      }
    } catch (err) {
      status.textContent = err.detail || err.message;
      btns.forEach((b) => (b.disabled = false));
    }
  };
  const allow = h("button", { type: "button", class: "primary", "data-act": "allow" }, security ? "Allow this change" : "Allow");
  const deny = h("button", { type: "button", class: "danger", "data-act": "deny" }, "Deny");
  const always = security ? null : h("button", { type: "button", "data-act": "always", title: "Allow, and do not ask again this session for this command" }, "Always this session");
  const btns = [allow, deny, always].filter(Boolean);
  allow.onclick = () => answer("allow", "once", btns);
  deny.onclick = () => answer("deny", "once", btns);
  if (always) always.onclick = () => answer("allow", "session", btns);
  // A key press in the text box never answers: what the text says ("No, don't …") is not a
  // decision. Enter only says so; Allow and Deny are buttons the person chooses.
  msg.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      status.textContent = "Enter does not answer an approval: choose Allow or Deny (your message goes with it).";
    }
  });
  const j = a.judge;
  return h("div", { class: `approval${security ? " security" : ""}`, dataset: { approval: a.approval_id },
    role: "group", "aria-label": security ? "Security confirm" : "Approval needed" },
    h("div", { class: "kind" }, security ? "Security confirm" : "Approval needed",
      h("span", { class: "muted" }, ` — ${a.name || "tool"}`)),
    approvalSubject(a),
    a.reason ? h("div", { class: "reason" }, "Why: ", a.reason) : null,
    j ? h("div", { class: "judge" }, `Judge (${j.kind || "judge"}) said ${j.verdict || "?"}` +
      (j.score !== undefined && j.score !== null ? ` (score ${j.score})` : "") + (j.reason ? `: ${j.reason}` : "")) : null,
    security ? h("div", { class: "muted" }, "A security confirm is always asked; no standing approval waives it.") : null,
    h("div", { class: "row" }, msg, ...btns),
    status);
}

/** The elapsed time of the running (or last) turn, ticking once a second without a redraw. */
export function tickElapsed() {
  const box = document.getElementById("turn-status");
  const el = box?.querySelector(".elapsed");
  if (!el) return;
  const fmt = (ms) => { const s = Math.max(0, Math.round(ms / 1000)); return s >= 60 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${s}s`; };
  if (box.dataset.started) el.textContent = `turn running ${fmt(Date.now() - Number(box.dataset.started))}`;
  else if (box.dataset.ended) el.textContent = `last turn took ${fmt(Number(box.dataset.ended))}`;
  else el.textContent = "";
}
