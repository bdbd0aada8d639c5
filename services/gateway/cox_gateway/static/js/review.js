// Review: what a session, or one of its turns, changed, file by file — the net diff of each file
// from the version kept before its first write in that scope to the file as it is now (the
// versions/diff endpoints of docs/api.md), with +/- counts, created and deleted said as such,
// and Restore (put the file back as it was before) and Undo from there.

import { changeView } from "./diff.js";
import { $, clear, focusMovedSince, h } from "./dom.js";

function counts(added, removed) {
  return h("span", { class: "counts" }, h("span", { class: "add" }, `+${added ?? 0}`), " ", h("span", { class: "del" }, `−${removed ?? 0}`));
}

/** Per file, the first version kept in the scope (the content before it), and its writes. */
export function reviewFiles(model, turnId = null) {
  const files = new Map();
  for (const v of model.versions) {
    if (turnId && v.turn_id !== turnId) continue;
    if (!files.has(v.path)) files.set(v.path, { path: v.path, base: v, writes: [], later: false });
  }
  for (const w of model.writes) {
    const f = files.get(w.path);
    if (!f) continue;
    if (!turnId || w.turn_id === turnId) f.writes.push(w);
    else if (w.seq > f.base.seq) f.later = true; // a later turn (or a restore) changed it again
  }
  return [...files.values()].filter((f) => f.writes.length);
}

export class Review {
  constructor(api, getModel, onChanged) {
    this.api = api; this.getModel = getModel; this.onChanged = onChanged;
    this.dialog = $("#review");
    this.turnId = null;
    this.generation = 0;
    this.opener = null;
    this.dialog.addEventListener("close", () => {
      this.generation += 1;
      const back = this.opener && this.opener.isConnected && this.opener !== document.body ? this.opener : $("#draft");
      if (!focusMovedSince(this.dialog, this.opener)) back?.focus?.();  // a key typed since moved it: keep it there
      this.opener = null;
    });
    $("#review-close").addEventListener("click", () => this.dialog.close());
  }

  /** Open the Review of the session (turnId null) or of one turn. */
  open(turnId = null) {
    this.turnId = turnId;
    this.opener = document.activeElement;
    if (!this.dialog.open) this.dialog.showModal();
    this.load();
    $("#review-close").focus();
  }

  async load() {
    const m = this.getModel();
    if (!m) return;
    const gen = ++this.generation;
    const n = this.turnId ? m.turnNumbers.get(this.turnId) : null;
    $("#review-title").textContent = n ? `Review: what turn ${n} changed` : "Review: what this session changed";
    this.dialog.dataset.scope = n ? `turn-${n}` : "session";
    const files = reviewFiles(m, this.turnId);
    const body = $("#review-body");
    const result = $("#review-result");
    if (!files.length) {
      clear(body, h("p", { class: "muted" }, n ? `Turn ${n} changed no file.` : "This session changed no file yet."));
      this.drawUndo(gen);
      return;
    }
    const rows = files.map((f) => this.row(f, n, gen));
    clear(body, h("p", { class: "muted review-sum" }, `${files.length} file${files.length === 1 ? "" : "s"}; each diff runs from before ` +
      (n ? `turn ${n}` : "the session's first change to it") + " to the file as it is now."), h("ul", { class: "review-files" }, rows));
    if (!result.textContent) result.className = "result";
    this.drawUndo(gen);
  }

  row(f, n, gen) {
    const li = h("li", { class: "review-file", dataset: { path: f.path } });
    const created = f.base.store === "absent";
    const head = h("div", { class: "review-head" }, h("span", { class: "path mono" }, f.path), h("span", { class: "kind-slot" }), h("span", { class: "count-slot" }));
    const diffBox = h("div", { class: "review-diff" }, h("div", { class: "flag muted" }, "Loading the diff…"));
    const restore = h("button", { type: "button", "data-act": "restore",
      title: created ? "Delete it: it did not exist before" : `Put ${f.path} back as it was before ${n ? `turn ${n}` : "this session changed it"}` },
    created ? `Delete ${f.path} (new ${n ? "in this turn" : "in this session"})` : `Restore as before ${n ? `turn ${n}` : "the session"}`);
    restore.addEventListener("click", () => this.restore(f, restore));
    const det = h("details", { open: true }, h("summary", {}, "Diff"), diffBox);
    clear(li, head,
      f.later ? h("div", { class: "flag muted" }, `Later changes are included: the file changed again after turn ${n}.`) : null,
      det, h("div", { class: "row" }, restore));
    this.api.diff(this.getModel().sid, f.base.version_id).then((d) => {
      if (gen !== this.generation) return;
      const kind = d.deleted ? (created ? "created, then deleted" : "deleted") : created ? "created" : d.empty ? "unchanged now" : "changed";
      li.dataset.kind = kind.split(",")[0];
      clear(head.querySelector(".kind-slot"), h("span", { class: `via-badge review-${li.dataset.kind}` }, kind));
      clear(head.querySelector(".count-slot"), counts(d.added, d.removed));
      if (d.deleted) clear(diffBox, h("div", { class: "flag" }, created ? "It was created and is gone again: nothing differs from before." : `Deleted: ${f.path} no longer exists (${d.removed ?? 0} lines removed).`),
        created ? null : changeView(d, `${f.path}: before to now`));
      else if (d.empty) clear(diffBox, h("div", { class: "flag" }, "No difference now: the file is as it was before."));
      else clear(diffBox, created ? h("div", { class: "flag" }, `Created: ${f.path} did not exist before.`) : null, changeView(d, `${f.path}: before to now`));
      if (d.empty || (d.deleted && created)) restore.disabled = true;
    }, (err) => { if (gen === this.generation) clear(diffBox, h("p", { class: "error" }, err.detail || err.message)); });
    return li;
  }

  async drawUndo(gen) {
    const box = $("#review-undo");
    const m = this.getModel();
    let t;
    try { t = await this.api.undoTarget(m.sid); } catch (err) { if (gen === this.generation) clear(box, h("span", { class: "error" }, err.detail || err.message)); return; }
    if (gen !== this.generation) return;
    const files = t.files || [];
    if (!files.length) { clear(box, h("span", { class: "muted" }, "Nothing to undo.")); return; }
    const parts = files.map((f) => (f.existed ? `put back ${f.path} as it was before` : `delete ${f.path} (it did not exist before)`));
    const b = h("button", { type: "button", id: "review-undo-btn", "data-act": "undo" }, "Undo the latest write");
    b.addEventListener("click", () => this.undo(b));
    clear(box, b, h("span", { class: "muted" }, ` Undo will ${parts.join("; ")}.`));
  }

  say(text, error = false) {
    const r = $("#review-result");
    r.className = "result" + (error ? " error" : "");
    r.textContent = text;
  }

  async restore(f, btn) {
    const m = this.getModel();
    btn.disabled = true;
    try {
      const out = await this.api.restore(m.sid, f.base.version_id);
      this.say(out.deleted ? `Deleted ${out.path}: it did not exist before.` : `Restored ${out.path} as it was before (+${out.added} −${out.removed}); Undo puts it back.`);
      this.onChanged?.();
    } catch (err) {
      this.say(err.code === "busy" ? "Not now: a turn is running (stop it or wait)." : `Restore refused: ${err.detail || err.message}`, true);
      btn.disabled = false;
    }
  }

  async undo(btn) {
    const m = this.getModel();
    btn.disabled = true;
    try {
      const out = await this.api.undo(m.sid);
      const files = out.files?.length ? out.files : [out];
      this.say("Undid the latest write: " + files.map((x) => (x.deleted ? `deleted ${x.path} (it did not exist before that write)` : `${x.path} put back as it was before`)).join("; ") + ".");
      this.onChanged?.();
    } catch (err) {
      this.say(err.code === "busy" ? "Not now: a turn is running (stop it or wait)." : `Undo refused: ${err.detail || err.message}`, true);
      btn.disabled = false;
    }
  }

  /** The log moved on (a restore or undo is recorded as events): redraw if open. */
  refresh() { if (this.dialog.open) this.load(); }
}
