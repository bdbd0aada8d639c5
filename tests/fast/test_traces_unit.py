"""The event -> span mapping of traces (coxswain.traces) and the gateway exporter's bookkeeping
(cox_gateway.tracer), without servers: a turn's events as the log records them, and what spans
they make."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes
from pydantic import ValidationError

from cox_gateway.tracer import Tracer, compact, to_sdk
from coxswain import traces
from coxswain.config import Settings, TelemetryConfig

SID = "s_trace1"
TID = "t_turn1"
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Log:
    """Events of one session with rising seq and the given ts (ms)."""

    def __init__(self, sid: str = SID) -> None:
        self.sid = sid
        self.events: list[dict[str, Any]] = []

    def add(self, type_: str, ts: int, turn_id: str | None = TID, **fields: Any) -> dict[str, Any]:
        ev = {"seq": len(self.events) + 1, "sid": self.sid, "ts": ts, "type": type_, **fields}
        if turn_id:
            ev["turn_id"] = turn_id
        self.events.append(ev)
        return ev


def full_turn(traceparent: str | None = PARENT, outcome: str = "completed") -> Log:
    """A turn: one request asking for a command, the judge refuses, the person allows after 2 s,
    a Lead and a queued message meanwhile, a second request answering, the session's title."""
    log = Log()
    log.add("user.msg", 1000, message_id="m_1", text="do it", via="send",
            **({"traceparent": traceparent} if traceparent else {}))
    log.add("turn.start", 1000, message_id="m_1", model="gpt-x")
    log.add("assistant.delta", 1100, text="Wor")
    log.add("assistant.delta", 1150, text="king")
    log.add("usage", 1200, purpose="turn", model="gpt-x", input_tokens=120, output_tokens=30, cache_read_tokens=7,
            cost=0.01)
    log.add("assistant.msg", 1200, text="Working.", finish_reason="tool_call", usage={},
            tool_calls=[{"call_id": "c_1", "name": "run_command", "args": {"command": "touch t"}}])
    log.add("policy.decision", 1210, call_id="c_1", verdict="ask", actor="judge", reason="writes a file", name="run_command")
    log.add("usage", 1215, purpose="title", model="gpt-x", input_tokens=10, output_tokens=3)
    log.add("approval.pending", 1220, approval_id="a_1", call_id="c_1", security=False, name="run_command")
    log.add("lead.saved", 1500, lead_id="l_1", text="also check")
    log.add("queue.added", 1600, turn_id=None, message_id="m_2", position=1, mode="queue", text="next")
    log.add("approval.resolved", 3220, approval_id="a_1", decision="allow", actor="person", scope="once")
    log.add("hook.decision", 3225, hook_event="PreToolUse", matcher="*", command="check.sh", decision="allow",
            duration_ms=4, source="workspace", tool_call_id="c_1", tool="run_command")
    log.add("tool.call", 3230, call_id="c_1", name="run_command", args={"command": "touch t"})
    log.add("tool.result", 3400, call_id="c_1", ok=True, output="exit code 0")
    log.add("user.msg", 3410, message_id="m_l1", text="also check", via="lead")
    log.add("lead.applied", 3410, lead_ids=["l_1"])
    log.add("usage", 3900, purpose="turn", model="gpt-x", input_tokens=200, output_tokens=12)
    log.add("assistant.msg", 3900, text="Done.", finish_reason="stop", usage={})
    log.add("turn.end", 3950, outcome=outcome, finish_reason="stop")
    return log


def ops(spans: list[traces.Span], op: str) -> list[traces.Span]:
    return [s for s in spans if s.attributes[gen_ai.GEN_AI_OPERATION_NAME] == op]


def names(span: traces.Span) -> list[str]:
    return [e.name for e in span.events]


def test_a_turn_is_one_span_with_its_requests_and_tool_calls_as_children() -> None:
    spans = traces.turn_spans(full_turn().events, lambda m: "openai")
    turn, *rest = spans
    assert turn.name == "invoke_agent coxswain"
    assert turn.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736, "the traceparent's trace"
    assert turn.parent_id == 0x00F067AA0BA902B7 and turn.parent_remote
    assert (turn.start_ns, turn.end_ns) == (1000 * 10**6, 3950 * 10**6)
    a = turn.attributes
    assert a[gen_ai.GEN_AI_OPERATION_NAME] == "invoke_agent" and a[gen_ai.GEN_AI_CONVERSATION_ID] == SID
    assert a[gen_ai.GEN_AI_AGENT_NAME] == "coxswain" and a[gen_ai.GEN_AI_REQUEST_MODEL] == "gpt-x"
    assert a[gen_ai.GEN_AI_PROVIDER_NAME] == "openai" and a["coxswain.turn.outcome"] == "completed"
    assert a[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == 320 and a[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == 42
    assert turn.error is None and error_attributes.ERROR_TYPE not in a
    assert names(turn) == ["coxswain.lead", "coxswain.queue", "coxswain.lead.message", "coxswain.lead.applied"]
    assert {s.parent_id for s in rest} == {turn.span_id} and {s.trace_id for s in rest} == {turn.trace_id}

    chats = [s for s in ops(spans, "chat") if s.attributes["coxswain.purpose"] == "turn"]
    assert [(c.start_ns // 10**6, c.end_ns // 10**6) for c in chats] == [(1000, 1200), (3410, 3900)], \
        "from the event before the request to its answer"
    first = chats[0].attributes
    assert chats[0].name == "chat gpt-x" and first[gen_ai.GEN_AI_REQUEST_MODEL] == "gpt-x"
    assert first[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == 120 and first[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == 30
    assert first[gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 7
    assert first[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_call"]
    title = [s for s in ops(spans, "chat") if s.attributes["coxswain.purpose"] == "title"]
    assert len(title) == 1 and title[0].attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == 10

    (call,) = ops(spans, "execute_tool")
    assert call.name == "execute_tool run_command"
    assert call.attributes[gen_ai.GEN_AI_TOOL_NAME] == "run_command"
    assert call.attributes[gen_ai.GEN_AI_TOOL_CALL_ID] == "c_1"
    assert call.attributes[gen_ai.GEN_AI_TOOL_TYPE] == "function"
    assert (call.start_ns // 10**6, call.end_ns // 10**6) == (1210, 3400) and call.error is None
    assert names(call) == ["coxswain.policy.decision", "coxswain.approval.pending", "coxswain.approval.resolved",
                           "coxswain.hook"]
    assert call.attributes["coxswain.approval.wait_ms"] == 2000
    assert call.events[2].attributes["coxswain.approval.actor"] == "person"
    assert call.attributes["coxswain.policy.actor"] == "judge" and call.attributes["coxswain.policy.verdict"] == "ask"
    assert [s.start_ns for s in rest] == sorted(s.start_ns for s in rest)


def test_the_same_events_make_the_same_ids_and_a_turn_without_a_caller_roots_its_own_trace() -> None:
    one = traces.turn_spans(full_turn(traceparent=None).events)
    two = traces.turn_spans([compact(e) for e in full_turn(traceparent=None).events])
    assert [(s.trace_id, s.span_id, s.parent_id) for s in one] == [(s.trace_id, s.span_id, s.parent_id) for s in two]
    assert one[0].parent_id is None and not one[0].parent_remote
    assert one[0].trace_id == traces.trace_id_of(SID, TID) and one[0].span_id == traces.span_id_of(SID, TID, "turn")
    assert len({s.span_id for s in one}) == len(one)
    other = Log("s_other")
    other.events = [{**e, "sid": "s_other"} for e in full_turn(traceparent=None).events]
    assert traces.turn_spans(other.events)[0].trace_id != one[0].trace_id


def test_a_crashed_turn_ends_what_was_open_at_its_end_as_errors() -> None:
    log = Log()
    log.add("user.msg", 1000, message_id="m_1", text="x", via="send")
    log.add("turn.start", 1000, message_id="m_1", model="script")
    log.add("usage", 1100, purpose="turn", model="script", input_tokens=5, output_tokens=5)
    log.add("assistant.msg", 1100, text="", tool_calls=[{"call_id": "c_9", "name": "run_command", "args": {}}])
    log.add("policy.decision", 1110, call_id="c_9", verdict="allow", actor="judge", reason="read-only")
    log.add("tool.call", 1120, call_id="c_9", name="run_command", args={})
    # the runner died here: the one that took over recorded a result and the end
    log.add("tool.result", 6000, call_id="c_9", ok=False, output="The turn crashed while this call ran.")
    log.add("turn.end", 6001, outcome="crashed", detail="its runner stopped renewing the lease")
    spans = traces.turn_spans(log.events)
    turn = spans[0]
    assert turn.error and turn.attributes[error_attributes.ERROR_TYPE] == "crashed"
    (call,) = ops(spans, "execute_tool")
    assert call.error and call.attributes[error_attributes.ERROR_TYPE] == "tool_error" and call.end_ns == 6000 * 10**6

    # killed while the model streamed, nothing recorded for the call: both end with the turn
    log = Log()
    log.add("user.msg", 1000, message_id="m_1", text="x", via="send")
    log.add("turn.start", 1000, message_id="m_1", model="script")
    log.add("assistant.delta", 1050, text="par")
    log.add("turn.end", 7000, outcome="crashed")
    spans = traces.turn_spans(log.events)
    (chat,) = ops(spans, "chat")
    assert chat.end_ns == 7000 * 10**6 and chat.error


def test_stop_steer_and_a_discarded_queue_are_events_of_the_turn() -> None:
    log = Log()
    log.add("user.msg", 1000, message_id="m_1", text="x", via="send")
    log.add("turn.start", 1000, message_id="m_1", model="script")
    log.add("queue.added", 1100, turn_id=None, message_id="m_2", position=1, mode="steer", text="instead")
    log.add("queue.discarded", 1200, message_ids=["m_3"])
    log.add("lead.unapplied", 1200, lead_ids=["l_1"])
    log.add("turn.end", 1300, outcome="stopped")
    turn = traces.turn_spans(log.events)[0]
    assert names(turn) == ["coxswain.steer", "coxswain.queue.discarded", "coxswain.lead.unapplied", "coxswain.stop"]
    assert turn.error is None, "a person's Stop is not an error"
    assert turn.events[1].attributes["coxswain.message.ids"] == ["m_3"]


def test_a_turn_not_ended_makes_no_spans_and_turn_events_picks_one_turn_out_of_a_log() -> None:
    events = full_turn().events
    assert traces.turn_spans(events[:-1]) == []
    log = Log()
    log.add("session.created", 900, turn_id=None, workspace="/w", model="script")
    for e in events:
        log.add(e["type"], e["ts"], turn_id=e.get("turn_id"), **{k: v for k, v in e.items()
                                                                 if k not in ("seq", "sid", "ts", "type", "turn_id")})
    log.add("title.set", 4000, title="t", source="auto")  # after the end: not the turn's
    log.add("user.msg", 5000, turn_id="t_next", message_id="m_2", text="next", via="queue")
    picked = traces.turn_events(log.events, TID)
    assert [e["type"] for e in picked] == [e["type"] for e in events]
    assert traces.turn_spans(picked)[0].span_id == traces.turn_spans(events)[0].span_id


@pytest.mark.parametrize(("value", "ok"), [
    (PARENT, True),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", True),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", False),
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
    ("garbage", False), ("", False), (None, False),
])
def test_traceparent(value: str | None, ok: bool) -> None:
    assert (traces.valid_traceparent(value) is not None) is ok


def test_an_unsampled_caller_is_respected() -> None:
    spans = traces.turn_spans(full_turn(traceparent=PARENT[:-2] + "00").events)
    assert not spans[0].sampled


def test_the_sdk_spans_encode_with_their_ids_parents_and_kinds() -> None:
    spans = traces.turn_spans(full_turn().events)
    req = encode_spans(to_sdk(spans, Resource.create({"service.name": "t"})))
    got = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [s.span_id for s in got] == [s.span_id.to_bytes(8, "big") for s in spans]
    by_name = {s.name: s for s in got}
    turn = by_name["invoke_agent coxswain"]
    assert turn.parent_span_id == bytes.fromhex("00f067aa0ba902b7")
    assert turn.trace_id == bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
    assert by_name["chat gpt-x"].kind == PbSpan.SPAN_KIND_CLIENT
    assert by_name["chat gpt-x"].parent_span_id == turn.span_id
    assert by_name["execute_tool run_command"].kind == PbSpan.SPAN_KIND_INTERNAL


def tracer() -> Tracer:
    import structlog

    settings = Settings(telemetry=TelemetryConfig(otlp_endpoint="http://127.0.0.1:9"))
    return Tracer(settings, js=None, log=structlog.get_logger())  # type: ignore[arg-type]


def test_the_exporter_keeps_a_turn_it_saw_whole_and_rereads_one_it_did_not() -> None:
    t = tracer()
    events = full_turn().events
    got = [t.see(dict(e)) for e in events]
    assert got[:-1] == [None] * (len(events) - 1)
    kept = got[-1]
    assert kept and [e["type"] for e in kept if e["type"] != "assistant.delta"] == \
        [e["type"] for e in events if e["type"] != "assistant.delta"]
    assert all("text" not in e and "output" not in e and "args" not in e for e in kept), "kept small"
    assert traces.turn_spans(kept)[0].span_id == traces.turn_spans(events)[0].span_id
    assert t.see({"seq": 99, "sid": SID, "turn_id": TID, "type": "title.set", "ts": 1}) is None, \
        "an event of a turn already ended starts nothing"

    # a gap (an event this gateway did not get) or a turn first seen midway: read it again
    t = tracer()
    for e in events[:5] + events[6:-1]:
        assert t.see(dict(e)) is None
    assert t.see(dict(events[-1])) == []
    t = tracer()
    for e in events[2:-1]:
        t.see(dict(e))
    assert t.see(dict(events[-1])) == []
    # a redelivered turn.end (its export failed) is handled again
    assert t.see(dict(events[-1])) == []


def test_telemetry_config() -> None:
    assert TelemetryConfig().traces_url() == ""
    assert TelemetryConfig(otlp_endpoint="http://c:4318").traces_url() == "http://c:4318/v1/traces"
    assert TelemetryConfig(otlp_endpoint="https://c/v1/traces/").traces_url() == "https://c/v1/traces"
    with pytest.raises(ValidationError):
        TelemetryConfig(otlp_endpoint="grpc://c:4317")


def test_a_turn_recorded_at_one_instant_is_a_fork_candidate_and_a_run_one_is_not() -> None:
    events = full_turn().events
    assert not traces.one_instant(events)
    assert traces.one_instant([{**e, "ts": 5000} for e in events])
