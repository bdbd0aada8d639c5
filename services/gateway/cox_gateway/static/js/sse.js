// Server-sent events over fetch(). EventSource cannot send an Authorization header, so the
// console reads the stream itself: fetch with the bearer token and Last-Event-ID, then parse the
// text/event-stream format (https://html.spec.whatwg.org/multipage/server-sent-events.html).

export async function* parseSSE(body, signal) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const onAbort = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", onAbort);
  let buf = "";
  let msg = { id: null, event: "message", data: [] };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      let nl;
      while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + (buf.startsWith("\r\n", nl) ? 2 : 1));
        if (line === "") {
          if (msg.data.length) yield { id: msg.id, event: msg.event, data: msg.data.join("\n") };
          msg = { id: null, event: "message", data: [] };
          continue;
        }
        if (line.startsWith(":")) continue; // a keep-alive comment
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? "" : line.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "data") msg.data.push(val);
        else if (field === "event") msg.event = val;
        else if (field === "id") msg.id = val;
      }
    }
  } finally {
    signal?.removeEventListener("abort", onAbort);
    reader.releaseLock?.();
  }
}

/** Follows one session's events: resumes after the last seq it handed on, reconnecting forever
 * (with a growing pause) until stop(). onEvent gets each event once, in seq order. */
export class EventStream {
  constructor({ url, token, after, onEvent, onStatus, onUnauthorized }) {
    Object.assign(this, { url, token, lastSeq: after, onEvent, onStatus, onUnauthorized });
    this.stopped = false;
    this.controller = null;
    this.connects = 0;
  }

  start() { this.loop(); return this; }

  stop() { this.stopped = true; this.controller?.abort(); }

  /** Drop the connection (as a network failure would); the loop reconnects. */
  drop() { this.controller?.abort(); }

  async loop() {
    let pause = 250;
    while (!this.stopped) {
      this.controller = new AbortController();
      const headers = { Authorization: `Bearer ${this.token}`, Accept: "text/event-stream" };
      if (this.lastSeq > 0) headers["Last-Event-ID"] = String(this.lastSeq);
      try {
        const r = await fetch(this.url, { headers, signal: this.controller.signal, cache: "no-store" });
        if (r.status === 401) { this.onUnauthorized?.(); return; }
        if (!r.ok || !r.body) throw new Error(`events answered ${r.status}`);
        this.connects += 1;
        this.onStatus?.("live", this.connects);
        pause = 250;
        for await (const m of parseSSE(r.body, this.controller.signal)) {
          if (this.stopped) return;
          let ev;
          try { ev = JSON.parse(m.data); } catch { continue; }
          if (typeof ev.seq !== "number" || ev.seq <= this.lastSeq) continue; // already seen
          if (ev.seq !== this.lastSeq + 1) break; // a gap: reconnect from the last seq we hold
          this.lastSeq = ev.seq;
          this.onEvent(ev);
        }
      } catch (err) {
        if (this.stopped) return;
      }
      this.controller.abort(); // a gap or an ended body: close this connection before the next
      if (this.stopped) return;
      this.onStatus?.("reconnecting", this.connects);
      await new Promise((res) => setTimeout(res, pause));
      pause = Math.min(pause * 2, 4000);
    }
  }
}
