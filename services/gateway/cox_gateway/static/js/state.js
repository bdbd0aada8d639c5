// One session as the console sees it: the transcript, the pending approvals, what waits (queued
// messages, Leads) with its fate, and the plan — all built from the event log, in seq order.
// No DOM here: the view reads this model and redraws what `changed` names.

import { isBadOutcome, TURN_END } from "./contract.js";
import { RENDERING, SILENT } from "./rendering.js";

const FINAL = new Set(["applied", "discarded", "unapplied", "skipped", "removed"]);

export class SessionModel {
  constructor(sid) {
    this.sid = sid;
    this.info = { id: sid, busy: false, title: null, model: null, dont_ask: false };
    this.items = [];            // transcript, in order
    this.byKey = new Map();
    this.tools = new Map();     // call_id -> tool item
    this.approvals = new Map(); // approval_id -> pending approval
    this.outbox = new Map();    // message_id | lead_id -> {id, kind, text, fate, live}
    this.localTexts = new Map();// what this console sent itself, by message/lead id
    this.plan = null;
    this.programs = new Map();  // program_id -> {program_id, name, command, by, started, tail, state, code, stopped_by}
    this.lastSeq = 0;
    this.objectSeq = 0;         // last_seq of the latest session object: its run counts every turn begun up to it
    this.replaying = true;
    this.streaming = null;      // the assistant item receiving deltas
    this.seen = [];             // every seq applied, for the no-duplicate/no-gap check
    this.changed = new Set();
    // Turn status at a glance, from what the log carries today: the turn's start, its tool
    // calls, the usage of its model responses, and what it waits for now.
    this.turn = null;           // {turn_id, started, tools, input, output, cost, waiting}
    this.totals = { turns: 0, tools: 0, input: 0, output: 0, cost: 0 };
    this.turnNumbers = new Map();  // turn_id -> its number (from 1, in the order turns started)
    this.versions = [];         // version.kept in log order: {path, version_id, store, turn_id, seq, call_id}
    this.writes = [];           // file.written in log order: {path, added, removed, via, deleted, turn_id, seq, call_id}
    this.unrendered = 0;
    this.turnEnds = new Map();  // turn number -> seq of its turn.end (what a rewind to it keeps)
    this.turnText = new Map();  // turn_id -> the message that started it
    this.curSeq = 0;            // the seq of the event being applied: every item records it        // events of a type this console does not know (a newer server)
  }

  /** What the running turn waits for: "model", "tool", "approval" or "Lead boundary". */
  waitingFor() {
    const t = this.turn;
    if (!t || !this.info.busy) return null;
    if (this.approvals.size) return "approval";
    const running = [...this.tools.values()].some((x) => x.turn_id === t.turn_id && x.status === "running");
    if (running) return [...this.outbox.values()].some((o) => o.kind === "lead" && o.fate === "pending") ? "tool, then the Lead boundary" : "tool";
    return "model";
  }

  mark(...what) { for (const w of what) this.changed.add(w); }

  /** The session object applied already holds what this event did to the session. */
  older(ev) { return ev.seq <= this.objectSeq; }

  /** The run driving this session, or null: a run that ended is a chat again. */
  runDriving() { const r = this.info.run; return r && r.state === "running" ? r : null; }

  add(item) {
    item.key = item.key || `i${this.items.length}`;
    if (item.seq === undefined) item.seq = this.curSeq;
    this.items.push(item);
    this.byKey.set(item.key, item);
    this.mark("item:" + item.key);
    return item;
  }

  touch(item) { this.mark("item:" + item.key); }

  note(ev, text, cls = "") { return this.add({ kind: "note", text, cls, seq: ev.seq, key: `n${ev.seq}` }); }

  /** Apply the session object (GET): the authoritative state of what is pending now. */
  applySession(s) {
    // It may be newer than the backlog read before it: the events up to its last_seq that then
    // arrive on the stream are already in its run's count (older()).
    this.info = { ...this.info, ...s };
    this.objectSeq = Math.max(this.objectSeq, s.last_seq || 0);
    for (const q of s.queue || []) {
      const o = this.outbox.get(q.message_id);
      if (o) { if (!o.text) o.text = q.text; }
      else this.outbox.set(q.message_id, { id: q.message_id, kind: q.mode, text: q.text, fate: "queued", live: true });
    }
    for (const l of s.leads || []) {
      const o = this.outbox.get(l.lead_id);
      if (o) { if (!o.text) o.text = l.text; }
      else if (l.state === "pending") this.outbox.set(l.lead_id, { id: l.lead_id, kind: "lead", text: l.text, fate: "pending", live: true });
    }
    const pending = new Set((s.approvals || []).map((a) => a.approval_id));
    for (const a of s.approvals || []) this.approvals.set(a.approval_id, { ...this.approvals.get(a.approval_id), ...a });
    for (const id of [...this.approvals.keys()]) if (!pending.has(id)) this.approvals.delete(id);
    if (s.plan && !this.plan) this.plan = { ...s.plan };
    if (Array.isArray(s.programs) && this.replaying) {
      // On opening, the session object says what runs now (the backlog replayed forgets what
      // ended). Later its copies may be older than the live events, which alone then say which
      // programs run: a later session object only brings their output tails.
      const now = new Set(s.programs.map((p) => p.program_id));
      for (const [id, p] of this.programs) if (p.state === "running" && !now.has(id)) this.programs.delete(id);
      for (const p of s.programs) this.programs.set(p.program_id, { ...this.programs.get(p.program_id), ...p, state: "running" });
    } else this.programTails(s.programs);
    this.mark("head", "approvals", "outbox", "plan", "mcp", "programs");
  }

  /** The programs' output tails from a fresher session object (a poll while the inspector shows
   *  them); which programs run is the events' to say. */
  programTails(list) {
    for (const p of list || []) {
      const mine = this.programs.get(p.program_id);
      if (mine && mine.state === "running" && typeof p.tail === "string" && p.tail !== mine.tail) { mine.tail = p.tail; this.mark("programs"); }
    }
  }

  runningPrograms() { return [...this.programs.values()].filter((p) => p.state === "running"); }

  /** A program ended: shown as such in the inspector (live), or forgotten (the backlog). */
  programEnded(ev, state) {
    const p = this.programs.get(ev.program_id);
    if (!p) return null;
    if (this.replaying) { this.programs.delete(ev.program_id); return p; }
    Object.assign(p, { state, code: ev.code ?? null, stopped_by: ev.by || null, ended: ev.ts });
    // Keep the few that ended most recently in view, not every program of a long session.
    const ended = [...this.programs.values()].filter((x) => x.state !== "running");
    for (const x of ended.slice(0, Math.max(0, ended.length - 5))) this.programs.delete(x.program_id);
    this.mark("programs", "head");
    return p;
  }

  /** What the person sent from here: shown as waiting until the server's events settle it. */
  sent(id, kind, text) {
    this.localTexts.set(id, text);
    const o = this.outbox.get(id);
    if (o) { o.text = o.text || text; }
    else if (kind) this.outbox.set(id, { id, kind, text, fate: kind === "lead" ? "pending" : "queued", live: true });
    this.mark("outbox");
  }

  settle(id, fate) {
    const o = this.outbox.get(id);
    if (!o) return null;
    o.fate = fate;
    if (this.replaying) o.live = false; // settled before this page opened: the transcript tells it
    this.mark("outbox");
    return o;
  }

  clearSettled() {
    for (const [id, o] of this.outbox) if (FINAL.has(o.fate)) this.outbox.delete(id);
    this.mark("outbox");
  }

  waiting() { return [...this.outbox.values()].filter((o) => o.live); }

  queuedCount() { return [...this.outbox.values()].filter((o) => o.fate === "queued").length; }

  apply(ev) {
    if (ev.seq <= this.lastSeq) return false;
    this.lastSeq = ev.seq;
    this.curSeq = ev.seq;
    this.seen.push(ev.seq);
    const fn = HANDLERS[ev.type];
    if (fn) fn(this, ev);
    else if (!SILENT.has(ev.type)) this.unrendered += 1; // shown as nothing rather than by its name
    this.mark("head"); // the turn status (what it waits for, counts) follows every event
    return true;
  }

  endStreaming() {
    if (this.streaming) { this.streaming.streaming = false; this.touch(this.streaming); this.streaming = null; }
  }

  /** What a rewind to the end of turn ``n`` would change: the files this session wrote since
   *  (put back, or deleted when created since) and the turns that would leave the model's view. */
  rewindPreview(n) {
    const end = this.turnEnds.get(n) ?? 0;
    const files = new Map();
    for (const w of this.writes) if (w.seq > end && !files.has(w.path)) files.set(w.path, { path: w.path, created: w.created });
    const turns = [];
    for (const [turnId, k] of this.turnNumbers) if (k > n) turns.push({ n: k, turnId, text: this.turnText.get(turnId) || "" });
    return { files: [...files.values()], turns };
  }

  /** The call that is running now in this event's turn (a write or a command it made is its). */
  runningTool(turn_id) {
    let found = null;
    for (const t of this.tools.values()) if (t.status === "running" && t.turn_id === turn_id && turn_id) found = t;
    return found;
  }

  tool(call_id, name, args) {
    let t = this.tools.get(call_id);
    if (!t) {
      t = this.add({ kind: "tool", key: `t${call_id}`, call_id, name, args, status: "proposed" });
      this.tools.set(call_id, t);
    }
    if (name && !t.name) t.name = name;
    if (args !== undefined && t.args === undefined) t.args = args;
    return t;
  }
}

/** Created, deleted or changed: what a write did to its file, said as such. */
export function writeVerb(w) { return w.deleted ? "Deleted" : w.created ? "Created" : "Changed"; }

const MCP_SAID = { ready: "is ready", failed: "failed to start", exited: "exited; its tools are withdrawn" };

const HANDLERS = {
  "mcp.server"(m, ev) {
    const list = [...(m.info.mcp_servers || [])];
    const entry = { name: ev.name, state: ev.state, tools: ev.tools || [], error: ev.error ?? null };
    const i = list.findIndex((s) => s.name === ev.name);
    if (i >= 0) list[i] = entry; else list.push(entry);
    m.info.mcp_servers = list;
    if (ev.state !== "ready" || !m.replaying) {
      m.note(ev, `MCP server ${ev.name} ${MCP_SAID[ev.state] || ev.state}${ev.error ? `: ${ev.error}` : ""}`,
        ev.state === "ready" ? "small" : "bad");
    }
    m.mark("mcp");
  },
  "session.created"(m, ev) {
    m.info = { ...m.info, workspace: ev.workspace, model: ev.model, title: ev.title ?? m.info.title };
    m.note(ev, `Session created in ${ev.workspace} (model ${ev.model ?? "none"})`);
    m.mark("head");
  },
  "title.set"(m, ev) {
    m.info.title = ev.title; m.info.title_source = ev.source;
    m.note(ev, ev.source === "manual" ? `Renamed “${ev.title}”` : `Titled “${ev.title}”`);
    m.mark("head", "sessions");
  },
  "session.updated"(m, ev) {
    Object.assign(m.info, ev.changes || {});
    const parts = Object.entries(ev.changes || {}).map(([k, v]) => `${k} = ${JSON.stringify(v)}`);
    m.note(ev, `Settings: ${parts.join(", ")}`);
    m.mark("head");
  },
  "user.msg"(m, ev) {
    m.endStreaming();
    if (ev.turn_id && !m.turnText.has(ev.turn_id)) m.turnText.set(ev.turn_id, ev.text);
    m.add({ kind: "user", key: `u${ev.seq}`, text: ev.text, via: ev.via, id: ev.message_id, attachments: ev.attachments || [] });
    const o = m.settle(ev.message_id, "applied");
    if (o && !o.text) o.text = ev.text;
  },
  "queue.added"(m, ev) {
    // The log carries the text (older logs did not: then only the tab that sent it knew it).
    const text = ev.text || m.localTexts.get(ev.message_id) || "";
    const o = m.outbox.get(ev.message_id);
    if (o) { o.kind = ev.mode || o.kind; o.text = o.text || text; }
    else m.outbox.set(ev.message_id, { id: ev.message_id, kind: ev.mode || "queue", text, fate: "queued", live: true });
    m.mark("outbox", "head");
    if (!text && !o?.text) m.mark("need-session");
  },
  "queue.discarded"(m, ev) {
    const texts = [];
    for (const id of ev.message_ids || []) {
      const o = m.settle(id, "discarded");
      texts.push(o?.text || id);
    }
    if (texts.length) m.add({ kind: "fate", key: `f${ev.seq}`, text: `Stop discarded ${texts.length} queued: ${texts.map((t) => `“${t}”`).join(", ")}` });
    m.mark("head");
  },
  "queue.removed"(m, ev) {
    m.reorders = (m.reorders || 0) + 1;
    const o = m.settle(ev.message_id, "removed");
    const text = ev.text || o?.text || m.localTexts.get(ev.message_id) || ev.message_id;
    m.add({ kind: "fate", key: `f${ev.seq}`, text: `Removed from the queue before it started: “${text}”` });
    m.mark("head", "outbox");
  },
  "queue.reordered"(m, ev) {
    // Re-insert the waiting entries in the new order (a Map keeps insertion order).
    const order = ev.message_ids || [];
    const moved = order.map((id) => m.outbox.get(id)).filter(Boolean);
    for (const o of moved) m.outbox.delete(o.id);
    for (const o of moved) m.outbox.set(o.id, o);
    m.note(ev, `Queue reordered (${order.length} waiting)`, "small");
    m.reorders = (m.reorders || 0) + 1; // a "Queued (position n)" said before is stale now
    m.mark("outbox");
  },
  "run.start"(m, ev) {
    if (!m.older(ev)) m.info.run = { state: "running", confirm: ev.confirm, unattended: !!ev.unattended, max_turns: ev.max_turns, turns: 0, outcome: null };
    m.note(ev, `Run started: the program drives this session (confirm ${ev.confirm}${ev.unattended ? ", unattended" : ""}, at most ${ev.max_turns} turns)`, "run-start");
    m.mark("head", "sessions");
  },
  "run.end"(m, ev) {
    if (!m.older(ev)) m.info.run = { ...(m.info.run || {}), state: "ended", outcome: ev.outcome, turns: ev.turns };
    m.note(ev, `Run ended: ${ev.outcome} after ${ev.turns} turn${ev.turns === 1 ? "" : "s"}. This is a chat now: a message goes on with the task.`,
      "run-end" + (ev.outcome === "completed" ? "" : " bad"));
    m.mark("head", "sessions");
  },
  "turn.start"(m, ev) {
    const run = m.runDriving();
    if (run && !m.older(ev)) { run.turns = (run.turns || 0) + 1; m.mark("sessions"); }
    m.info.busy = true; m.info.turn_id = ev.turn_id; m.info.model = ev.model || m.info.model;
    m.plan = null;
    m.turn = { turn_id: ev.turn_id, started: ev.ts, tools: 0, input: 0, output: 0, cost: 0 };
    m.totals.turns += 1;
    m.turnNumbers.set(ev.turn_id, m.turnNumbers.size + 1);  // numbered as the API numbers turns
    m.note(ev, `Turn started (${ev.model})`, "turn-start");
    m.mark("head", "plan");
  },
  [TURN_END](m, ev) {
    m.endStreaming();
    for (const t of m.tools.values()) {
      if (t.turn_id === ev.turn_id && (t.status === "proposed" || t.status === "running" || t.status === "waiting")) {
        t.status = "closed"; t.detail = ev.outcome; m.touch(t);
      }
    }
    // A queued message starts in the same transition, so the session stays busy while one waits.
    m.info.busy = m.queuedCount() > 0;
    m.info.turn_id = m.info.busy ? m.info.turn_id : null;
    const bad = isBadOutcome(ev.outcome);
    if (m.turn && m.turn.turn_id === ev.turn_id) { m.turn.ended = ev.ts; m.turn.outcome = ev.outcome; }
    const end = m.note(ev, `Turn ended: ${ev.outcome}${ev.detail ? ` — ${ev.detail}` : ""}`, "turn-end" + (bad ? ` bad outcome-${ev.outcome}` : ""));
    end.turnNo = m.turnNumbers.get(ev.turn_id);  // the turn's number: what Fork and Rewind name
    end.turnId = ev.turn_id;
    if (end.turnNo) m.turnEnds.set(end.turnNo, ev.seq);
    m.mark("head", "sessions", "changes");
  },
  "assistant.delta"(m, ev) {
    if (m.turn?.retry) { m.turn.retry = null; m.mark("head"); }
    if (!m.streaming) m.streaming = m.add({ kind: "assistant", key: `a${ev.seq}`, text: "", streaming: true });
    m.streaming.text += ev.text; m.touch(m.streaming);
  },
  "assistant.msg"(m, ev) {
    if (m.turn) m.turn.retry = null;
    const u = ev.usage || {};
    for (const tgt of [m.turn, m.totals]) {
      if (!tgt) continue;
      tgt.input += u.input_tokens || 0; tgt.output += u.output_tokens || 0; tgt.cost += u.cost || 0;
    }
    m.mark("head");
    const item = m.streaming;
    m.streaming = null;
    if (item) {
      item.text = ev.text; item.streaming = false; item.finish = ev.finish_reason; m.touch(item);
    } else if (ev.text) {
      m.add({ kind: "assistant", key: `a${ev.seq}`, text: ev.text, finish: ev.finish_reason });
    }
    if (ev.finish_reason === "length") m.note(ev, "The model hit its output limit: its tool calls were not run.", "bad");
    for (const c of ev.tool_calls || []) { const t = m.tool(c.call_id, c.name, c.args); t.turn_id = ev.turn_id; }
  },
  "tool.call"(m, ev) {
    const t = m.tool(ev.call_id, ev.name, ev.args);
    t.turn_id = ev.turn_id; t.status = "running"; m.touch(t);
    if (m.turn && m.turn.turn_id === ev.turn_id) m.turn.tools += 1;
    m.totals.tools += 1;
    m.mark("head");
  },
  "policy.decision"(m, ev) {
    const t = m.tool(ev.call_id);
    if (ev.preview && !t.preview) t.preview = ev.preview; // the write's diff, computed before it ran
    t.policy = t.policy || [];
    t.policy.push(`${ev.verdict} by ${ev.actor}${ev.security ? " (security)" : ""}: ${ev.reason}`);
    // A refusal the person gave (their Deny, recorded again as the call's decision) is "denied".
    if (ev.verdict === "refuse") {
      if (ev.actor === "person") { t.status = "denied"; t.detail = null; }
      else if (t.status !== "closed") { t.status = "refused"; t.detail = `by ${ev.actor}`; }
    }
    m.touch(t);
  },
  "approval.pending"(m, ev) {
    m.approvals.set(ev.approval_id, { ...ev });
    const t = m.tool(ev.call_id, ev.name, ev.args);
    t.status = "waiting"; t.approval = ev.approval_id; m.touch(t);
    m.mark("approvals");
  },
  "approval.resolved"(m, ev) {
    m.approvals.delete(ev.approval_id);
    for (const t of m.tools.values()) {
      if (t.approval === ev.approval_id) {
        t.message = ev.message || null;
        t.answer = `${ev.decision === "allow" ? "Allowed" : "Denied"} by ${ev.actor}` +
          (ev.scope && ev.scope !== "once" ? ` (${ev.scope})` : "") + (ev.message ? ` — “${ev.message}”` : "") +
          (ev.actor !== "person" && ev.reason ? `: ${ev.reason}` : "");
        // Three different things: a person's Deny, a refusal by policy/judge/setting, a failure.
        const ended = ev.actor === "policy" && ev.reason === "the turn ended";
        t.status = ev.decision === "allow" ? "running" : ev.actor === "person" ? "denied" : ended ? "closed" : "refused";
        if (t.status === "refused") t.detail = `by ${ev.actor}`;
        if (ended) t.detail = "the turn ended";
        m.touch(t);
      }
    }
    m.mark("approvals");
  },
  "tool.result"(m, ev) {
    const t = m.tool(ev.call_id);
    if (t.status !== "denied" && t.status !== "refused") t.status = ev.ok ? "ok" : "fail";
    t.output = ev.output; m.touch(t);
  },
  "tool.skipped"(m, ev) {
    const t = m.tool(ev.call_id);
    t.status = "skipped"; t.detail = ev.reason; m.touch(t);
  },
  "version.kept"(m, ev) {
    // No line of its own: the call that wrote (or the restore/undo/rewind line) shows the change,
    // and Review reads these to diff each file from before the session or the turn.
    const t = m.runningTool(ev.turn_id);
    m.versions.push({ path: ev.path, version_id: ev.version_id, store: ev.store, turn_id: ev.turn_id || null, seq: ev.seq, call_id: t?.call_id || null });
    if (t) { (t.kept = t.kept || {})[ev.path] = { version_id: ev.version_id, store: ev.store }; }
    m.pendingKept = { path: ev.path, version_id: ev.version_id, store: ev.store };
    m.mark("review");
  },
  "file.written"(m, ev) {
    const via = ev.via || "tool";
    const t = via === "tool" || via === "command" ? m.runningTool(ev.turn_id) : null;
    const kept = m.pendingKept && m.pendingKept.path === ev.path ? m.pendingKept : null;
    m.pendingKept = null;
    const w = { path: ev.path, added: ev.added, removed: ev.removed, via, deleted: !!ev.deleted,
      created: kept?.store === "absent", version_id: kept?.version_id || null, turn_id: ev.turn_id || null, seq: ev.seq, call_id: t?.call_id || null };
    m.writes.push(w);
    if (t) { t.files = t.files || []; t.files.push(w); m.touch(t); }
    else m.note(ev, `${writeVerb(w)} ${ev.path}${via !== "tool" ? ` by ${via}` : ""}${w.deleted ? "" : ` +${ev.added} −${ev.removed}`}`, "written");
    m.mark("changes", "history", "review");
  },
  "usage"(m, ev) {
    // The turn's own model requests are already counted from assistant.msg; a judge's, a
    // title's or a compaction's are added here, so the status line holds the turn's whole cost.
    if (ev.purpose === "turn") return;
    const tgts = [m.totals];
    if (m.turn && (!ev.turn_id || ev.turn_id === m.turn.turn_id)) tgts.push(m.turn);
    for (const tgt of tgts) {
      tgt.input += ev.input_tokens || 0; tgt.output += ev.output_tokens || 0; tgt.cost += ev.cost || 0;
      tgt.extra = tgt.extra || {};
      tgt.extra[ev.purpose] = (tgt.extra[ev.purpose] || 0) + (ev.input_tokens || 0) + (ev.output_tokens || 0);
    }
    m.mark("head");
  },
  "model.retry"(m, ev) {
    if (m.turn && m.turn.turn_id === ev.turn_id) m.turn.retry = { attempt: ev.attempt, delay_s: ev.delay_s, error: ev.error };
    m.mark("head");
  },
  "network.request"(m, ev) {
    const line = `network: ${ev.host}:${ev.port} ${ev.allowed ? "allowed" : "refused"}${ev.reason ? ` (${ev.reason})` : ""}`;
    const t = ev.call_id ? m.tools.get(ev.call_id) : null;
    if (t) { t.policy = t.policy || []; t.policy.push(line); m.touch(t); }
    else m.note(ev, ev.server ? `MCP server ${ev.server}: ${line}` : line, ev.allowed ? "small" : "bad");
  },
  "check"(m, ev) {
    const ok = ev.exit_code === 0;
    m.note(ev, `Check \`${ev.command}\`: ${ok ? "passed" : ev.exit_code === null || ev.exit_code === undefined ? "did not finish" : `failed (exit ${ev.exit_code})`}`, ok ? "small" : "bad");
  },
  "context.compacted"(m, ev) {
    m.note(ev, ev.summary
      ? `Context compacted for the model: ${ev.before_tokens} → ${ev.after_tokens} tokens (${ev.dropped} events summarised; the log keeps everything)`
      : "Context compaction failed: the model still gets the whole transcript", ev.summary ? "small" : "bad");
  },
  "event.omitted"(m, ev) {
    m.note(ev, `An event too large to show was left out (${ev.original_type}, ${ev.bytes} bytes)`, "small");
  },
  "limit.warning"(m, ev) { m.note(ev, `Nearing a limit: ${ev.limit} at ${ev.value} of ${ev.of}`, "small"); },
  "lead.saved"(m, ev) {
    const text = ev.text || m.localTexts.get(ev.lead_id) || "";
    const o = m.outbox.get(ev.lead_id);
    if (o) { o.text = o.text || text; }
    else m.outbox.set(ev.lead_id, { id: ev.lead_id, kind: "lead", text, fate: "pending", live: true });
    m.mark("outbox");
  },
  "lead.applied"(m, ev) { for (const id of ev.lead_ids || []) m.settle(id, "applied"); },
  "lead.unapplied"(m, ev) {
    const texts = (ev.lead_ids || []).map((id) => m.settle(id, "unapplied")?.text || id);
    m.add({ kind: "fate", key: `f${ev.seq}`, text: `Saved but not applied (the turn stopped): ${texts.map((t) => `“${t}”`).join(", ")}` });
  },
  "session.rewound"(m, ev) {
    const what = { conversation: "the conversation", files: "the files", both: "the conversation and the files" }[ev.scope] || ev.scope;
    const files = ev.restored_files?.length ? ` (put back: ${ev.restored_files.join(", ")})` : "";
    // What the rewind took out of the model's view stays in the transcript, dimmed and marked.
    if (ev.scope !== "files") {
      for (const it of m.items) {
        if (it.seq > ev.through_seq && it.seq < ev.seq && !it.rewound) { it.rewound = ev.to_turn; m.touch(it); }
      }
    }
    m.note(ev, `Rewound ${what} to the end of turn ${ev.to_turn}${files}. ` +
      (ev.scope === "files" ? "The model still sees the whole conversation." : "The model sees the conversation up to there, then what follows."), "rewound");
    m.mark("changes");
  },
  "program.started"(m, ev) {
    m.programs.set(ev.program_id, { ...m.programs.get(ev.program_id), program_id: ev.program_id, name: ev.name, command: ev.command,
      network: ev.network, pty: ev.pty, by: ev.call_id ? "model" : "person", started: ev.ts, tail: "", state: "running" });
    m.note(ev, `Program ${ev.name || ev.program_id} started: \`${ev.command}\``, "small");
    m.mark("programs");
  },
  "program.exited"(m, ev) {
    const p = m.programEnded(ev, "exited");
    m.note(ev, `Program ${p?.name || ev.program_id} exited${ev.code === null || ev.code === undefined ? "" : ` (code ${ev.code})`}`, ev.code ? "bad" : "small");
  },
  "program.stopped"(m, ev) {
    const p = m.programEnded(ev, "stopped");
    m.note(ev, `Program ${p?.name || ev.program_id} stopped (by ${ev.by})`, "small");
  },
  "session.shared"(m, ev) {
    m.note(ev, ev.role === "approver"
      ? `Shared with ${ev.principal} as an approver: they see it, answer its approvals and may Stop it`
      : `Shared with ${ev.principal} as a reader: they see it and change nothing`, "small");
  },
  "session.unshared"(m, ev) { m.note(ev, `No longer shared with ${ev.principal}`, "small"); },
  "attachment.withheld"(m, ev) {
    m.note(ev, `The model was not given ${ev.name || ev.attachment_id}${ev.reason ? `: ${ev.reason}` : ""}`, "bad");
  },
  "session.forked"(m, ev) {
    m.note(ev, `Forked from ${ev.from_sid} at its turn ${ev.at_turn}: the conversation above, and a copy of ${ev.workspace} as it was then.`, "forked");
  },
  "agent.message"(m, ev) { m.endStreaming(); m.add({ kind: "agent", key: `g${ev.seq}`, text: ev.text }); },
  "observed"(m, ev) { m.add({ kind: "tool", key: `o${ev.seq}`, name: "!" + ev.command, status: "ok", output: ev.output, observed: true }); },
  "plan.write"(m, ev) { m.plan = { steps: ev.steps, marks: [], turn_id: ev.turn_id }; m.mark("plan"); },
  "plan.step"(m, ev) {
    if (m.plan && !m.plan.marks.includes(ev.step)) m.plan.marks.push(ev.step);
    const t = m.runningTool(ev.turn_id);
    if (t && t.name === "plan_step") { t.stepText = m.plan?.steps?.[ev.step - 1] || null; m.touch(t); }
    m.mark("plan");
  },
  "plan.carried"(m, ev) {
    m.plan = { steps: ev.steps, marks: [...(ev.marks || [])], carried_from: ev.from_turn, turn_id: ev.turn_id };
    m.note(ev, `Plan carried from the unfinished turn (${(ev.marks || []).length}/${ev.steps.length} done)`);
    m.mark("plan");
  },
  "limit.soft"(m, ev) { m.note(ev, `Soft limit reached: ${ev.limit} = ${ev.value}`, "bad"); },
  "limit.hard"(m, ev) { m.note(ev, `Hard limit reached: ${ev.limit} = ${ev.value}`, "bad"); },
  "budget.reached"(m, ev) {
    const waiting = ev.waiting ? `; ${ev.waiting} waiting message(s) kept` : "";
    m.note(ev, `Paused: the daily ${ev.budget.replace("_", " ")} budget of $${ev.limit} is reached ($${ev.spent} spent today)${waiting}`, "bad");
  },
  "budget.resumed"(m, ev) {
    const why = { patch: "an admin raised its budget", reload: "the budgets were raised", day: "a new day" }[ev.by] || ev.by;
    m.note(ev, `Going on: ${why}${ev.waiting ? `; ${ev.waiting} waiting message(s) run in order` : ""}`, "small");
  },
  "hook.decision"(m, ev) {
    // A hook's answer (docs/api.md, "Hooks"): a line in the transcript, and on the call it was about.
    const bad = ev.failed || ["deny", "block", "error"].includes(ev.decision);
    const why = ev.reason ? ` — ${ev.reason}` : "";
    m.note(ev, `Hook ${ev.hook_event}${ev.tool ? ` on ${ev.tool}` : ""}: ${ev.decision}${ev.failed ? " (the hook failed)" : ""}` +
      `${why} (${ev.source} hook \`${ev.command}\`, ${ev.duration_ms} ms)`, bad ? "hook bad" : "hook small");
    if (ev.tool_call_id && ev.hook_event === "PreToolUse") {
      const t = m.tool(ev.tool_call_id);
      t.policy = t.policy || [];
      t.policy.push(`${ev.decision} by a hook${ev.failed ? " (failed)" : ""}: ${ev.reason || "no reason given"}`);
      m.touch(t);
    }
  },
};

// Every type the rendering table shows (not "none") has its handler here, and no handler is for
// a type the table does not name: the page refuses to load otherwise (a browser test sees it).
for (const t of Object.keys(RENDERING)) {
  if (!SILENT.has(t) && !HANDLERS[t]) throw new Error(`rendering.js names ${t} but state.js has no handler for it`);
}
for (const t of Object.keys(HANDLERS)) {
  if (!(t in RENDERING)) throw new Error(`state.js handles ${t}, which rendering.js does not name`);
}
