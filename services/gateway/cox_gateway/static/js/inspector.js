// The right-hand pane: the plan, Changes (latest recorded preview per file) and History (kept
// versions of a file: diff to current, Restore, Undo). The pane is narrow, so diffs wrap.

import { $, $$, ago, clear, h } from "./dom.js";

/** Unified diff text -> rows with old/new line numbers. */
export function diffRows(text) {
  const rows = [];
  let a = 0, b = 0;
  for (const line of String(text || "").split("\n")) {
    if (line === "" ) continue;
    if (line.startsWith("---") || line.startsWith("+++")) continue;
    const m = /^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@/.exec(line);
    if (m) { a = +m[1]; b = +m[2]; rows.push({ cls: "hunk", old: "", new: "", text: line }); continue; }
    if (line.startsWith("+")) rows.push({ cls: "add", old: "", new: b++, text: line.slice(1) });
    else if (line.startsWith("-")) rows.push({ cls: "del", old: a++, new: "", text: line.slice(1) });
    else if (line.startsWith("\\")) rows.push({ cls: "meta", old: "", new: "", text: line });
    else rows.push({ cls: "ctx", old: a++, new: b++, text: line.slice(1) });
  }
  return rows;
}

export function diffView(text) {
  return h("div", { class: "diff" }, diffRows(text).map((r) =>
    h("div", { class: `ln ${r.cls}` },
      h("span", { class: "num old" }, r.old), h("span", { class: "num new" }, r.new),
      h("span", { class: "text" }, (r.cls === "add" ? "+" : r.cls === "del" ? "-" : r.cls === "ctx" ? " " : "") + r.text))));
}

function counts(added, removed) {
  if (added === undefined && removed === undefined) return null;
  return h("span", { class: "counts" }, h("span", { class: "add" }, `+${added ?? 0}`), " ", h("span", { class: "del" }, `−${removed ?? 0}`));
}

/** A change record, read tolerantly: the preview may sit under `preview` or on the record. */
function previewOf(f) {
  const p = f.preview && typeof f.preview === "object" ? f.preview : f;
  const diff = typeof f.preview === "string" ? f.preview : p.diff ?? p.text ?? null;
  return { diff, added: p.added ?? f.added, removed: p.removed ?? f.removed, oversized: p.oversized, empty: p.empty };
}

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
    for (const b of $$(".tabs button")) b.addEventListener("click", () => this.show(b.dataset.tab));
  }

  reset() { this.open.clear(); this.historyPath = ""; this.selected = null; this.generation += 1; this.show("plan"); }

  show(tab) {
    this.tab = tab;
    for (const b of $$(".tabs button")) b.classList.toggle("active", b.dataset.tab === tab);
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
    const p = previewOf(f);
    const det = h("details", { class: "file", open: this.open.has(f.path), dataset: { path: f.path } },
      h("summary", {}, h("span", { class: "path" }, f.path), counts(p.added, p.removed),
        f.created ? h("span", { class: "muted" }, ago(f.created * (f.created < 1e12 ? 1000 : 1))) : null),
      h("div", { class: "preview-label" }, "Approved preview — not proof of a successful write"),
      p.oversized ? h("div", { class: "diff" }, h("div", { class: "flag" }, "Too large to preview."))
        : p.empty ? h("div", { class: "diff" }, h("div", { class: "flag" }, "No difference."))
        : p.diff ? diffView(p.diff)
        : h("div", { class: "diff" }, h("div", { class: "flag" }, "Preview unavailable for this record.")),
      h("div", { class: "row" }, h("button", { class: "link", onclick: () => { this.historyPath = f.path; this.selected = null; this.show("history"); } }, "History of this file")));
    det.addEventListener("toggle", () => { if (det.open) this.open.add(f.path); else this.open.delete(f.path); });
    return det;
  }

  drawHistory() {
    const box = $("#tab-history");
    const input = h("input", { value: this.historyPath, placeholder: "path in the workspace", "aria-label": "file path" });
    const form = h("form", {}, input, h("button", { type: "submit" }, "Versions"));
    form.addEventListener("submit", (e) => { e.preventDefault(); this.historyPath = input.value.trim(); this.selected = null; this.drawHistory(); });
    const undo = h("button", { id: "btn-undo", title: "Put back this session's latest write" }, "Undo last write");
    undo.onclick = () => this.undo();
    this.result = h("div", { class: "result", role: "status" });
    this.list = h("ul", { class: "versions" });
    this.diffBox = h("div", { class: "diff-box" });
    clear(box, h("div", { class: "history" }, form, h("div", { class: "row" }, undo), this.result, this.list, this.diffBox));
    if (this.historyPath) this.loadVersions();
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
        h("div", { class: "meta" }, `${v.store === "absent" ? "did not exist" : `${v.size} bytes, ${v.store}`} · ${v.version_id}`),
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
    const flag = d.oversized ? "Too large to compare." : d.empty ? "No difference: the current file is this version."
      : d.binary ? "Binary content differs." : null;
    clear(this.diffBox, h("div", { class: "file", dataset: { version: vid } },
      h("div", { class: "row" }, h("span", { class: "path" }, `${d.path}: version → current`), counts(d.added, d.removed)),
      d.deleted ? h("div", { class: "flag" }, "The current file is missing (a deletion).") : null,
      flag ? h("div", { class: "diff" }, h("div", { class: "flag" }, flag)) : diffView(d.diff)));
  }

  async restore(vid) {
    const sid = this.getSid();
    try {
      const out = await this.api.restore(sid, vid);
      this.result.className = "result";
      this.result.textContent = `Restored ${out.path} from ${out.restored_from} (+${out.added} −${out.removed}); the content it replaced is kept as ${out.kept?.version_id}.`;
      this.selected = vid;
      await this.loadVersions();
    } catch (err) {
      this.result.className = "result error";
      this.result.textContent = err.detail || err.message;
    }
  }

  async undo() {
    const sid = this.getSid();
    try {
      const out = await this.api.undo(sid);
      this.result.className = "result";
      this.result.textContent = `Undid the latest write: ${out.path} put back (+${out.added} −${out.removed}).`;
      if (!this.historyPath) this.historyPath = out.path;
      await this.loadVersions();
    } catch (err) {
      this.result.className = "result error";
      this.result.textContent = err.detail || err.message;
    }
  }

  refresh(what) {
    if (what.has("changes") && this.tab === "changes") this.loadChanges();
    if (what.has("history") && this.tab === "history" && this.historyPath) this.loadVersions();
  }
}
