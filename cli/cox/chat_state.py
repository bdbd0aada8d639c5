"""One session as the terminal chat sees it, built from the event log in seq order.

The same reading of the events as the web console's ``state.js``: the transcript, pending
approvals, what waits (queued and steering messages, Leads) with its fate, and the plan. No UI
here; the app redraws what :attr:`ChatModel.changed` names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coxswain.events import TURN_END, bad_outcome

Event = dict[str, Any]
FINAL = frozenset({"applied", "discarded", "unapplied", "removed"})


@dataclass
class Item:
    key: str
    kind: str  # user | assistant | agent | tool | note | fate | system
    text: str = ""
    via: str | None = None
    name: str | None = None
    args: Any = None
    status: str = ""
    detail: str | None = None
    output: str | None = None
    policy: list[str] = field(default_factory=list)
    answer: str | None = None
    streaming: bool = False
    turn_id: str | None = None
    approval: str | None = None
    cls: str = ""


@dataclass
class Waiting:
    id: str
    kind: str  # queue | steer | lead
    text: str
    fate: str  # queued | pending | applied | discarded | unapplied
    live: bool = True


class ChatModel:
    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.info: dict[str, Any] = {"id": sid, "busy": False, "title": None, "model": None, "dont_ask": False}
        self.items: list[Item] = []
        self.by_key: dict[str, Item] = {}
        self.tools: dict[str, Item] = {}
        self.approvals: dict[str, Event] = {}
        self.outbox: dict[str, Waiting] = {}
        self.local_texts: dict[str, str] = {}
        self.plan: dict[str, Any] | None = None
        self.last_seq = 0
        # the last_seq of the latest session object applied: its run counts every turn begun up to it
        self.object_seq = 0
        self.seen: list[int] = []
        self.replaying = True
        self.streaming: Item | None = None
        self.changed: set[str] = set()
        self._n = 0
        # The turn at a glance: start (server ms), tool calls, tokens and cost; session totals.
        self.turn: dict[str, Any] | None = None
        self.totals: dict[str, float] = {"turns": 0, "tools": 0, "tokens": 0, "cost": 0.0}

    def waiting_for(self) -> str | None:
        """What the running turn waits for: the model, a tool, an approval, a Lead boundary."""
        if self.turn is None or not self.info.get("busy"):
            return None
        if self.approvals:
            return "approval"
        if any(t.turn_id == self.turn["turn_id"] and t.status == "running" for t in self.tools.values()):
            lead = any(w.kind == "lead" and w.fate == "pending" for w in self.outbox.values())
            return "tool, then the Lead boundary" if lead else "tool"
        return "model"

    def older(self, ev: Event) -> bool:
        """The session object applied already holds what this event did to the session."""
        return int(ev.get("seq", 0)) <= self.object_seq

    def run_driving(self) -> dict[str, Any] | None:
        """The run driving this session, or None: a run that ended is a chat again (docs/api.md, Runs)."""
        run = self.info.get("run")
        return run if isinstance(run, dict) and run.get("state") == "running" else None

    def queued(self) -> list[Waiting]:
        """The messages a person may still move or remove, in the order they will run."""
        return [w for w in self.outbox.values() if w.fate == "queued" and w.kind == "queue"]

    # ------------------------------------------------------------------ building blocks
    def mark(self, *what: str) -> None:
        self.changed.update(what)

    def add(self, item: Item) -> Item:
        self.items.append(item)
        self.by_key[item.key] = item
        self.mark("item:" + item.key)
        return item

    def touch(self, item: Item) -> None:
        self.mark("item:" + item.key)

    def note(self, ev: Event, text: str, cls: str = "") -> Item:
        return self.add(Item(key=f"n{ev['seq']}", kind="note", text=text, cls=cls))

    def system(self, text: str, cls: str = "") -> Item:
        """A line of the client's own (a command's answer), not an event."""
        self._n += 1
        return self.add(Item(key=f"x{self._n}", kind="system", text=text, cls=cls))

    def tool(self, call_id: str, name: str | None = None, args: Any = None) -> Item:
        t = self.tools.get(call_id)
        if t is None:
            t = self.add(Item(key=f"t{call_id}", kind="tool", name=name, args=args, status="proposed"))
            self.tools[call_id] = t
        if name and not t.name:
            t.name = name
        if args is not None and t.args is None:
            t.args = args
        return t

    def end_streaming(self) -> None:
        if self.streaming is not None:
            self.streaming.streaming = False
            self.touch(self.streaming)
            self.streaming = None

    # ------------------------------------------------------------------ waiting messages
    def sent(self, id_: str, kind: str | None, text: str) -> None:
        self.local_texts[id_] = text
        w = self.outbox.get(id_)
        if w is not None:
            w.text = w.text or text
        elif kind:
            self.outbox[id_] = Waiting(id_, kind, text, "pending" if kind == "lead" else "queued")
        self.mark("outbox")

    def settle(self, id_: str, fate: str) -> Waiting | None:
        w = self.outbox.get(id_)
        if w is None:
            return None
        w.fate = fate
        if self.replaying:
            w.live = False
        self.mark("outbox")
        return w

    def waiting(self) -> list[Waiting]:
        return [w for w in self.outbox.values() if w.live]

    def clear_settled(self) -> None:
        for k in [k for k, w in self.outbox.items() if w.fate in FINAL]:
            del self.outbox[k]
        self.mark("outbox")

    def queued_count(self) -> int:
        return sum(1 for w in self.outbox.values() if w.fate == "queued")

    # ------------------------------------------------------------------ input
    def apply_session(self, s: Event) -> None:
        """The session object: the authoritative state of what is pending now. It may be newer
        than the backlog read before it: the events up to its ``last_seq`` that then arrive on
        the stream are already in its run's count (``older``)."""
        self.info.update(s)
        self.object_seq = max(self.object_seq, int(s.get("last_seq") or 0))
        for q in s.get("queue") or []:
            w = self.outbox.get(q["message_id"])
            if w is None:
                self.outbox[q["message_id"]] = Waiting(q["message_id"], q.get("mode", "queue"), q.get("text", ""), "queued")
            elif not w.text:
                w.text = q.get("text", "")
        for lead in s.get("leads") or []:
            w = self.outbox.get(lead["lead_id"])
            if w is None and lead.get("state") == "pending":
                self.outbox[lead["lead_id"]] = Waiting(lead["lead_id"], "lead", lead.get("text", ""), "pending")
            elif w is not None and not w.text:
                w.text = lead.get("text", "")
        pending = {a["approval_id"]: a for a in s.get("approvals") or []}
        for aid in list(self.approvals):
            if aid not in pending:
                del self.approvals[aid]
        for aid, a in pending.items():
            self.approvals[aid] = {**self.approvals.get(aid, {}), **a}
        if s.get("plan") and self.plan is None:
            self.plan = dict(s["plan"])
        self.mark("head", "approvals", "outbox", "plan")

    def apply(self, ev: Event) -> bool:
        seq = int(ev.get("seq", 0))
        if seq <= self.last_seq:
            return False
        self.last_seq = seq
        self.seen.append(seq)
        handler = HANDLERS.get(str(ev.get("type")))
        if handler is None:
            self.note(ev, str(ev.get("type")))
        else:
            handler(self, ev)
        self.mark("head")
        return True


# ---------------------------------------------------------------------- event handlers
def _created(m: ChatModel, ev: Event) -> None:
    m.info.update(workspace=ev.get("workspace"), model=ev.get("model"), title=ev.get("title") or m.info.get("title"))
    m.note(ev, f"Session created in {ev.get('workspace')} (model {ev.get('model')})")
    m.mark("head")


def _title(m: ChatModel, ev: Event) -> None:
    m.info.update(title=ev["title"], title_source=ev.get("source"))
    m.note(ev, f"Renamed “{ev['title']}”" if ev.get("source") == "manual" else f"Titled “{ev['title']}”")
    m.mark("head")


def _updated(m: ChatModel, ev: Event) -> None:
    changes = ev.get("changes") or {}
    m.info.update(changes)
    m.note(ev, "Settings: " + ", ".join(f"{k} = {v!r}" for k, v in changes.items()))
    m.mark("head")


def _user(m: ChatModel, ev: Event) -> None:
    m.end_streaming()
    files = ev.get("attachments") or []
    text = ev["text"] + ("\n[attached: " + ", ".join(f"{a.get('name')} ({a.get('media_type')}, {a.get('size')} bytes)"
                                                    for a in files) + "]" if files else "")
    m.add(Item(key=f"u{ev['seq']}", kind="user", text=text, via=ev.get("via")))
    w = m.settle(ev["message_id"], "applied")
    if w is not None and not w.text:
        w.text = ev["text"]


def _queue_added(m: ChatModel, ev: Event) -> None:
    mid = ev["message_id"]
    w = m.outbox.get(mid)
    text = ev.get("text") or m.local_texts.get(mid, "")  # the log carries it (older logs did not)
    if w is None:
        m.outbox[mid] = Waiting(mid, ev.get("mode") or "queue", text, "queued")
    else:
        w.kind = ev.get("mode") or w.kind
        w.text = w.text or text
    if not m.outbox[mid].text:
        m.mark("need-session")
    m.mark("outbox", "head")


def _discarded(m: ChatModel, ev: Event) -> None:
    texts = []
    for mid in ev.get("message_ids") or []:
        w = m.settle(mid, "discarded")
        texts.append(w.text if w and w.text else mid)
    if texts:
        m.add(Item(key=f"f{ev['seq']}", kind="fate",
                   text=f"Stop discarded {len(texts)} queued: " + ", ".join(f"“{t}”" for t in texts)))


def _queue_removed(m: ChatModel, ev: Event) -> None:
    w = m.settle(ev["message_id"], "removed")
    text = ev.get("text") or (w.text if w else "") or ev["message_id"]
    m.add(Item(key=f"f{ev['seq']}", kind="fate", text=f"Removed from the queue before it started: “{text}”"))


def _queue_reordered(m: ChatModel, ev: Event) -> None:
    moved = [m.outbox.pop(i) for i in ev.get("message_ids") or [] if i in m.outbox]
    for w in moved:
        m.outbox[w.id] = w
    m.note(ev, f"Queue reordered ({len(moved)} waiting)")
    m.mark("outbox")


def _run_start(m: ChatModel, ev: Event) -> None:
    if not m.older(ev):
        m.info["run"] = {"state": "running", "confirm": ev.get("confirm"), "unattended": bool(ev.get("unattended")),
                         "max_turns": ev.get("max_turns"), "turns": 0, "outcome": None}
    unattended = ", unattended" if ev.get("unattended") else ""
    m.note(ev, f"Run started: the program drives this session (confirm {ev.get('confirm')}{unattended}, "
               f"at most {ev.get('max_turns')} turns)")
    m.mark("head", "run")


def _run_end(m: ChatModel, ev: Event) -> None:
    if not m.older(ev):
        m.info["run"] = {**(m.info.get("run") or {}), "state": "ended", "outcome": ev.get("outcome"), "turns": ev.get("turns")}
    n = ev.get("turns")
    m.note(ev, f"Run ended: {ev.get('outcome')} after {n} turn{'' if n == 1 else 's'}. "
               "This is a chat now: a message goes on with the task.", "" if ev.get("outcome") == "completed" else "bad")
    m.mark("head", "run")


def _turn_start(m: ChatModel, ev: Event) -> None:
    run = m.run_driving()
    if run is not None and not m.older(ev):  # the server counts a run's turns as they begin
        run["turns"] = int(run.get("turns") or 0) + 1
    m.turn = {"turn_id": ev.get("turn_id"), "started": ev.get("ts", 0), "tools": 0, "tokens": 0, "cost": 0.0}
    m.totals["turns"] += 1
    m.info.update(busy=True, turn_id=ev.get("turn_id"), model=ev.get("model") or m.info.get("model"))
    m.plan = None
    m.note(ev, f"Turn started ({ev.get('model')})")
    m.mark("head", "plan")


def _turn_end(m: ChatModel, ev: Event) -> None:
    m.end_streaming()
    for t in m.tools.values():
        if t.turn_id == ev.get("turn_id") and t.status in ("proposed", "running", "waiting"):
            t.status, t.detail = "closed", ev.get("outcome")
            m.touch(t)
    # A queued message starts in the same transition: the session stays busy while one waits.
    busy = m.queued_count() > 0
    m.info.update(busy=busy, turn_id=m.info.get("turn_id") if busy else None)
    detail = f" — {ev['detail']}" if ev.get("detail") else ""
    if m.turn is not None and m.turn["turn_id"] == ev.get("turn_id"):
        m.turn["ended"] = ev.get("ts", 0)
    n = m.totals["turns"]  # turns are numbered as the API numbers them: /fork N, /rewind N
    m.note(ev, f"Turn ended: {ev.get('outcome')}{detail} · turn {n}", "bad" if bad_outcome(ev.get("outcome")) else "")
    m.mark("head")


def _delta(m: ChatModel, ev: Event) -> None:
    if m.streaming is None:
        m.streaming = m.add(Item(key=f"a{ev['seq']}", kind="assistant", streaming=True))
    m.streaming.text += ev.get("text", "")
    m.touch(m.streaming)


def _assistant(m: ChatModel, ev: Event) -> None:
    u = ev.get("usage") or {}
    n = int(u.get("input_tokens") or 0) + int(u.get("output_tokens") or 0)
    for tgt in (m.turn, m.totals):
        if tgt is not None:
            tgt["tokens"] += n
            tgt["cost"] += float(u.get("cost") or 0)
    item, m.streaming = m.streaming, None
    if item is not None:
        item.text, item.streaming = ev.get("text", ""), False
        m.touch(item)
    elif ev.get("text"):
        m.add(Item(key=f"a{ev['seq']}", kind="assistant", text=ev["text"]))
    if ev.get("finish_reason") == "length":
        m.note(ev, "The model hit its output limit: its tool calls were not run.", "bad")
    for c in ev.get("tool_calls") or []:
        m.tool(c["call_id"], c.get("name"), c.get("args")).turn_id = ev.get("turn_id")


def _tool_call(m: ChatModel, ev: Event) -> None:
    t = m.tool(ev["call_id"], ev.get("name"), ev.get("args"))
    t.turn_id, t.status = ev.get("turn_id"), "running"
    m.touch(t)
    if m.turn is not None and m.turn["turn_id"] == ev.get("turn_id"):
        m.turn["tools"] += 1
    m.totals["tools"] += 1


def _policy(m: ChatModel, ev: Event) -> None:
    t = m.tool(ev["call_id"])
    sec = " (security)" if ev.get("security") else ""
    t.policy.append(f"{ev.get('verdict')} by {ev.get('actor')}{sec}: {ev.get('reason')}")
    if ev.get("verdict") == "refuse":
        # A person's Deny is recorded again as a refusing decision by the person: "denied".
        t.status = "denied" if ev.get("actor") == "person" else "refused"
    m.touch(t)


def _approval_pending(m: ChatModel, ev: Event) -> None:
    m.approvals[ev["approval_id"]] = dict(ev)
    t = m.tool(ev["call_id"], ev.get("name"), ev.get("args"))
    t.status, t.approval = "waiting", ev["approval_id"]
    m.touch(t)
    m.mark("approvals")


def _approval_resolved(m: ChatModel, ev: Event) -> None:
    m.approvals.pop(ev["approval_id"], None)
    for t in m.tools.values():
        if t.approval == ev["approval_id"]:
            scope = f" ({ev['scope']})" if ev.get("scope") and ev.get("scope") != "once" else ""
            msg = f" — “{ev['message']}”" if ev.get("message") else ""
            why = f": {ev['reason']}" if ev.get("actor") != "person" and ev.get("reason") else ""
            t.answer = f"{'Allowed' if ev.get('decision') == 'allow' else 'Denied'} by {ev.get('actor')}{scope}{msg}{why}"
            ended = ev.get("actor") == "policy" and ev.get("reason") == "the turn ended"
            t.status = ("running" if ev.get("decision") == "allow" else "denied" if ev.get("actor") == "person"
                        else "closed" if ended else "refused")
            m.touch(t)
    m.mark("approvals")


def _tool_result(m: ChatModel, ev: Event) -> None:
    t = m.tool(ev["call_id"])
    if t.status not in ("denied", "refused"):
        t.status = "ok" if ev.get("ok") else "fail"
    t.output = ev.get("output")
    m.touch(t)


def _tool_skipped(m: ChatModel, ev: Event) -> None:
    t = m.tool(ev["call_id"])
    t.status, t.detail = "skipped", ev.get("reason")
    m.touch(t)


def _kept(m: ChatModel, ev: Event) -> None:
    how = "it did not exist" if ev.get("store") == "absent" else ev.get("store")
    m.note(ev, f"Kept the previous {ev.get('path')} ({how})")


def _written(m: ChatModel, ev: Event) -> None:
    via = f" by {ev['via']}" if ev.get("via") and ev.get("via") != "tool" else ""
    m.note(ev, f"Wrote {ev.get('path')}{via} +{ev.get('added')} −{ev.get('removed')}")


def _lead_saved(m: ChatModel, ev: Event) -> None:
    lid = ev["lead_id"]
    text = ev.get("text") or m.local_texts.get(lid, "")
    w = m.outbox.get(lid)
    if w is None:
        m.outbox[lid] = Waiting(lid, "lead", text, "pending")
    elif not w.text:
        w.text = text
    m.mark("outbox")


def _lead_applied(m: ChatModel, ev: Event) -> None:
    for lid in ev.get("lead_ids") or []:
        m.settle(lid, "applied")


def _lead_unapplied(m: ChatModel, ev: Event) -> None:
    texts = []
    for lid in ev.get("lead_ids") or []:
        w = m.settle(lid, "unapplied")
        texts.append(w.text if w and w.text else lid)
    m.add(Item(key=f"f{ev['seq']}", kind="fate",
               text="Saved but not applied (the turn stopped): " + ", ".join(f"“{t}”" for t in texts)))


def _agent(m: ChatModel, ev: Event) -> None:
    m.end_streaming()
    m.add(Item(key=f"g{ev['seq']}", kind="agent", text=ev.get("text", "")))


def _observed(m: ChatModel, ev: Event) -> None:
    m.add(Item(key=f"o{ev['seq']}", kind="tool", name="!" + str(ev.get("command")), status="ok", output=ev.get("output")))


def _plan_write(m: ChatModel, ev: Event) -> None:
    m.plan = {"steps": list(ev.get("steps") or []), "marks": []}
    m.mark("plan")


def _plan_step(m: ChatModel, ev: Event) -> None:
    if m.plan is not None and ev.get("step") not in m.plan["marks"]:
        m.plan["marks"].append(ev.get("step"))
    m.mark("plan")


def _plan_carried(m: ChatModel, ev: Event) -> None:
    m.plan = {"steps": list(ev.get("steps") or []), "marks": list(ev.get("marks") or []), "carried_from": ev.get("from_turn")}
    m.note(ev, f"Plan carried from the unfinished turn ({len(m.plan['marks'])}/{len(m.plan['steps'])} done)")
    m.mark("plan")


def _limit(m: ChatModel, ev: Event) -> None:
    kind = "Soft" if ev.get("type") == "limit.soft" else "Hard"
    m.note(ev, f"{kind} limit reached: {ev.get('limit')} = {ev.get('value')}", "bad")


def _rewound(m: ChatModel, ev: Event) -> None:
    what = {"conversation": "the conversation", "files": "the files",
            "both": "the conversation and the files"}.get(str(ev.get("scope")), str(ev.get("scope")))
    files = f" (put back: {', '.join(ev['restored_files'])})" if ev.get("restored_files") else ""
    sees = ("the model still sees the whole conversation" if ev.get("scope") == "files"
            else "the model sees the conversation up to there, then what follows")
    m.note(ev, f"── Rewound {what} to the end of turn {ev.get('to_turn')}{files}: {sees} ──")


def _forked(m: ChatModel, ev: Event) -> None:
    m.note(ev, f"── Forked from {ev.get('from_sid')} at its turn {ev.get('at_turn')}: the conversation above, and a "
               f"copy of {ev.get('workspace')} as it was then ──")
def _hook(m: ChatModel, ev: Event) -> None:
    """A hook's answer (docs/api.md, "Hooks"): a line, and on the call it was about."""
    bad = bool(ev.get("failed")) or ev.get("decision") in ("deny", "block", "error")
    on = f" on {ev.get('tool')}" if ev.get("tool") else ""
    failed = " (the hook failed)" if ev.get("failed") else ""
    why = f" — {ev.get('reason')}" if ev.get("reason") else ""
    m.note(ev, f"Hook {ev.get('hook_event')}{on}: {ev.get('decision')}{failed}{why} "
               f"({ev.get('source')} hook `{ev.get('command')}`, {ev.get('duration_ms')} ms)", "bad" if bad else "")
    if ev.get("tool_call_id") and ev.get("hook_event") == "PreToolUse":
        t = m.tool(str(ev["tool_call_id"]))
        t.policy.append(f"{ev.get('decision')} by a hook{' (failed)' if ev.get('failed') else ''}: "
                        f"{ev.get('reason') or 'no reason given'}")
        m.touch(t)
MCP_SAID = {"ready": "is ready", "failed": "failed to start", "exited": "exited; its tools are withdrawn",
            "idle": "starts with the next turn"}


def _mcp_server(m: ChatModel, ev: Event) -> None:
    """An MCP server changed state: the session's list follows; a failure is said in the transcript."""
    entry = {"name": ev.get("name"), "state": ev.get("state"), "tools": list(ev.get("tools") or []),
             "error": ev.get("error")}
    servers = [s for s in m.info.get("mcp_servers") or [] if s.get("name") != entry["name"]]
    m.info["mcp_servers"] = [*servers, entry]
    if entry["state"] != "ready" or not m.replaying:
        err = f": {entry['error']}" if entry["error"] else ""
        m.note(ev, f"MCP server {entry['name']} {MCP_SAID.get(str(entry['state']), entry['state'])}{err}",
               "" if entry["state"] == "ready" else "bad")
    m.mark("head")


def mcp_lines(servers: list[dict[str, Any]]) -> list[str]:
    """What ``/mcp`` says: each MCP server of the session, its state, its tools or its error."""
    if not servers:
        return ["No MCP tool servers are configured ([[mcp.servers]])."]
    out = ["MCP tool servers:"]
    for s in servers:
        line = f"  {s.get('name')}  {s.get('state')}"
        if s.get("tools"):
            line += "  " + ", ".join(s["tools"])
        if s.get("error"):
            line += f"  ({s['error']})"
        out.append(line)
    return out


def _program_started(m: ChatModel, ev: Event) -> None:
    """A program started: the session's list follows (``/programs``), and a line says so."""
    entry = {"program_id": ev.get("program_id"), "name": ev.get("name"), "command": ev.get("command"),
             "by": "model" if ev.get("call_id") else "person", "tail": ""}
    progs = [p for p in m.info.get("programs") or [] if p.get("program_id") != entry["program_id"]]
    m.info["programs"] = [*progs, entry]
    m.note(ev, f"Program {entry['name']} ({entry['program_id']}) started: {entry['command']}")
    m.mark("head")


def _program_ended(m: ChatModel, ev: Event) -> None:
    pid = ev.get("program_id")
    progs = m.info.get("programs") or []
    gone = next((p for p in progs if p.get("program_id") == pid), {"name": pid})
    m.info["programs"] = [p for p in progs if p.get("program_id") != pid]
    if ev.get("type") == "program.exited":
        m.note(ev, f"Program {gone.get('name')} ({pid}) exited with code {ev.get('code')}",
               "" if ev.get("code") == 0 else "bad")
    else:
        m.note(ev, f"Program {gone.get('name')} ({pid}) stopped ({PROGRAM_STOPPED.get(str(ev.get('by')), ev.get('by'))})")
    m.mark("head")


PROGRAM_STOPPED = {"model": "by the model", "person": "by you", "stop": "by Stop", "idle": "idle too long",
                   "archive": "the session was archived", "runner": "its runner stopped"}


def program_lines(programs: list[dict[str, Any]]) -> list[str]:
    """What ``/programs`` says: each running program, numbered for ``/kill N``, with its last line."""
    if not programs:
        return ["No programs are running in this session (the model's start_program, or !&command)."]
    out = ["Programs running (/kill N stops one):"]
    for i, p in enumerate(programs, 1):
        last = (str(p.get("tail") or "").rstrip().splitlines() or [""])[-1][:120]
        out.append(f"  {i}. {p.get('name')} ({p.get('program_id')}, by {p.get('by')}): {p.get('command')}"
                   + (f"\n     │ {last}" if last else ""))
    return out


HANDLERS: dict[str, Callable[[ChatModel, Event], None]] = {
    "session.created": _created, "title.set": _title, "session.updated": _updated, "user.msg": _user,
    "queue.added": _queue_added, "queue.discarded": _discarded, "queue.removed": _queue_removed,
    "queue.reordered": _queue_reordered, "turn.start": _turn_start, "run.start": _run_start, "run.end": _run_end,
    TURN_END: _turn_end, "assistant.delta": _delta, "assistant.msg": _assistant, "tool.call": _tool_call,
    "policy.decision": _policy, "approval.pending": _approval_pending, "approval.resolved": _approval_resolved,
    "tool.result": _tool_result, "tool.skipped": _tool_skipped, "version.kept": _kept, "file.written": _written,
    "lead.saved": _lead_saved, "lead.applied": _lead_applied, "lead.unapplied": _lead_unapplied,
    "agent.message": _agent, "observed": _observed, "plan.write": _plan_write, "plan.step": _plan_step,
    "plan.carried": _plan_carried, "limit.soft": _limit, "limit.hard": _limit,
    "session.rewound": _rewound, "session.forked": _forked,
    "hook.decision": _hook,
    "mcp.server": _mcp_server,
    "program.started": _program_started, "program.exited": _program_ended, "program.stopped": _program_ended,
}
