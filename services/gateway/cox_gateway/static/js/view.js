// Drawing the session model: each transcript item is one element, redrawn only when it changed.

import { $, clear, h, short } from "./dom.js";

const VIA = { send: "", queue: "queued", steer: "steered", lead: "Lead", approval: "with an approval" };
const STATUS = {
  proposed: "proposed", running: "running", waiting: "waiting for you", ok: "done", fail: "failed",
  denied: "denied", refused: "refused", skipped: "skipped", closed: "closed",
};
const KIND = { queue: "Queue", steer: "Steer", lead: "Lead" };

export function argsText(name, args) {
  if (args === null || args === undefined) return "";
  if (typeof args !== "object") return String(args);
  if (name === "run_command" && args.command) return args.command;
  if ((name === "write_file" || name === "read_file" || name === "list_dir") && args.path) {
    return args.content !== undefined ? `${args.path} (${String(args.content).length} chars)` : args.path;
  }
  return JSON.stringify(args);
}

function renderItem(it) {
  const attrs = { class: `item ${it.kind}`, dataset: { key: it.key } };
  switch (it.kind) {
    case "user":
      return h("div", attrs, it.via && VIA[it.via] ? h("span", { class: "via" }, VIA[it.via]) : null, it.text);
    case "assistant":
      return h("div", { ...attrs, class: `item assistant${it.streaming ? " streaming" : ""}` }, it.text);
    case "agent":
      return h("div", attrs, it.text);
    case "fate":
      return h("div", attrs, it.text);
    case "note":
      return h("div", { ...attrs, class: `item note ${it.cls || ""}` }, it.text);
    case "tool": {
      const status = STATUS[it.status] || it.status;
      const el = h("div", { ...attrs, dataset: { key: it.key, status: it.status } },
        h("div", { class: "head" },
          h("span", { class: "name" }, it.name || "tool"),
          h("span", { class: "args" }, short(argsText(it.name, it.args), 240)),
          h("span", { class: `status ${it.status}` }, status + (it.detail ? ` (${it.detail})` : ""))),
        (it.policy || []).map((p) => h("div", { class: "policy" }, p)),
        it.answer ? h("div", { class: "policy answer" }, it.answer) : null,
        it.output ? h("details", { open: it.open }, h("summary", {}, "output"), h("pre", {}, it.output)) : null);
      el.querySelector("details")?.addEventListener("toggle", (e) => { it.open = e.target.open; });
      return el;
    }
    default:
      return h("div", attrs, JSON.stringify(it));
  }
}

export class View {
  constructor(root) {
    this.root = root;
    this.transcript = $("#transcript", root);
    this.elements = new Map();
  }

  reset() { clear(this.transcript); this.elements.clear(); }

  /** Redraw what the model marked changed; keep the view pinned to the bottom if it was. */
  draw(model, handlers) {
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
    if (model.changed.has("approvals")) this.approvals(model, handlers);
    if (model.changed.has("outbox")) this.outbox(model);
    this.transcript.dataset.lastSeq = String(model.lastSeq);
    if (atBottom) this.transcript.scrollTop = this.transcript.scrollHeight;
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
    const busy = !!i.busy;
    $("#btn-send").classList.toggle("primary", !busy);
    $("#btn-send").disabled = busy;
    $("#btn-send").title = busy ? "A turn is running: choose Queue or Steer, or Lead" : "Enter";
    $("#btn-queue").classList.toggle("primary", busy);
    $("#btn-steer").classList.toggle("primary", busy);
    $("#btn-lead").disabled = !busy;
    $("#btn-stop").disabled = !busy;
  }

  approvals(model, handlers) {
    const box = $("#approvals");
    // Keep a card whose message box the person is typing in: redraw only what came or went.
    const want = new Map([...model.approvals.values()].map((a) => [a.approval_id, a]));
    for (const card of [...box.children]) if (!want.has(card.dataset.approval)) card.remove();
    for (const a of want.values()) {
      if (box.querySelector(`[data-approval="${CSS.escape(a.approval_id)}"]`)) continue;
      box.append(approvalCard(a, handlers));
    }
  }

  outbox(model) {
    const items = model.waiting();
    $("#outbox").hidden = items.length === 0;
    clear($("#outbox-list"), items.map((o) =>
      h("li", { dataset: { id: o.id, fate: o.fate, kind: o.kind } },
        h("span", { class: `fate-badge fate-${o.fate}` }, o.fate),
        h("span", { class: "kind-badge" }, KIND[o.kind] || o.kind),
        o.text ? h("span", { class: "text", title: o.text }, short(o.text.split("\n")[0], 200))
          : h("span", { class: "muted" }, o.id))));
  }
}

function approvalCard(a, handlers) {
  const security = !!a.security;
  const msg = h("input", { placeholder: "Message (optional): with Deny it redirects, with Allow it adds", "aria-label": "approval message" });
  const status = h("span", { class: "error", role: "alert" });
  const answer = async (decision, scope, btns) => {
    btns.forEach((b) => (b.disabled = true));
    status.textContent = "";
    try {
      await handlers.answer(a.approval_id, { decision, scope, ...(msg.value.trim() ? { message: msg.value.trim() } : {}) });
      status.textContent = "";
    } catch (err) {
      status.textContent = err.detail || err.message;
      btns.forEach((b) => (b.disabled = false));
    }
  };
  const allow = h("button", { class: "primary", "data-act": "allow" }, "Allow");
  const deny = h("button", { class: "danger", "data-act": "deny" }, "Deny");
  const always = security ? null : h("button", { "data-act": "always", title: "Allow, and do not ask again this session for this command" }, "Always this session");
  const btns = [allow, deny, always].filter(Boolean);
  allow.onclick = () => answer("allow", "once", btns);
  deny.onclick = () => answer("deny", "once", btns);
  if (always) always.onclick = () => answer("allow", "session", btns);
  msg.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); allow.click(); } });
  const j = a.judge;
  return h("div", { class: `approval${security ? " security" : ""}`, dataset: { approval: a.approval_id } },
    h("div", { class: "kind" }, security ? "Security confirm" : "Approval needed",
      h("span", { class: "muted" }, ` — ${a.name || "tool"}`)),
    h("div", { class: "call" }, argsText(a.name, a.args) || JSON.stringify(a.args)),
    a.reason ? h("div", { class: "reason" }, "Why: ", a.reason) : null,
    j ? h("div", { class: "judge" }, `Judge (${j.kind || "judge"}) said ${j.verdict || "?"}` +
      (j.score !== undefined && j.score !== null ? ` (score ${j.score})` : "") + (j.reason ? `: ${j.reason}` : "")) : null,
    security ? h("div", { class: "muted" }, "A security confirm is always asked; no standing approval waives it.") : null,
    h("div", { class: "row" }, msg, ...btns),
    status);
}
