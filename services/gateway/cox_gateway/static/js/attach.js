// Attachments of the message being written (docs/api.md, POST /v1/sessions/{sid}/attachments):
// files chosen with Attach, dropped on the composer or the transcript, or pasted into the box.
// Each one is uploaded at once, so a refusal (too large, a type not allowed) shows on its chip
// before anything is sent; the send names the uploaded ones by id. A chip stays until the message
// that carries it is accepted, or the person removes it: a refused send loses nothing.

import { $, clear, h } from "./dom.js";

/** A size in words: 812 B, 4.2 KB, 3.1 MB. */
export function size(n) {
  if (!Number.isFinite(n)) return "";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(n < 10240 ? 1 : 0)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

/** What an upload's refusal means, in a person's words (the server's detail kept). */
function refusal(err) {
  const why = err.detail || err.message;
  if (err.status === 413) return `too large: ${why}`;
  if (err.status === 415 || err.code === "unsupported_media_type") return `type not allowed: ${why}`;
  if (err.status === 0) return `not uploaded: ${why}`;
  return `refused (${err.status} ${err.code}): ${why}`;
}

// A file pasted from the clipboard often has no useful name ("image.png", or none at all).
const EXT = { "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp", "text/plain": "txt" };

export class Attachments {
  /** ``getSid`` names the open session; ``say(text, error)`` speaks under the composer;
   *  ``changed()`` is told when the chips change (the send buttons' state). */
  constructor(api, getSid, say, changed = () => {}) {
    Object.assign(this, { api, getSid, say, changed });
    this.items = [];      // {key, name, size, media_type, state: "uploading" | "ready" | "failed", id, error, sid}
    this.n = 0;
    this.list = $("#attach-list");
    this.input = $("#attach-input");
    $("#btn-attach").addEventListener("click", () => this.input.click());
    this.input.addEventListener("change", () => { this.add([...this.input.files]); this.input.value = ""; });
    $("#draft").addEventListener("paste", (e) => this.paste(e));
    for (const zone of [$("#composer"), $("#transcript")]) this.dropZone(zone);
  }

  /** Files from the clipboard become attachments; text pastes as text (both, when both came). */
  paste(e) {
    const dt = e.clipboardData;
    const files = dt ? [...dt.files] : [];
    if (!files.length) return;
    if (!dt.types.includes("text/plain")) e.preventDefault();
    this.add(files, true);
  }

  dropZone(zone) {
    const hasFiles = (e) => [...(e.dataTransfer?.types || [])].includes("Files");
    let depth = 0;
    zone.addEventListener("dragenter", (e) => { if (!hasFiles(e)) return; depth += 1; zone.classList.add("dropping"); });
    zone.addEventListener("dragover", (e) => { if (!hasFiles(e)) return; e.preventDefault(); e.dataTransfer.dropEffect = "copy"; });
    zone.addEventListener("dragleave", () => { depth = Math.max(0, depth - 1); if (!depth) zone.classList.remove("dropping"); });
    zone.addEventListener("drop", (e) => {
      depth = 0; zone.classList.remove("dropping");
      const files = [...(e.dataTransfer?.files || [])];
      if (!files.length) return;
      e.preventDefault();
      this.add(files);
      $("#draft").focus();
    });
  }

  add(files, pasted = false) {
    const sid = this.getSid();
    if (!sid || !files.length) return;
    for (const f of files) {
      this.n += 1;
      let name = f.name;
      if (pasted && (!name || /^image\.\w+$/.test(name))) name = `pasted-${this.n}.${EXT[f.type] || (name.split(".").pop() || "bin")}`;
      const it = { key: `a${this.n}`, name, size: f.size, media_type: f.type, state: "uploading", id: null, error: null, sid };
      this.items.push(it);
      this.upload(it, f);
    }
    this.draw();
    this.say(`Attaching ${files.length === 1 ? this.items.at(-1).name : `${files.length} files`}…`);
  }

  async upload(it, file) {
    try {
      const r = await this.api.upload(it.sid, file, it.name);
      Object.assign(it, { state: "ready", id: r.attachment_id, name: r.name, size: r.size, media_type: r.media_type });
      if (this.items.includes(it) && !this.uploading()) this.say(this.failed().length ? this.failedNote() : "");
    } catch (err) {
      it.state = "failed"; it.error = refusal(err);
      if (this.items.includes(it)) this.say(`${it.name} was not attached: ${it.error}. Remove it (✕) to send without it; your text is still in the box.`, true);
    }
    if (this.items.includes(it)) this.draw();
  }

  remove(key) {
    const i = this.items.findIndex((x) => x.key === key);
    if (i < 0) return;
    const [it] = this.items.splice(i, 1);
    this.draw();
    // Keep the keyboard where it was: the next chip's ✕, else the message box.
    const next = this.list.querySelectorAll("button.remove")[Math.min(i, this.items.length - 1)];
    (next || $("#draft")).focus();
    this.say(`Removed ${it.name}.`);
  }

  uploading() { return this.items.filter((x) => x.state === "uploading").length; }
  failed() { return this.items.filter((x) => x.state === "failed"); }
  ids() { return this.items.filter((x) => x.state === "ready").map((x) => x.id); }
  count() { return this.items.length; }
  failedNote() {
    const f = this.failed();
    return `Not attached: ${f.map((x) => `${x.name} (${x.error})`).join("; ")}. Remove ${f.length === 1 ? "it" : "them"} (✕) to send without ${f.length === 1 ? "it" : "them"}.`;
  }

  /** Why the message cannot go yet, or null: an upload still running, or one that failed. */
  blocker() {
    if (this.uploading()) return `Wait: ${this.uploading()} attachment${this.uploading() === 1 ? " is" : "s are"} still uploading.`;
    if (this.failed().length) return this.failedNote();
    return null;
  }

  /** The message that carried them was accepted: the chips go. */
  sent() { this.items = []; this.draw(); }

  /** Another session opened: its attachments are its own, so the chips go. */
  reset() { this.items = []; this.draw(); }

  draw() {
    const focused = document.activeElement?.closest?.("#attach-list li")?.dataset.key;
    this.list.hidden = !this.items.length;
    clear(this.list, this.items.map((it) => h("li", {
      class: `chip ${it.state}`, dataset: { key: it.key, state: it.state, attachment: it.id || "" },
    },
    h("span", { class: "chip-name" }, it.name),
    h("span", { class: "chip-size" }, size(it.size)),
    it.state === "uploading" ? h("span", { class: "chip-state" }, "uploading…") : null,
    it.state === "failed" ? h("span", { class: "chip-state" }, `not attached: ${it.error}`) : null,
    h("button", { type: "button", class: "remove icon", "aria-label": `Remove ${it.name}`, title: `Remove ${it.name}`, onclick: () => this.remove(it.key) }, "✕"))));
    if (focused) this.list.querySelector(`li[data-key="${focused}"] button`)?.focus();
    this.changed();
  }
}

// ------------------------------------------------------------------ in the transcript
const blobs = new Map(); // `${sid}/${attachment_id}` -> Promise of an object URL

/** An attachment's bytes as an object URL, fetched once per page (with the token, never in a URL). */
function blobUrl(load, sid, aid) {
  const k = `${sid}/${aid}`;
  if (!blobs.has(k)) {
    const p = load(aid).then((b) => URL.createObjectURL(b));
    p.catch(() => blobs.delete(k)); // a failure is tried again at the next draw
    blobs.set(k, p);
  }
  return blobs.get(k);
}

export function forgetBlobs() {
  for (const p of blobs.values()) p.then((u) => URL.revokeObjectURL(u), () => {});
  blobs.clear();
}

/** What a user.msg carried: images previewed, other files as a named chip with the size (a button
 *  that downloads it). ``load(aid)`` fetches an attachment's Blob. */
export function attachedView(sid, list, load) {
  if (!list?.length) return null;
  return h("div", { class: "attached", role: "group", "aria-label": `${list.length} attachment${list.length === 1 ? "" : "s"}` },
    list.map((a) => {
      const label = `${a.name} · ${size(a.size)}`;
      if (String(a.media_type || "").startsWith("image/") && load) {
        const img = h("img", { alt: `Attached image ${a.name}`, dataset: { attachment: a.attachment_id } });
        const fig = h("figure", { class: "attach-img", dataset: { attachment: a.attachment_id } }, img, h("figcaption", {}, label));
        blobUrl(load, sid, a.attachment_id).then((u) => { img.src = u; fig.dataset.loaded = "1"; },
          (err) => { fig.replaceChildren(h("span", { class: "error" }, `${a.name}: ${err.detail || err.message}`)); });
        return fig;
      }
      const b = h("button", { type: "button", class: "chip file", dataset: { attachment: a.attachment_id }, title: `Download ${a.name} (${a.media_type})` },
        h("span", { class: "chip-name" }, a.name), h("span", { class: "chip-size" }, size(a.size)));
      b.addEventListener("click", () => {
        if (!load) return;
        blobUrl(load, sid, a.attachment_id).then((u) => {
          const link = h("a", { href: u, download: a.name, hidden: true });
          document.body.append(link); link.click(); link.remove();
        }, (err) => { b.title = `${a.name}: ${err.detail || err.message}`; });
      });
      return b;
    }));
}
