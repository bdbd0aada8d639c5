// The right-hand pane: the plan, Changes (latest recorded preview per file) and History (kept
// versions of a file: diff to current, Restore, Undo), and below them the session's programs and
// tool servers. The pane is narrow, so diffs wrap.

import { changeView } from "./diff.js";
import { $, $$, ago, clear, h } from "./dom.js";

function counts(added, removed) {
  if (added === undefined && removed === undefined) return null;
  return h("span", { class: "counts" }, h("span", { class: "add" }, `+${added ?? 0}`), " ", h("span", { class: "del" }, `−${removed ?? 0}`));
}

const VIA_LABEL = {
  command: "Changed by a command", restore: "Restored by you", undo: "Put back by Undo",
};

function when(ts) { return ts ? ago(ts < 1e12 ? ts * 1000 : ts) : ""; }

export class Inspector {
  constructor(api, getSid, onError) {
    this.api = api; this.getSid = getSid; this.onError = onError;
    this.tab = "plan";
    this.open = new Set();       // expanded Changes rows survive redraws
    this.historyPath = "";
    this.selected = null;        // selected version id in History
    this.generation = 0;         // bumped per session: a reply for an older session is dropped
    this.seqChanges = 0;         // and per request, so a slower older reply cannot win
    this.seqHistory = 0;
    for (const b of $$(".tabs [role=tab]")) b.addEventListener("click", () => this.show(b.dataset.tab));
    // Roving focus: one tab in the Tab order, arrows (and Home/End) move between them and show them.
    $(".tabs[role=tablist]").addEventListener("keydown", (e) => {
      const tabs = $$(".tabs [role=tab]");
      const i = tabs.indexOf(e.target);
      if (i < 0) return;
      const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 }[e.key];
      if (to === undefined) return;
      e.preventDefault();
      const t = tabs[(to + tabs.length) % tabs.length];
      this.show(t.dataset.tab);
      t.focus();
    });
  }

  reset() { this.progEls?.clear(); clear($("#programs")); $("#programs").hidden = true; this.open.clear(); this.historyPath = ""; this.selected = null; this.generation += 1; this.show("plan"); }

  show(tab) {
    this.tab = tab;
    for (const b of $$(".tabs [role=tab]")) {
      b.classList.toggle("active", b.dataset.tab === tab);
      b.setAttribute("aria-selected", String(b.dataset.tab === tab));
      b.tabIndex = b.dataset.tab === tab ? 0 : -1;
    }
    for (const s of $$(".inspector .tab")) s.hidden = s.dataset.tab !== tab;
    if (tab === "changes") this.loadChanges();
    if (tab === "history") this.drawHistory();
  }

  drawPlan(plan) {
    const box = $("#tab-plan");
    if (!plan || !plan.steps?.length) {
      clear(box, h("p", { class: "muted" }, "No plan recorded for this turn."));
      return;
    }
    const marks = new Set(plan.marks || []);
    clear(box, h("div", { class: "plan" },
      plan.carried_from ? h("div", { class: "carried" }, `Carried from an unfinished turn (${marks.size} of ${plan.steps.length} done)`) : null,
      h("ol", {}, plan.steps.map((s, i) => h("li", { class: marks.has(i + 1) ? "done" : "", dataset: { step: i + 1 } },
        marks.has(i + 1) ? h("span", { class: "tick", title: "marked done" }, "✓ ") : null, s)))));
  }

  /** The session's MCP tool servers and their state (the session object's mcp_servers). They
   *  run only while the session is busy: a ready server of an idle session is stopped (idle). */
  drawMcp(servers, busy) {
    const box = $("#mcp-servers");
    if (!box) return;
    box.hidden = !servers?.length;
    if (!servers?.length) { clear(box); return; }
    const shown = (s) => (s.state === "ready" && !busy ? "idle" : s.state);
    clear(box, h("h2", {}, "Tool servers (MCP)"), h("ul", {}, servers.map((s) => h("li", { dataset: { server: s.name } },
      h("strong", {}, s.name), " ", h("span", { class: `state state-${shown(s)}` }, shown(s)),
      s.tools?.length ? h("span", { class: "tools muted" }, s.tools.join(", ")) : null,
      s.error ? h("span", { class: "error" }, s.error) : null))));
  }

  /** The session's programs (docs/api.md, Programs): name, command, state, the tail of what they
   *  wrote, and a Stop for each running one. Updated in place, so a Stop keeps the keyboard and
   *  a tail being read keeps its scroll. */
  drawPrograms(programs) {
    const box = $("#programs");
    const list = [...programs.values()];
    box.hidden = !list.length;
    this.progEls = this.progEls || new Map();
    if (!list.length) { clear(box); this.progEls.clear(); return; }
    if (!box.querySelector("ul")) { clear(box, h("h2", {}, "Programs"), h("ul", {})); this.progEls.clear(); }
    const ul = box.querySelector("ul");
    const want = new Set(list.map((p) => p.program_id));
    for (const [id, el] of this.progEls) if (!want.has(id)) { el.li.remove(); this.progEls.delete(id); }
    for (const p of list) {
      let el = this.progEls.get(p.program_id);
      if (!el) { el = this.programRow(p); this.progEls.set(p.program_id, el); ul.append(el.li); }
      this.updateProgram(el, p);
    }
  }

  programRow(p) {
    const label = p.name || p.program_id;
    const el = {
      state: h("span", { class: "state" }),
      stop: h("button", { type: "button", class: "danger stop", "aria-label": `Stop program ${label}`, title: "Stop it and everything it started" }, "Stop"),
      tail: h("pre", { class: "tail", tabindex: "0", role: "region", "aria-label": `output of ${label} (its latest)` }),
      error: h("p", { class: "error", role: "status" }),
    };
    el.li = h("li", { dataset: { program: p.program_id } },
      h("div", { class: "prog-head" }, h("strong", { class: "name" }, label), " ", el.state, el.stop),
      h("div", { class: "command mono" }, p.command || ""),
      h("div", { class: "meta muted" }, `started by ${p.by === "person" ? "you (!&)" : "the model"}${p.started ? ` at ${when(p.started)}` : ""}${p.pty ? " · terminal" : ""}${p.network ? " · network" : ""}`),
      el.tail, el.error);
    el.stop.addEventListener("click", () => this.stopProgram(p.program_id, el));
    return el;
  }

  updateProgram(el, p) {
    el.li.dataset.state = p.state;
    el.state.className = `state state-${p.state}`;
    el.state.textContent = p.state === "running" ? "running"
      : p.state === "exited" ? `exited${p.code === null || p.code === undefined ? "" : ` (code ${p.code})`}`
        : `stopped${p.stopped_by ? ` (by ${p.stopped_by})` : ""}`;
    if (p.state !== "running" && !el.stop.hidden) {
      const had = document.activeElement === el.stop;
      el.stop.hidden = true;
      if (had) el.tail.focus();
    }
    const text = p.tail || (p.state === "running" ? "(no output yet)" : "(no output)");
    if (el.tail.textContent !== text) {
      const atEnd = el.tail.scrollHeight - el.tail.scrollTop - el.tail.clientHeight < 20;
      el.tail.textContent = text;
      if (atEnd) el.tail.scrollTop = el.tail.scrollHeight;
    }
  }

  async stopProgram(pid, el) {
    const sid = this.getSid();
    if (el.stopping) return;
    // aria-disabled, not disabled: a disabled button would drop the keyboard focus.
    el.stopping = true; el.stop.setAttribute("aria-disabled", "true"); el.stop.textContent = "Stopping…"; el.error.textContent = "";
    try {
      await this.api.stopProgram(sid, pid); // its program.stopped (by person) says when it has
    } catch (err) {
      el.stopping = false; el.stop.removeAttribute("aria-disabled"); el.stop.textContent = "Stop";
      el.error.textContent = `Not stopped: ${err.detail || err.message}`;
    }
  }

  async loadChanges() {
    const sid = this.getSid(); const gen = this.generation; const n = ++this.seqChanges;
    const box = $("#tab-changes");
    if (!sid) return;
    let data;
    const current = () => gen === this.generation && n === this.seqChanges;
    try { data = await this.api.changes(sid); } catch (err) { if (current()) clear(box, h("p", { class: "error" }, err.detail || err.message)); return; }
    if (!current()) return;
    const files = Array.isArray(data) ? data : data?.files || data?.changes || [];
    if (!files.length) { clear(box, h("p", { class: "muted" }, "No changes recorded in this session.")); return; }
    clear(box, files.map((f) => this.changeRow(f)));
  }

  changeRow(f) {
    const tool = !f.via || f.via === "tool";
    const p = f.preview || {};
    const added = tool ? p.added : f.added, removed = tool ? p.removed : f.removed;
    const body = h("div", { class: "change-body" });
    const det = h("details", { class: "file", open: this.open.has(f.path), dataset: { path: f.path, via: f.via || "tool" } },
      h("summary", {}, h("span", { class: "path" }, f.path), counts(added, removed),
        tool ? null : h("span", { class: `via-badge via-${f.via}` }, VIA_LABEL[f.via] || f.via),
        f.deleted ? h("span", { class: "via-badge via-deleted" }, "deleted") : null,
        f.ts ? h("span", { class: "muted" }, when(f.ts)) : null),
      h("div", { class: "preview-label" }, f.label || (tool ? "Approved preview — not proof of a successful write" : "")),
      body,
      h("div", { class: "row" }, h("button", { type: "button", class: "link", onclick: () => { this.historyPath = f.path; this.selected = null; this.show("history"); } }, "History of this file")));
    const fill = () => {
      if (body.dataset.filled) return;
      body.dataset.filled = "1";
      if (tool) { body.append(changeView(f.preview, `change to ${f.path}`)); return; }
      if (!f.version_id) { body.append(changeView(null)); return; }
      body.append(h("div", { class: "flag muted" }, "Loading the diff…"));
      const gen = this.generation;
      this.api.diff(this.getSid(), f.version_id).then((d) => {
        if (gen !== this.generation) return;
        clear(body, d.deleted ? h("div", { class: "flag" }, "The file no longer exists.") : null,
          changeView(d, `change to ${f.path}`));
      }, (err) => { if (gen === this.generation) clear(body, h("p", { class: "error" }, err.detail || err.message)); });
    };
    if (det.open) fill();
    det.addEventListener("toggle", () => { if (det.open) { this.open.add(f.path); fill(); } else this.open.delete(f.path); });
    return det;
  }

  drawHistory() {
    const box = $("#tab-history");
    const input = h("input", { id: "history-path", value: this.historyPath, placeholder: "path in the workspace", "aria-label": "file path" });
    const form = h("form", {}, input, h("button", { type: "submit" }, "Versions"));
    form.addEventListener("submit", (e) => { e.preventDefault(); this.historyPath = input.value.trim(); this.selected = null; this.drawHistory(); });
    const undo = h("button", { type: "button", id: "btn-undo", disabled: true }, "Undo last write");
    undo.onclick = () => this.undo();
    this.undoButton = undo;
    this.undoTarget = h("div", { id: "undo-target", class: "muted undo-target", role: "status" });
    this.result = h("div", { class: "result", role: "status" });
    this.list = h("ul", { class: "versions" });
    this.diffBox = h("div", { class: "diff-box" });
    clear(box, h("div", { class: "history" }, form, h("div", { class: "row" }, undo), this.undoTarget, this.result, this.list, this.diffBox));
    this.loadUndoTarget();
    if (this.historyPath) this.loadVersions();
  }

  /** Say which write Undo puts back before the person presses it (GET /undo reads, never writes). */
  async loadUndoTarget() {
    const sid = this.getSid(); const gen = this.generation;
    if (!sid || !this.undoTarget) return;
    let t;
    try { t = await this.api.undoTarget(sid); } catch (err) { if (gen === this.generation) this.undoTarget.textContent = err.detail || err.message; return; }
    if (gen !== this.generation) return;
    const files = t.files || [];
    this.undoButton.disabled = !files.length;
    if (!files.length) { this.undoTarget.textContent = "Nothing to undo: this session has no write left to undo."; this.undoButton.title = ""; return; }
    const what = files[0].reason === "command" ? "the command's changes" : files[0].reason === "restore" ? "the restore" : "the write";
    const parts = files.map((f) => f.existed ? `put back ${f.path} as it was before` : `delete ${f.path} (it did not exist before)`);
    const text = `Undo will undo ${what} of ${when(files[0].created)}: ${parts.join("; ")}.`;
    this.undoTarget.textContent = text;
    this.undoButton.title = text;
  }

  async loadVersions() {
    const sid = this.getSid(); const path = this.historyPath; const gen = this.generation; const n = ++this.seqHistory;
    const current = () => gen === this.generation && n === this.seqHistory;
    let data;
    try { data = await this.api.versions(sid, path); } catch (err) { if (current()) clear(this.list, h("li", { class: "error" }, err.detail || err.message)); return; }
    if (!current()) return;
    const vs = data.versions || [];
    if (!vs.length) { clear(this.list, h("li", { class: "muted" }, `No kept versions of ${path}.`)); return; }
    clear(this.list, vs.map((v) => {
      const li = h("li", { class: v.version_id === this.selected ? "selected" : "", dataset: { version: v.version_id } },
        h("div", {}, h("span", { class: "mono" }, ago(v.created * 1000)), " ", v.reason,
          v.undone ? h("span", { class: "fate-badge fate-discarded" }, "undone") : null),
        h("div", { class: "meta", title: v.version_id }, v.store === "absent" ? "did not exist then" : `${v.size} bytes, ${v.store}`),
        h("div", { class: "row" },
          h("button", { "data-act": "diff", onclick: () => this.showDiff(v.version_id) }, "Diff to current"),
          h("button", { "data-act": "restore", onclick: () => this.restore(v.version_id) }, "Restore")));
      return li;
    }));
    if (this.selected) this.showDiff(this.selected);
  }

  async showDiff(vid) {
    const sid = this.getSid(); const gen = this.generation; const n = this.seqHistory;
    this.selected = vid;
    for (const li of this.list.children) li.classList.toggle("selected", li.dataset.version === vid);
    let d;
    try { d = await this.api.diff(sid, vid); } catch (err) { clear(this.diffBox, h("p", { class: "error" }, err.detail || err.message)); return; }
    if (gen !== this.generation || n !== this.seqHistory || vid !== this.selected) return;
    clear(this.diffBox, h("div", { class: "file", dataset: { version: vid } },
      h("div", { class: "row" }, h("span", { class: "path" }, `${d.path}: version → current`), counts(d.added, d.removed)),
      d.deleted ? h("div", { class: "flag" }, "The current file is missing (a deletion).") : null,
      d.empty ? h("div", { class: "diff" }, h("div", { class: "flag" }, "No difference: the current file is this version."))
        : changeView(d, `${d.path}: version to current`)));
  }

  async restore(vid) {
    const sid = this.getSid();
    try {
      const out = await this.api.restore(sid, vid);
      this.result.className = "result";
      this.result.textContent = `Restored ${out.path} from ${out.restored_from} (+${out.added} −${out.removed}); the content it replaced is kept as ${out.kept?.version_id}.`;
      this.selected = vid;
      await this.loadVersions();
      this.loadUndoTarget();
    } catch (err) {
      this.result.className = "result error";
      this.result.textContent = err.detail || err.message;
    }
  }

  async undo() {
    const sid = this.getSid();
    try {
      const out = await this.api.undo(sid);
      const files = out.files?.length ? out.files : [out];
      this.result.className = "result";
      this.result.textContent = "Undid the latest write: " + files.map((f) => f.deleted
        ? `deleted ${f.path} (it did not exist before that write)`
        : `${f.path} put back as it was before (+${f.added} −${f.removed})`).join("; ") + ".";
      if (!this.historyPath) this.historyPath = out.path;
      await this.loadVersions();
    } catch (err) {
      this.result.className = "result error";
      this.result.textContent = err.detail || err.message;
    }
    this.loadUndoTarget();
  }

  refresh(what) {
    if (what.has("changes") && this.tab === "changes") this.loadChanges();
    if (what.has("history") && this.tab === "history") { if (this.historyPath) this.loadVersions(); this.loadUndoTarget(); }
  }
}
