// A small Markdown reader for the model's answers, building DOM nodes directly: every piece of
// text goes in as a text node and every element is one this file names, so nothing a model
// writes can become markup (no innerHTML anywhere). Links open in a new tab, only for http(s)
// and mailto, with rel="noopener noreferrer"; anything else stays text.
//
// Blocks: fenced code (``` with an optional language, highlighted), headings, lists (- * + and
// 1.), block quotes, rules, paragraphs. Inline: `code`, **strong**, *em* / _em_, [text](url),
// bare http(s) URLs.

import { h } from "./dom.js";

const SAFE_URL = /^(https?:\/\/|mailto:)/i;

export function safeHref(url) {
  const u = String(url || "").trim();
  if (!SAFE_URL.test(u)) return null;
  try { return new URL(u).href; } catch { return null; }
}

function link(text, url) {
  const href = safeHref(url);
  if (!href) return null;
  return h("a", { href, target: "_blank", rel: "noopener noreferrer nofollow" }, text);
}

// ---------------------------------------------------------------- inline
const INLINE = [
  { re: /`([^`\n]+)`/y, make: (m) => h("code", {}, m[1]) },
  { re: /\*\*([^*\n](?:[^*\n]|\*(?!\*))*?)\*\*/y, make: (m) => h("strong", {}, inline(m[1])) },
  { re: /(?<![\w])__([^_\n]+?)__(?![\w])/y, make: (m) => h("strong", {}, inline(m[1])) },
  { re: /\*([^*\s](?:[^*\n]*?[^*\s])?)\*/y, make: (m) => h("em", {}, inline(m[1])) },
  { re: /(?<![\w])_([^_\s](?:[^_\n]*?[^_\s])?)_(?![\w])/y, make: (m) => h("em", {}, inline(m[1])) },
  { re: /\[([^\]\n]+)\]\(([^()\s]+)\)/y, make: (m) => link(m[1], m[2]) },
  { re: /https?:\/\/[^\s<>()"']+[^\s<>()"'.,;:!?]/y, make: (m) => link(m[0], m[0]) },
];

export function inline(text) {
  const out = [];
  let buf = "";
  let i = 0;
  const s = String(text);
  outer: while (i < s.length) {
    const c = s[i];
    if (c === "`" || c === "*" || c === "_" || c === "[" || c === "h") {
      for (const rule of INLINE) {
        rule.re.lastIndex = i;
        const m = rule.re.exec(s);
        if (!m) continue;
        const node = rule.make(m);
        if (!node) continue; // an unsafe link: fall through, it stays text
        if (buf) { out.push(buf); buf = ""; }
        out.push(node);
        i += m[0].length;
        continue outer;
      }
    }
    buf += c;
    i += 1;
  }
  if (buf) out.push(buf);
  return out;
}

// ---------------------------------------------------------------- code highlighting
const KEYWORDS = new Set((
  "def class return if elif else for while in not and or is None True False import from as with try except " +
  "finally raise pass break continue lambda yield async await function const let var new this typeof instanceof " +
  "null undefined true false switch case default do export extends static public private fn mut struct impl " +
  "match use pub type interface enum then fi esac done echo local"
).split(" "));
const TOKEN = /(#[^\n]*|\/\/[^\n]*|\/\*[\s\S]*?\*\/)|("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`)|(\b\d+(?:\.\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)/g;

export function highlight(code, lang) {
  const out = [];
  const hashComments = !/^(js|javascript|ts|typescript|json|css|c|cpp|java|go|rust)$/i.test(lang || "");
  let last = 0;
  for (const m of String(code).matchAll(TOKEN)) {
    let cls = null;
    if (m[1]) cls = m[1].startsWith("#") && !hashComments ? null : "tok-com";
    else if (m[2]) cls = "tok-str";
    else if (m[3]) cls = "tok-num";
    else if (m[4] && KEYWORDS.has(m[4])) cls = "tok-kw";
    if (!cls) continue;
    if (m.index > last) out.push(code.slice(last, m.index));
    out.push(h("span", { class: cls }, m[0]));
    last = m.index + m[0].length;
  }
  if (last < code.length) out.push(code.slice(last));
  return out;
}

// ---------------------------------------------------------------- blocks
const FENCE = /^\s{0,3}(```+|~~~+)\s*([\w+#.-]*)\s*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^(\s*)([-*+])\s+(.*)$/;
const NUMBERED = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const TABLE_SEP = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;

/** The cells of a table row: "| a | b |" or "a | b" (a backslash keeps a pipe in a cell). */
function cells(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

/** Markdown text -> an array of DOM nodes. */
export function markdown(text) {
  const lines = String(text ?? "").replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let i = 0;
  let para = [];
  const flush = () => {
    if (!para.length) return;
    const kids = [];
    para.forEach((l, n) => { if (n) kids.push(h("br")); kids.push(...inline(l)); });
    out.push(h("p", {}, kids));
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      flush();
      const fence = m[1], lang = m[2] || "";
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence)) { body.push(lines[i]); i += 1; }
      i += 1; // the closing fence (or the end: a block still streaming)
      const code = body.join("\n");
      out.push(h("pre", { class: "code", dataset: lang ? { lang } : {} },
        lang ? h("span", { class: "lang" }, lang) : null,
        h("code", {}, highlight(code, lang))));
      continue;
    }
    if (!line.trim()) { flush(); i += 1; continue; }
    if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("|")) {
      flush();
      const head = cells(line);
      const align = cells(lines[i + 1]).map((c) => (c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : null));
      i += 2;
      const rows = [];
      while (i < lines.length && lines[i].trim() && lines[i].includes("|")) { rows.push(cells(lines[i])); i += 1; }
      const td = (tag, c, n) => h(tag, align[n] ? { style: `text-align: ${align[n]}` } : {}, inline(c));
      out.push(h("table", {}, h("thead", {}, h("tr", {}, head.map((c, n) => td("th", c, n)))),
        h("tbody", {}, rows.map((r) => h("tr", {}, head.map((_, n) => td("td", r[n] ?? "", n)))))));
      continue;
    }
    if ((m = HEADING.exec(line))) { flush(); out.push(h(`h${Math.min(6, m[1].length + 2)}`, { class: "md-h" }, inline(m[2]))); i += 1; continue; }
    if (RULE.test(line)) { flush(); out.push(h("hr")); i += 1; continue; }
    if (QUOTE.test(line)) {
      flush();
      const body = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) { body.push(m[1]); i += 1; }
      out.push(h("blockquote", {}, markdown(body.join("\n"))));
      continue;
    }
    if (BULLET.test(line) || NUMBERED.test(line)) {
      flush();
      const ordered = !BULLET.test(line);
      const re = ordered ? NUMBERED : BULLET;
      const items = [];
      let start = null;
      while (i < lines.length) {
        const l = lines[i];
        if ((m = re.exec(l))) {
          if (ordered && start === null) start = Number(m[2]);
          items.push([m[3]]);
        } else if (items.length && l.trim() && /^\s{2,}/.test(l)) {
          items[items.length - 1].push(l.trim());
        } else break;
        i += 1;
      }
      out.push(h(ordered ? "ol" : "ul", ordered && start !== 1 ? { start } : {},
        items.map((parts) => h("li", {}, parts.flatMap((p, n) => (n ? [h("br"), ...inline(p)] : inline(p)))))));
      continue;
    }
    para.push(line);
    i += 1;
  }
  flush();
  return out;
}
