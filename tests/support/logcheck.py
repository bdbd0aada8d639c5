"""Checks of one session's event log against the state-machine table (docs/design.md, "The session state machine").

The log is the record every client reads, so the FIFO, no-overlap and fencing tests judge the
system by it alone: they replay the queue events through the table and fail on the first event
the table does not allow. Pure functions, no I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .stack import Api

TURN_VIAS = frozenset({"send", "queue", "steer"})
# Events a turn's runner writes under its fencing token: each must belong to the running turn.
TURN_SCOPED = frozenset({
    "assistant.delta", "assistant.msg", "tool.call", "tool.result", "tool.skipped", "policy.decision",
    "approval.pending", "version.kept", "file.written", "agent.message", "plan.write", "plan.step",
    "plan.carried", "limit.soft", "limit.hard", "lead.applied", "title.set",
})


@dataclass
class Replay:
    """What the log says happened to one session."""

    starts: list[str] = field(default_factory=list)
    """message ids in turn.start order"""
    ends: dict[str, str] = field(default_factory=dict)
    """turn_id -> outcome"""
    turn_of: dict[str, str] = field(default_factory=dict)
    """message_id -> turn_id"""
    discarded: list[list[str]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    """message ids a person removed from the queue (``queue.removed``), in order"""
    queued: list[tuple[str, str, int]] = field(default_factory=list)
    """(message_id, mode, position) in acceptance order"""
    accepted: list[str] = field(default_factory=list)
    """every message the log shows accepted (user.msg of a started send, or queue.added), in order"""
    waiting: list[str] = field(default_factory=list)
    running: str | None = None
    closed_calls: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)

    def outcome_of(self, message_id: str) -> str | None:
        tid = self.turn_of.get(message_id)
        return self.ends.get(tid) if tid else None

    def discarded_ids(self) -> list[str]:
        return [m for batch in self.discarded for m in batch]


class LogError(AssertionError):
    pass


def replay(events: list[dict[str, Any]], *, settled: bool = True) -> Replay:
    """Replay one session's log through the table; raise :class:`LogError` on a violation.

    Checked: seq rises by one; a turn starts only when none runs and ends only the one that runs
    (never interleaved); the turn that starts is the head of the steered list, else of the queue,
    else a fresh send while nothing waits; queue positions; a discard names exactly what waited;
    every event a runner writes belongs to the running turn (a fenced-off runner wrote nothing);
    every tool call a response opened is closed (result or skipped) before its turn ends.
    ``settled``: the session is idle with nothing waiting at the end.
    """
    r = Replay(events=events)
    sq: list[str] = []
    q: list[str] = []
    running_turn: str | None = None
    open_calls: dict[str, str] = {}
    last_user: dict[str, Any] | None = None

    def fail(ev: dict[str, Any], why: str) -> LogError:
        return LogError(f"seq {ev.get('seq')} {ev.get('type')}: {why}\n{_context(events, ev)}")

    for i, ev in enumerate(events):
        t = ev["type"]
        if ev["seq"] != i + 1:
            raise fail(ev, f"seq {ev['seq']} where {i + 1} was due")
        if t in TURN_SCOPED and ev.get("turn_id") is not None and ev.get("turn_id") != running_turn:
            raise fail(ev, f"written for turn {ev.get('turn_id')} while {running_turn} runs (a stale writer?)")
        if t == "user.msg" and ev.get("via") in TURN_VIAS:
            last_user = ev
        elif t == "queue.added":
            mid, mode = ev["message_id"], ev.get("mode", "queue")
            (sq if mode == "steer" else q).append(mid)
            want = len(sq) if mode == "steer" else len(sq) + len(q)
            if ev["position"] != want:
                raise fail(ev, f"position {ev['position']}, the table gives {want}")
            r.queued.append((mid, mode, ev["position"]))
            r.accepted.append(mid)
        elif t == "queue.removed":
            mid = ev["message_id"]
            if mid not in q:
                raise fail(ev, f"removes {mid}, which is not in the queue {q}")
            q.remove(mid)
            r.removed.append(mid)
        elif t == "queue.reordered":
            if sorted(ev["message_ids"]) != sorted(q):
                raise fail(ev, f"reorders to {ev['message_ids']} but {q} are queued")
            q[:] = ev["message_ids"]
        elif t == "queue.discarded":
            if ev["message_ids"] != sq + q:
                raise fail(ev, f"discarded {ev['message_ids']} but {sq + q} waited")
            r.discarded.append(list(ev["message_ids"]))
            sq.clear()
            q.clear()
        elif t == "turn.start":
            if running_turn is not None:
                raise fail(ev, f"a turn starts while {running_turn} runs")
            mid = ev["message_id"]
            if last_user is None or last_user["message_id"] != mid:
                raise fail(ev, "no user.msg of this message just before its turn.start")
            if sq or q:
                head = (sq or q)[0]
                if mid != head:
                    raise fail(ev, f"started {mid} but the head of the waiting line is {head} ({sq} / {q})")
                want_via = "steer" if sq else "queue"
                (sq or q).pop(0)
                if last_user.get("via") != want_via:
                    raise fail(ev, f"via {last_user.get('via')}, expected {want_via}")
            else:
                if mid in r.accepted:
                    raise fail(ev, f"{mid} starts a second time or starts after it was discarded")
                r.accepted.append(mid)
            running_turn = ev["turn_id"]
            r.starts.append(mid)
            r.turn_of[mid] = running_turn
            last_user = None
        elif t == "turn.end":
            if running_turn is None or ev["turn_id"] != running_turn:
                raise fail(ev, f"ends {ev.get('turn_id')} while {running_turn} runs")
            dangling = sorted(c for c, tid in open_calls.items() if tid == running_turn)
            if dangling:
                raise fail(ev, f"the turn ends with tool calls never closed: {dangling}")
            r.ends[running_turn] = ev["outcome"]
            running_turn = None
        elif t == "assistant.msg":
            for call in ev.get("tool_calls") or []:
                open_calls[call["call_id"]] = ev["turn_id"]
        elif t in ("tool.result", "tool.skipped"):
            if open_calls.pop(ev["call_id"], None) is None:
                raise fail(ev, f"closes {ev['call_id']}, which is not open")
            r.closed_calls += 1
    r.running = running_turn
    r.waiting = sq + q
    if settled:
        if running_turn is not None:
            raise LogError(f"the log ends while turn {running_turn} runs")
        if sq or q:
            raise LogError(f"the log ends with messages waiting that never ran: {sq + q}")
    done = set(r.starts)
    gone = r.discarded_ids()
    twice = (done & set(gone)) | (done & set(r.removed)) | (set(gone) & set(r.removed))
    if twice:
        raise LogError(f"messages with two fates (run, discarded, removed): {sorted(twice)}")
    return r


def check_accepted(r: Replay, replies: list[dict[str, Any]]) -> None:
    """Every message answered 202 is in the log once, in the order it was answered, and either
    ran, was named by a discard or removed by a person (or still waits, when the replay was not
    ``settled``); the log holds no message nobody sent.

    ``replies``: the 202 bodies in the order the client got them (for one client sending one
    request at a time to this session), each with the request's ``mode`` added.
    """
    ids = [x["message_id"] for x in replies]
    if len(set(ids)) != len(ids):
        raise LogError("a message id was answered twice")
    if r.accepted != ids:
        raise LogError(f"acceptance order in the log {r.accepted} differs from the replies {ids}")
    ran, gone, waiting = set(r.starts), set(r.discarded_ids()) | set(r.removed), set(r.waiting)
    for x in replies:
        mid = x["message_id"]
        if mid not in ran and mid not in gone and mid not in waiting:
            raise LogError(f"{mid} ({x['disposition']}) was answered 202 but neither ran nor was discarded"
                           " or removed nor waits")
        if x["disposition"] in ("queued", "steered"):
            mode = "steer" if x["disposition"] == "steered" else "queue"
            entry = next((e for e in r.queued if e[0] == mid), None)
            if entry is None or entry[1] != mode or entry[2] != x.get("position"):
                raise LogError(f"{mid}: reply {x} but the log has {entry}")
        elif x["disposition"] == "started":
            if r.starts and mid not in ran:
                raise LogError(f"{mid} was answered started but has no turn.start")


def log_of(api: Api, sid: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The session's whole log, at least up to what was recorded when this was called.

    Events are recorded in Redis with the state change and published to the log just after, so
    a reader that saw a state (idle, say) waits for the events up to the session's ``last_seq``.
    """
    want = int(api.session(sid)["last_seq"])
    deadline = time.monotonic() + timeout
    out = api.all_events(sid)
    while (out[-1]["seq"] if out else 0) < want:
        if time.monotonic() > deadline:
            raise AssertionError(f"the log of {sid} reached seq {out[-1]['seq'] if out else 0}, not {want}")
        out.extend(api.events(sid, after=out[-1]["seq"] if out else 0, wait=1.0))
    return out


def _context(events: list[dict[str, Any]], ev: dict[str, Any], width: int = 6) -> str:
    i = events.index(ev)
    lines = []
    for e in events[max(0, i - width): i + 3]:
        brief = {k: v for k, v in e.items() if k in ("message_id", "turn_id", "via", "mode", "position",
                                                      "outcome", "message_ids", "call_id")}
        lines.append(f"  {'>' if e is ev else ' '} {e['seq']:>4} {e['type']:<18} {brief}")
    return "\n".join(lines)
