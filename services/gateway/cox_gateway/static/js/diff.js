// One diff view for every place a change is shown (approval cards, Changes, History): unified,
// coloured, numbered, wrapping inside narrow panes. It reads either the numbered hunks the API
// records ({old_start, new_start, lines: [{op, old, new, text}]}) or unified diff text.

import { h } from "./dom.js";

/** Unified diff text -> rows with old/new line numbers. */
export function diffRows(text) {
  const rows = [];
  let a = 0, b = 0;
  for (const line of String(text || "").split("\n")) {
    if (line === "") continue;
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

/** Numbered hunks (textdiff.Hunk.to_json) -> the same rows. */
export function hunkRows(hunks) {
  const rows = [];
  for (const hk of hunks || []) {
    rows.push({ cls: "hunk", old: "", new: "", text: `@@ -${hk.old_start},${hk.old_len} +${hk.new_start},${hk.new_len} @@` });
    for (const ln of hk.lines || []) {
      const cls = ln.op === "+" ? "add" : ln.op === "-" ? "del" : "ctx";
      rows.push({ cls, old: ln.old ?? "", new: ln.new ?? "", text: String(ln.text ?? "") });
    }
  }
  return rows;
}

function rowsView(rows, label) {
  return h("div", { class: "diff", role: "group", "aria-label": label || "diff" }, rows.map((r) =>
    h("div", { class: `ln ${r.cls}` },
      h("span", { class: "num old", "aria-hidden": "true" }, r.old), h("span", { class: "num new", "aria-hidden": "true" }, r.new),
      h("span", { class: "text" }, (r.cls === "add" ? "+" : r.cls === "del" ? "-" : r.cls === "ctx" ? " " : "") + r.text))));
}

export function diffView(text, label) { return rowsView(diffRows(text), label); }

function flag(text) { return h("div", { class: "diff" }, h("div", { class: "flag" }, text)); }

/** A recorded preview or a diff result, flags first (nothing invented in place of a missing diff). */
export function changeView(p, label) {
  if (!p) return flag("Preview unavailable for this record.");
  if (p.oversized) return flag("Too large to preview.");
  if (p.binary) return flag("Binary content.");
  if (p.empty) return flag("No difference.");
  if (Array.isArray(p.hunks) && p.hunks.length) return rowsView(hunkRows(p.hunks), label);
  if (typeof p.diff === "string" && p.diff) return diffView(p.diff, label);
  return flag("Preview unavailable for this record.");
}

/** A write's content as an all-added diff, when no preview was recorded (a new file). */
export function contentView(content, label) {
  const lines = String(content ?? "").split("\n");
  if (lines.length > 1 && lines[lines.length - 1] === "") lines.pop();
  return rowsView([{ cls: "hunk", old: "", new: "", text: `@@ -0,0 +1,${lines.length} @@` },
    ...lines.map((t, i) => ({ cls: "add", old: "", new: i + 1, text: t }))], label);
}
