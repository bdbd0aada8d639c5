"""Traces: a turn's events as OpenTelemetry spans in the GenAI semantic conventions.

Pure functions, no I/O: the gateway's trace exporter (``cox_gateway.tracer``) reads the event log
and hands each ended turn's events here (:func:`turn_spans`), then exports what comes back by
OTLP. Because the spans are made from the log, not from the process that ran the turn, a turn a
runner died in and another one ended (``crashed``) is one trace like any other, and the same
events always make the same spans: trace and span ids are derived from the session, the turn and
the event (:func:`trace_id_of`, :func:`span_id_of`), so a turn exported twice (a redelivery, a
second gateway) is the same trace with the same spans.

What a turn makes (docs/operations.md, "Traces"):

- ``invoke_agent coxswain``: the turn, from its ``user.msg`` to its ``turn.end``; the child of
  the caller's span when the message came with a ``traceparent`` header, else a trace's root;
- ``chat <model>``: each model request of the turn, from the event before it (the turn's start,
  the last tool result, ...) to its ``assistant.msg``, with ``gen_ai.usage.*`` from its ``usage``;
- ``execute_tool <tool>``: each tool call, from its first event (the policy decision) to its
  ``tool.result`` or ``tool.skipped``; the policy decision, the approval's wait and answer, the
  hooks that ran and the connections it asked for are its span events.

Leads, queue, steer and Stop are span events of the turn's span. Attribute names are the
semantic-conventions package's constants; what they do not name is under ``coxswain.``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes

AGENT_NAME: Final = "coxswain"
OP_TURN: Final = gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value
OP_CHAT: Final = gen_ai.GenAiOperationNameValues.CHAT.value
OP_TOOL: Final = gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value

TRACEPARENT_RE: Final = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
"""A W3C ``traceparent`` of version 00 (lower-case hex; all-zero ids are invalid)."""

OK_OUTCOMES: Final = frozenset({"completed", "empty", "stopped", "canceled"})
"""Turn outcomes whose span is not marked as an error: the turn did what it was asked, or a
person ended it."""

REQUEST_EVENTS: Final = frozenset({"assistant.delta", "model.retry", "assistant.msg"})
"""The events of one model request of the turn (with its ``usage`` of purpose ``turn``)."""
MAX_TEXT: Final = 256
"""How much of a reason or command a span event keeps."""


@dataclass
class SpanEvent:
    name: str
    ts_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Span:
    """One span as the exporter sends it (``cox_gateway.tracer`` makes an SDK span of it)."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    error: str | None = None
    """The status description when the span ended in error (None: it did not)."""
    parent_remote: bool = False
    """The parent is the caller's (a ``traceparent``), not a span of this trace made here."""
    sampled: bool = True


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a valid W3C ``traceparent``; None for anything else."""
    if not value:
        return None
    m = TRACEPARENT_RE.match(value.strip())
    if m is None:
        return None
    trace_id, span_id, flags = int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, flags


def valid_traceparent(value: str | None) -> str | None:
    """The header as it is recorded (stripped), or None when it is not a valid ``traceparent``
    (an invalid one is ignored, as W3C says: the turn then starts a trace of its own)."""
    return value.strip() if value is not None and parse_traceparent(value) is not None else None


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(("coxswain-trace", *parts)).encode()).digest()


def trace_id_of(sid: str, turn_id: str) -> int:
    """A turn's own trace id (when it has no caller's): the same on every export of it."""
    return int.from_bytes(_digest(sid, turn_id)[:16], "big") or 1


def span_id_of(sid: str, turn_id: str, *what: str) -> int:
    """A span's id from what it is (the turn, a request's first seq, a call's id)."""
    return int.from_bytes(_digest(sid, turn_id, *what)[:8], "big") or 1


def _ns(ms: Any) -> int:
    return int(ms or 0) * 1_000_000


def _short(text: Any) -> str:
    s = str(text or "")
    return s if len(s) <= MAX_TEXT else s[: MAX_TEXT - 1] + "…"


def _clean(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """OTLP attribute values: no None, sequences as lists of strings."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            out[k] = [str(x) for x in v]
        elif isinstance(v, (str, bool, int, float)):
            out[k] = v
        else:
            out[k] = str(v)
    return out


def turn_events(log: Iterable[Mapping[str, Any]], turn_id: str) -> list[dict[str, Any]]:
    """The events of turn ``turn_id`` out of a session's log (in seq order): from its first event
    to its ``turn.end``, those of the turn and those recorded meanwhile with no turn (a message
    queued while it ran)."""
    out: list[dict[str, Any]] = []
    started = False
    for ev in log:
        tid = ev.get("turn_id")
        if tid == turn_id:
            started = True
            out.append(dict(ev))
            if ev.get("type") == "turn.end":
                break
        elif started and not tid:
            out.append(dict(ev))
    return out


def one_instant(events: Sequence[Mapping[str, Any]]) -> bool:
    """Were all of a turn's events recorded at one instant (one ``ts``)? A turn a fork copied
    into its new log is (``session.forked`` follows it, recorded in the same call); a turn that
    ran almost never is, as its end is recorded by another call than its start."""
    stamps = {e.get("ts") for e in events}
    return len(stamps) == 1


def turn_spans(events: Sequence[Mapping[str, Any]], provider_of: Callable[[str], str | None] | None = None) -> list[Span]:
    """The spans of one ended turn from its events in seq order (:func:`turn_events`): the
    turn's span first, then its requests' and tool calls' in the order they started. Empty when
    the events hold no ``turn.end`` (the turn is not over) or no turn."""
    turn_evs = [e for e in events if e.get("turn_id")]
    if not turn_evs:
        return []
    end = next((e for e in events if e.get("type") == "turn.end"), None)
    if end is None:
        return []
    sid = str(turn_evs[0]["sid"])
    turn_id = str(turn_evs[0]["turn_id"])
    provider = provider_of or (lambda _model: None)
    first = events[0]
    start_ev = next((e for e in events if e.get("type") == "turn.start"), None)
    model = str(start_ev.get("model") or "") if start_ev else ""
    opening = next((e for e in events if e.get("type") == "user.msg" and e.get("via") != "lead"), None)
    parent = parse_traceparent(opening.get("traceparent") if opening else None)
    trace_id = parent[0] if parent else trace_id_of(sid, turn_id)
    turn_sid = span_id_of(sid, turn_id, "turn")
    end_ns = _ns(end.get("ts"))
    outcome = str(end.get("outcome") or "")

    common = {gen_ai.GEN_AI_CONVERSATION_ID: sid}
    turn = Span(
        name=f"{OP_TURN} {AGENT_NAME}", trace_id=trace_id, span_id=turn_sid,
        parent_id=parent[1] if parent else None, parent_remote=parent is not None,
        sampled=bool(parent[2] & 1) if parent else True,
        start_ns=_ns(first.get("ts")), end_ns=end_ns,
        attributes={gen_ai.GEN_AI_OPERATION_NAME: OP_TURN, gen_ai.GEN_AI_AGENT_NAME: AGENT_NAME, **common,
                    gen_ai.GEN_AI_REQUEST_MODEL: model or None, gen_ai.GEN_AI_PROVIDER_NAME: provider(model) if model else None,
                    "coxswain.turn.id": turn_id, "coxswain.turn.outcome": outcome,
                    "coxswain.message.id": opening.get("message_id") if opening else None,
                    "coxswain.message.via": opening.get("via") if opening else None,
                    "coxswain.turn.finish_reason": end.get("finish_reason")},
    )
    if outcome not in OK_OUTCOMES:
        turn.attributes[error_attributes.ERROR_TYPE] = outcome
        turn.error = _short(end.get("detail") or outcome)
    chats: list[Span] = []
    tools: dict[str, Span] = {}
    tool_names: dict[str, str] = {}
    approvals: dict[str, tuple[str, int]] = {}  # approval_id -> (call_id, pending ts ms)
    open_chat: Span | None = None
    last_ts = first.get("ts") or 0
    totals = {"in": 0, "out": 0, "cost": 0.0}

    def chat_span(ev: Mapping[str, Any], start_ms: Any, purpose: str = "turn") -> Span:
        m = str(ev.get("model") or model)
        return Span(name=f"{OP_CHAT} {m}".strip(), trace_id=trace_id,
                    span_id=span_id_of(sid, turn_id, "chat", str(ev.get("seq"))), parent_id=turn_sid,
                    start_ns=_ns(start_ms), end_ns=_ns(ev.get("ts")),
                    attributes={gen_ai.GEN_AI_OPERATION_NAME: OP_CHAT, **common, gen_ai.GEN_AI_REQUEST_MODEL: m,
                                gen_ai.GEN_AI_PROVIDER_NAME: provider(m), "coxswain.purpose": purpose})

    def add_usage(span: Span, u: Mapping[str, Any]) -> None:
        span.attributes.update({
            gen_ai.GEN_AI_USAGE_INPUT_TOKENS: int(u.get("input_tokens") or 0),
            gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: int(u.get("output_tokens") or 0),
            gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: int(u.get("cache_read_tokens") or 0),
            gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: int(u.get("cache_write_tokens") or 0),
            "coxswain.cost_usd": float(u.get("cost") or 0.0),
        })
        if u.get("model"):
            span.attributes[gen_ai.GEN_AI_RESPONSE_MODEL] = str(u["model"])

    def tool_span(call_id: str, ev: Mapping[str, Any]) -> Span:
        span = tools.get(call_id)
        if span is None:
            name = tool_names.get(call_id) or str(ev.get("name") or ev.get("tool") or "")
            span = tools[call_id] = Span(
                name=f"{OP_TOOL} {name}".strip(), trace_id=trace_id, span_id=span_id_of(sid, turn_id, "tool", call_id),
                parent_id=turn_sid, start_ns=_ns(ev.get("ts")), end_ns=end_ns,
                attributes={gen_ai.GEN_AI_OPERATION_NAME: OP_TOOL, **common, gen_ai.GEN_AI_TOOL_NAME: name or None,
                            gen_ai.GEN_AI_TOOL_CALL_ID: call_id,
                            gen_ai.GEN_AI_TOOL_TYPE: "extension" if "__" in name else "function"},
                error="the turn ended before the call did")
        return span

    for ev in events:
        t = ev.get("type")
        ts = ev.get("ts") or 0
        ns = _ns(ts)
        if t == "usage":
            if ev.get("purpose") == "turn":
                if open_chat is None:
                    open_chat = chat_span(ev, last_ts)
                add_usage(open_chat, ev)
                totals["in"] += int(ev.get("input_tokens") or 0)
                totals["out"] += int(ev.get("output_tokens") or 0)
            else:  # the judge's, a title's or a compaction's request: a span of its own
                s = chat_span(ev, last_ts, str(ev.get("purpose") or ""))
                add_usage(s, ev)
                chats.append(s)
            totals["cost"] += float(ev.get("cost") or 0.0)
            continue
        if t in REQUEST_EVENTS:
            if open_chat is None:
                open_chat = chat_span(ev, last_ts)
            if t == "model.retry":
                open_chat.events.append(SpanEvent("coxswain.model.retry", ns, {
                    "coxswain.attempt": ev.get("attempt"), "coxswain.delay_s": ev.get("delay_s"),
                    error_attributes.ERROR_TYPE: _short(ev.get("error"))}))
            elif t == "assistant.msg":
                open_chat.end_ns = ns
                if ev.get("finish_reason"):
                    open_chat.attributes[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] = [str(ev["finish_reason"])]
                for ref in ev.get("tool_calls") or []:
                    tool_names[str(ref.get("call_id"))] = str(ref.get("name") or "")
                chats.append(open_chat)
                open_chat = None
                last_ts = ts
            continue
        last_ts = ts
        call_id = ev.get("call_id") or ev.get("tool_call_id")
        if t == "approval.resolved":
            aid = str(ev.get("approval_id"))
            if aid in approvals:
                cid, since = approvals[aid]
                span = tool_span(cid, ev)
                wait_ms = max(0, int(ts) - since)
                span.attributes["coxswain.approval.wait_ms"] = wait_ms
                span.attributes["coxswain.approval.decision"] = ev.get("decision")
                span.events.append(SpanEvent("coxswain.approval.resolved", ns, {
                    "coxswain.approval.id": aid, "coxswain.approval.decision": ev.get("decision"),
                    "coxswain.approval.actor": ev.get("actor"), "coxswain.approval.scope": ev.get("scope"),
                    "coxswain.approval.wait_ms": wait_ms}))
            continue
        if call_id and t in ("tool.call", "policy.decision", "approval.pending", "hook.decision", "network.request",
                             "tool.result", "tool.skipped"):
            span = tool_span(str(call_id), ev)
            if t == "policy.decision":
                span.attributes.update({"coxswain.policy.verdict": ev.get("verdict"),
                                        "coxswain.policy.actor": ev.get("actor")})
                span.events.append(SpanEvent("coxswain.policy.decision", ns, {
                    "coxswain.policy.verdict": ev.get("verdict"), "coxswain.policy.actor": ev.get("actor"),
                    "coxswain.policy.reason": _short(ev.get("reason")), "coxswain.policy.security": bool(ev.get("security"))}))
            elif t == "approval.pending":
                approvals[str(ev.get("approval_id"))] = (str(call_id), int(ts))
                span.events.append(SpanEvent("coxswain.approval.pending", ns, {
                    "coxswain.approval.id": ev.get("approval_id"), "coxswain.policy.security": bool(ev.get("security"))}))
            elif t == "hook.decision":
                span.events.append(SpanEvent("coxswain.hook", ns, _hook_attrs(ev)))
            elif t == "network.request":
                span.events.append(SpanEvent("coxswain.network.request", ns, {
                    "coxswain.network.host": ev.get("host"), "coxswain.network.port": ev.get("port"),
                    "coxswain.network.allowed": bool(ev.get("allowed"))}))
            elif t == "tool.result":
                span.end_ns = ns
                span.error = None if ev.get("ok") else _short(ev.get("output")) or "the tool failed"
                if not ev.get("ok"):
                    span.attributes[error_attributes.ERROR_TYPE] = "tool_error"
                if ev.get("limit"):
                    span.attributes["coxswain.sandbox.limit"] = ev.get("limit")
            elif t == "tool.skipped":
                span.end_ns = ns
                span.error = None
                span.attributes["coxswain.tool.skipped"] = ev.get("reason")
            continue
        # the turn's own span events
        if t == "lead.saved":
            turn.events.append(SpanEvent("coxswain.lead", ns, {"coxswain.lead.id": ev.get("lead_id")}))
        elif t in ("lead.applied", "lead.unapplied"):
            turn.events.append(SpanEvent(f"coxswain.{t}", ns, {"coxswain.lead.ids": ev.get("lead_ids") or []}))
        elif t == "user.msg" and ev.get("via") == "lead":
            turn.events.append(SpanEvent("coxswain.lead.message", ns, {"coxswain.message.id": ev.get("message_id")}))
        elif t == "queue.added":
            name = "coxswain.steer" if ev.get("mode") == "steer" else "coxswain.queue"
            turn.events.append(SpanEvent(name, ns, {"coxswain.message.id": ev.get("message_id"),
                                                    "coxswain.queue.position": ev.get("position")}))
        elif t == "queue.removed":
            turn.events.append(SpanEvent("coxswain.queue.removed", ns, {"coxswain.message.id": ev.get("message_id")}))
        elif t == "queue.discarded":
            turn.events.append(SpanEvent("coxswain.queue.discarded", ns,
                                         {"coxswain.message.ids": ev.get("message_ids") or []}))
        elif t == "hook.decision":
            turn.events.append(SpanEvent("coxswain.hook", ns, _hook_attrs(ev)))
        elif t in ("limit.soft", "limit.hard", "limit.warning"):
            turn.events.append(SpanEvent(f"coxswain.{t}", ns, {"coxswain.limit": ev.get("limit"),
                                                               "coxswain.limit.value": ev.get("value")}))
        elif t == "context.compacted":
            turn.events.append(SpanEvent("coxswain.context.compacted", ns, {
                "coxswain.tokens.before": ev.get("before_tokens"), "coxswain.tokens.after": ev.get("after_tokens")}))
        elif t == "turn.end":
            if outcome == "stopped":
                # Stop (or a steer) took effect here: the turn's end is when it did
                turn.events.append(SpanEvent("coxswain.stop", ns, {"coxswain.turn.outcome": outcome}))
    if open_chat is not None:  # the turn ended while the model was answering
        open_chat.end_ns = end_ns
        open_chat.error = "the turn ended before the model answered"
        chats.append(open_chat)
    turn.attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] = totals["in"]
    turn.attributes[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] = totals["out"]
    turn.attributes["coxswain.cost_usd"] = round(totals["cost"], 8)
    children = sorted([*chats, *tools.values()], key=lambda s: s.start_ns)
    out = [turn, *children]
    for s in out:
        s.end_ns = max(s.end_ns, s.start_ns)
        s.attributes = _clean(s.attributes)
        for e in s.events:
            e.attributes = _clean(e.attributes)
    return out


def _hook_attrs(ev: Mapping[str, Any]) -> dict[str, Any]:
    return {"coxswain.hook.event": ev.get("hook_event"), "coxswain.hook.decision": ev.get("decision"),
            "coxswain.hook.command": _short(ev.get("command")), "coxswain.hook.duration_ms": ev.get("duration_ms"),
            "coxswain.hook.failed": bool(ev.get("failed"))}
