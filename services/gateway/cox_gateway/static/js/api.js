// The v1 API (docs/api.md), as the console uses it. Every call sends the bearer token; an error
// answer becomes an ApiError carrying the server's {error, detail}.

export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail || code);
    Object.assign(this, { status, code, detail });
  }
}

export function clientId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return "c_" + [...bytes].map((b) => b.toString(36).padStart(2, "0")).join("").slice(0, 22);
}

export class Api {
  constructor(token, onUnauthorized) {
    this.token = token;
    this.onUnauthorized = onUnauthorized;
  }

  /** fetch with the bearer token; a network failure becomes an ApiError (status 0). A FormData
   * body goes as multipart (the browser writes its Content-Type), anything else as JSON. */
  async raw(method, path, body) {
    const headers = { Authorization: `Bearer ${this.token}` };
    const form = typeof FormData !== "undefined" && body instanceof FormData;
    if (body !== undefined && !form) headers["Content-Type"] = "application/json";
    try {
      return await fetch(path, { method, headers, body: body === undefined ? undefined : form ? body : JSON.stringify(body), cache: "no-store" });
    } catch (err) {
      throw new ApiError(0, "network", `the server did not answer (${err.message})`);
    }
  }

  async call(method, path, body) {
    const r = await this.raw(method, path, body);
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = { detail: text }; }
    if (!r.ok) {
      if (r.status === 401) this.onUnauthorized?.();
      throw new ApiError(r.status, data?.error || `http_${r.status}`, data?.detail || r.statusText);
    }
    return data;
  }

  s(sid, rest = "") { return `/v1/sessions/${encodeURIComponent(sid)}${rest}`; }
  models() { return this.call("GET", "/v1/models"); }
  sessions() { return this.call("GET", "/v1/sessions"); }
  runs(state) { return this.call("GET", `/v1/runs${state ? `?state=${encodeURIComponent(state)}` : ""}`); }
  create(body) { return this.call("POST", "/v1/sessions", body); }
  session(sid) { return this.call("GET", this.s(sid)); }
  patch(sid, body) { return this.call("PATCH", this.s(sid), body); }
  send(sid, text, mode, client_id = clientId(), attachments = []) {
    const body = mode ? { text, mode, client_id } : { text, client_id };
    if (attachments.length) body.attachments = attachments;
    return this.call("POST", this.s(sid, "/messages"), body);
  }
  lead(sid, text, client_id = clientId(), attachments = []) {
    // A Lead carries text only: with attachments the server answers 409 lead_text_only, and says so.
    return this.call("POST", this.s(sid, "/lead"), attachments.length ? { text, client_id, attachments } : { text, client_id });
  }
  stop(sid, programs = false) { return this.call("POST", this.s(sid, "/stop"), programs ? { programs: true } : undefined); }
  stopProgram(sid, pid) { return this.call("POST", this.s(sid, `/programs/${encodeURIComponent(pid)}/stop`)); }
  /** Upload one file (multipart, the field `file`): {attachment_id, name, media_type, size}. */
  upload(sid, file, name = file.name) {
    const form = new FormData();
    form.append("file", file, name);
    return this.call("POST", this.s(sid, "/attachments"), form);
  }
  /** An attachment's bytes as a Blob, fetched with the token (never a URL holding it). */
  async attachment(sid, aid) {
    const r = await this.raw("GET", this.s(sid, `/attachments/${encodeURIComponent(aid)}`));
    if (!r.ok) {
      if (r.status === 401) this.onUnauthorized?.();
      let data = null;
      try { data = await r.json(); } catch { /* not JSON */ }
      throw new ApiError(r.status, data?.error || `http_${r.status}`, data?.detail || r.statusText);
    }
    return r.blob();
  }
  answer(sid, aid, body) { return this.call("POST", this.s(sid, `/approvals/${encodeURIComponent(aid)}`), body); }
  changes(sid) { return this.call("GET", this.s(sid, "/changes")); }
  versions(sid, path) { return this.call("GET", this.s(sid, `/versions?path=${encodeURIComponent(path)}`)); }
  diff(sid, vid) { return this.call("GET", this.s(sid, `/versions/${encodeURIComponent(vid)}/diff`)); }
  restore(sid, vid) { return this.call("POST", this.s(sid, `/versions/${encodeURIComponent(vid)}/restore`)); }
  workspaces() { return this.call("GET", "/v1/workspaces"); }
  queueRemove(sid, mid) { return this.call("DELETE", this.s(sid, `/queue/${encodeURIComponent(mid)}`)); }
  queueOrder(sid, message_ids) { return this.call("PUT", this.s(sid, "/queue/order"), { message_ids }); }
  undoTarget(sid) { return this.call("GET", this.s(sid, "/undo")); }
  undo(sid) { return this.call("POST", this.s(sid, "/undo")); }
  events(sid, after, limit = 1000) {
    return this.call("GET", this.s(sid, `/events?format=json&after=${after}&limit=${limit}`));
  }
  eventsUrl(sid) { return this.s(sid, "/events"); }
  fork(sid, at_turn) { return this.call("POST", this.s(sid, "/fork"), { at_turn }); }
  rewind(sid, to_turn, scope) { return this.call("POST", this.s(sid, "/rewind"), { to_turn, scope }); }
}
