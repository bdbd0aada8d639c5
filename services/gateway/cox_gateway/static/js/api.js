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

  async call(method, path, body) {
    const headers = { Authorization: `Bearer ${this.token}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let r;
    try {
      r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store" });
    } catch (err) {
      throw new ApiError(0, "network", `the server did not answer (${err.message})`);
    }
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
  send(sid, text, mode, client_id = clientId()) {
    return this.call("POST", this.s(sid, "/messages"), mode ? { text, mode, client_id } : { text, client_id });
  }
  lead(sid, text, client_id = clientId()) { return this.call("POST", this.s(sid, "/lead"), { text, client_id }); }
  stop(sid) { return this.call("POST", this.s(sid, "/stop")); }
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
