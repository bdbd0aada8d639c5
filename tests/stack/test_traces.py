"""Traces ([telemetry] otlp_endpoint) against a real stack and a real OTLP/HTTP receiver in the
test, which decodes what the gateway posts with the official protobufs (opentelemetry-proto's
``ExportTraceServiceRequest``).

One turn does everything the spans describe: the message comes with a ``traceparent`` header,
the model asks for a command the judge refuses, the person allows it, and while it runs the
runner holding the turn is killed (kill -9): the other runner takes the session over and ends
the turn ``crashed``. That turn is one trace under the caller's span, with its model requests
and the tool call as children; a message queued meanwhile runs as a turn of its own, its own
trace. Attribute names are the semantic-conventions package's constants.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes, service_attributes

from coxswain import keys
from tests.support.runners import holder, respawn
from tests.support.stack import Api, Stack, running, script

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class Got:
    """One span as received: its ids in hex, its attributes and events decoded."""

    def __init__(self, span: Span, resource: dict[str, Any]) -> None:
        self.name = span.name
        self.trace_id = span.trace_id.hex()
        self.span_id = span.span_id.hex()
        self.parent_id = span.parent_span_id.hex()
        self.kind = span.kind
        self.start = span.start_time_unix_nano
        self.end = span.end_time_unix_nano
        self.attrs = {a.key: value(a.value) for a in span.attributes}
        self.events = [(e.name, {a.key: value(a.value) for a in e.attributes}, e.time_unix_nano)
                       for e in span.events]
        self.error = span.status.code == Status.STATUS_CODE_ERROR
        self.resource = resource

    def event(self, name: str) -> dict[str, Any]:
        found = [a for n, a, _ in self.events if n == name]
        assert found, f"{self.name} has no {name} event: {[n for n, _, _ in self.events]}"
        return found[0]

    def __repr__(self) -> str:
        return f"Got({self.name!r}, {self.span_id} <- {self.parent_id})"


class Receiver:
    """An OTLP/HTTP traces endpoint on a free loopback port: decodes each export request."""

    def __init__(self) -> None:
        self.spans: list[Got] = []
        self.requests = 0
        self.refuse = 0
        """Answer this many more export requests 503 (a collector down), taking nothing of them."""
        self.refused = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf"
                with outer.lock:
                    down = ok and outer.refuse > 0
                    if down:
                        outer.refuse -= 1
                        outer.refused += 1
                if down:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if ok:
                    req = ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    with outer.lock:
                        outer.requests += 1
                        for rs in req.resource_spans:
                            res = {a.key: value(a.value) for a in rs.resource.attributes}
                            for ss in rs.scope_spans:
                                outer.spans.extend(Got(s, res) for s in ss.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of_turn(self, turn_id: str, timeout: float = 30.0) -> list[Got]:
        """Every span received of the trace whose invoke_agent span is turn ``turn_id`` (waits
        until the turn's span has arrived)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                roots = [s for s in self.spans if s.attrs.get("coxswain.turn.id") == turn_id]
                if roots:
                    trace = roots[0].trace_id
                    return [s for s in self.spans if s.trace_id == trace]
            time.sleep(0.1)
        raise AssertionError(f"no span of turn {turn_id} within {timeout}s ({len(self.spans)} spans received)")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Stack]:
    config = (f'[telemetry]\notlp_endpoint = "http://127.0.0.1:{receiver.port}"\nservice_name = "cox-test"\n'
              "[limits]\ntool_calls = 3\n")
    with running(tmp_path_factory.mktemp("traces"), runners=2, config=config) as s:
        yield s


@pytest.fixture
def api(traced: Stack) -> Iterator[Api]:
    with traced.client() as client:
        yield client


def _command_of(runner_pid: int, marker: str, timeout: float = 20.0) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in psutil.Process(runner_pid).children(recursive=True):
            if marker in " ".join(p.cmdline()):
                return p
        time.sleep(0.05)
    raise AssertionError(f"no command with {marker!r} under runner {runner_pid}")


def by_op(spans: list[Got], op: str) -> list[Got]:
    return sorted((s for s in spans if s.attrs.get(gen_ai.GEN_AI_OPERATION_NAME) == op), key=lambda s: s.start)


@pytest.mark.faults  # a runner killed: waits for its lease to lapse (the faults lane, drill leases)
def test_a_turn_taken_over_after_its_runner_died_is_one_trace(traced: Stack, api: Api, receiver: Receiver) -> None:
    sid = api.create("traced")["id"]
    # A command the rules judge refuses (touch writes), so the person is asked; then it runs long.
    text = script({"text": "Working.", "tools": [{"name": "run_command", "args": {"command": "touch t && sleep 41.3"}}]},
                  {"text": "not reached"})
    r = api.http.post(f"/v1/sessions/{sid}/messages", json={"text": text},
                      headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert r.status_code == 202, r.text
    first = r.json()
    start = api.wait_type(sid, "turn.start", message_id=first["message_id"])
    turn_id = start["turn_id"]
    user = api.wait_type(sid, "user.msg", message_id=first["message_id"])
    assert user["traceparent"] == f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "the send carried the header into the log"
    pending = api.wait_type(sid, "approval.pending", turn_id=turn_id, timeout=30)
    queued = api.send(sid, script({"text": "after the crash"}), mode="queue")
    assert queued.status_code == 202, queued.text
    time.sleep(0.3)  # a wait the approval span event shows
    answered = api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "allow"})
    assert answered.status_code == 200, answered.text
    victim, _ = holder(traced, turn_id)
    _command_of(traced.procs[victim].pid, "41.3")
    traced.kill(victim)
    try:
        try:
            end = api.wait_type(sid, "turn.end", turn_id=turn_id, timeout=traced.lease_ms / 1000 + 40)
        except AssertionError as exc:
            survivor = next(n for n in traced.runner_names() if n != victim)
            raise AssertionError(f"no takeover of {turn_id} ({victim} killed); {survivor} logged:\n"
                                 f"{traced.log(survivor)[-4000:]}") from exc
        assert end["outcome"] == "crashed", end
        nxt = api.wait_type(sid, "turn.start", message_id=queued.json()["message_id"], timeout=30)
        api.wait_type(sid, "turn.end", turn_id=nxt["turn_id"], timeout=30)

        spans = receiver.of_turn(turn_id)
        # one trace: the caller's, every span of the turn in it
        assert {s.trace_id for s in spans} == {CALLER_TRACE}
        turns, chats, tools = (by_op(spans, op) for op in ("invoke_agent", "chat", "execute_tool"))
        assert len(turns) == 1, spans
        turn = turns[0]
        assert turn.parent_id == CALLER_SPAN, "the traceparent's span is the turn's parent"
        assert turn.name == "invoke_agent coxswain"
        assert turn.attrs[gen_ai.GEN_AI_CONVERSATION_ID] == sid
        assert turn.attrs[gen_ai.GEN_AI_AGENT_NAME] == "coxswain"
        assert turn.attrs["coxswain.turn.outcome"] == "crashed"
        assert turn.attrs[error_attributes.ERROR_TYPE] == "crashed" and turn.error
        assert turn.resource[service_attributes.SERVICE_NAME] == "cox-test"
        # the queued message is a span event of the turn it was queued during
        assert turn.event("coxswain.queue")["coxswain.message.id"] == queued.json()["message_id"]
        # the model request: a child of the turn, with its model and usage (the session's automatic
        # title is a request too, of its own purpose)
        assert {c.attrs["coxswain.purpose"] for c in chats} <= {"turn", "title"}, [c.attrs for c in chats]
        assert all(c.parent_id == turn.span_id for c in chats)
        chats = [c for c in chats if c.attrs["coxswain.purpose"] == "turn"]
        assert len(chats) == 1, chats
        chat = chats[0]
        assert chat.parent_id == turn.span_id and chat.name == f"chat {start['model']}"
        assert chat.attrs[gen_ai.GEN_AI_REQUEST_MODEL] == start["model"]
        assert chat.attrs[gen_ai.GEN_AI_CONVERSATION_ID] == sid
        log = api.all_events(sid)
        usage = next(e for e in log if e["type"] == "usage" and e["turn_id"] == turn_id and e["purpose"] == "turn")
        answer = next(e for e in log if e["type"] == "assistant.msg" and e["turn_id"] == turn_id)
        assert chat.attrs[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == usage["input_tokens"]
        assert chat.attrs[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == usage["output_tokens"]
        assert chat.attrs[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] == [answer["finish_reason"]]
        # the tool call: a child of the turn, its policy decision and approval as events, ended
        # by the result the taker recorded (the turn crashed)
        assert len(tools) == 1, tools
        call = tools[0]
        assert call.parent_id == turn.span_id and call.name == "execute_tool run_command"
        assert call.attrs[gen_ai.GEN_AI_TOOL_NAME] == "run_command"
        assert call.attrs[gen_ai.GEN_AI_TOOL_CALL_ID] == pending["call_id"]
        decisions = [(e["actor"], e["verdict"]) for e in log if e["type"] == "policy.decision"
                     and e["call_id"] == pending["call_id"]]
        assert decisions, "the call was decided on"
        assert [(a["coxswain.policy.actor"], a["coxswain.policy.verdict"]) for n, a, _ in call.events
                if n == "coxswain.policy.decision"] == decisions, call.events
        assert (call.attrs["coxswain.policy.actor"], call.attrs["coxswain.policy.verdict"]) == decisions[-1]
        assert call.event("coxswain.approval.pending")["coxswain.approval.id"] == pending["approval_id"]
        resolved = call.event("coxswain.approval.resolved")
        assert resolved["coxswain.approval.decision"] == "allow" and resolved["coxswain.approval.actor"] == "person"
        assert resolved["coxswain.approval.wait_ms"] >= 300
        assert call.error, "the crashed call's span is an error"
        # times: the children inside the turn, the call after the request
        assert turn.start <= chat.start <= chat.end <= call.start <= call.end <= turn.end
        assert turn.end - turn.start >= traced.lease_ms * 1_000_000 / 2, "the turn lasted until the takeover"

        # the queued turn: a trace of its own (no traceparent), completed, with its request
        after = receiver.of_turn(nxt["turn_id"])
        assert {s.trace_id for s in after} != {CALLER_TRACE}
        root = by_op(after, "invoke_agent")[0]
        assert root.parent_id == "" and root.attrs["coxswain.turn.outcome"] == "completed" and not root.error
        assert [c.parent_id for c in by_op(after, "chat") if c.attrs["coxswain.purpose"] == "turn"] == [root.span_id]
    finally:
        respawn(traced, victim)


def test_each_turn_is_exported_once_and_an_invalid_traceparent_is_ignored(traced: Stack, api: Api,
                                                                         receiver: Receiver) -> None:
    sid = api.create("traced-2")["id"]
    r = api.http.post(f"/v1/sessions/{sid}/messages", json={"text": script({"text": "hi"})},
                      headers={"traceparent": "00-zz-not-a-trace"})
    assert r.status_code == 202, r.text
    start = api.wait_type(sid, "turn.start", message_id=r.json()["message_id"])
    assert "traceparent" not in api.wait_type(sid, "user.msg", message_id=r.json()["message_id"])
    api.wait_type(sid, "turn.end", turn_id=start["turn_id"], timeout=30)
    spans = receiver.of_turn(start["turn_id"])
    time.sleep(1.0)  # anything exported twice would have arrived by now
    spans = receiver.of_turn(start["turn_id"])
    assert len({s.span_id for s in spans}) == len(spans), "no span twice"
    root = by_op(spans, "invoke_agent")[0]
    assert root.parent_id == "" and len(root.trace_id) == 32
    assert {s.parent_id for s in spans if s is not root} == {root.span_id}


def test_a_turn_that_ends_while_no_gateway_runs_is_exported_whole_after_its_restart(
        traced: Stack, api: Api, receiver: Receiver) -> None:
    """The exporter's consumer is durable: a gateway killed mid-turn (kill -9) leaves the turn's
    end unacknowledged, and the gateway started again reads the whole turn from the stream."""
    sid = api.create("traced-restart")["id"]
    text = script({"text": "Waiting.", "tools": [{"name": "run_command", "args": {"command": "sleep 2"}}]},
                  {"text": "done"})
    r = api.send(sid, text)
    assert r.status_code == 202, r.text
    start = api.wait_type(sid, "turn.start", message_id=r.json()["message_id"])
    api.wait_type(sid, "policy.decision", turn_id=start["turn_id"], timeout=30)
    killed = time.time()
    traced.kill("gateway")
    store = traced.redis_client()
    try:
        deadline = time.monotonic() + 30
        while store.hget(keys.session(sid), "busy") == "1":
            assert time.monotonic() < deadline, "the turn ended"
            time.sleep(0.1)
    finally:
        store.close()
    traced.spawn("gateway", "cox_gateway")
    traced.wait_healthy(60)
    end = api.wait_type(sid, "turn.end", turn_id=start["turn_id"])
    assert end["ts"] > killed * 1000 and end["outcome"] == "completed", "it ended while no gateway ran"
    spans = receiver.of_turn(start["turn_id"], timeout=60)
    turn = by_op(spans, "invoke_agent")[0]
    chats = [c for c in by_op(spans, "chat") if c.attrs["coxswain.purpose"] == "turn"]
    assert len(chats) == 2 and len(by_op(spans, "execute_tool")) == 1, spans
    assert {s.parent_id for s in spans if s is not turn} == {turn.span_id}
    assert turn.attrs["coxswain.turn.outcome"] == "completed"
    metrics = api.http.get("/metrics").text
    rereads = [line for line in metrics.splitlines() if line.startswith("cox_trace_rereads_total")]
    assert rereads and float(rereads[0].split()[-1]) >= 1, "the restarted gateway read the turn from the stream"


def test_a_collector_that_refuses_gets_the_turn_again_later(traced: Stack, api: Api, receiver: Receiver) -> None:
    receiver.refuse, before = 3, receiver.refused
    sid = api.create("traced-refused")["id"]
    r = api.send(sid, script({"text": "hello"}))
    assert r.status_code == 202, r.text
    start = api.wait_type(sid, "turn.start", message_id=r.json()["message_id"])
    api.wait_type(sid, "turn.end", turn_id=start["turn_id"], timeout=30)
    spans = receiver.of_turn(start["turn_id"], timeout=60)
    assert receiver.refused - before == 3, "the collector refused three exports first"
    assert by_op(spans, "invoke_agent")[0].attrs[gen_ai.GEN_AI_CONVERSATION_ID] == sid
    assert len({s.span_id for s in spans}) == len(spans)


def test_every_turn_of_a_run_hangs_under_the_traceparent_of_its_start(traced: Stack, api: Api,
                                                                     receiver: Receiver) -> None:
    caller = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    # four calls against a limit of three: turn 1 ends hard_budget, the run's "continue" is turn 2
    text = script({"tools": [{"name": "find_files", "args": {"pattern": f"*.{x}"}} for x in "abcd"]},
                  {"text": "Reported."})
    r = api.http.post("/v1/runs", json={"text": text, "workspace": "traced-run"},
                      headers={"traceparent": f"00-{caller[0]}-{caller[1]}-01"})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    end = api.wait_type(sid, "run.end", timeout=60)
    assert (end["outcome"], end["turns"]) == ("completed", 2), end
    starts = [e for e in api.all_events(sid) if e["type"] == "turn.start"]
    roots = []
    for st in starts:
        spans = receiver.of_turn(st["turn_id"])
        assert {s.trace_id for s in spans} == {caller[0]}
        # one trace: the caller's, holding both turns
        (root,) = [s for s in by_op(spans, "invoke_agent") if s.attrs["coxswain.turn.id"] == st["turn_id"]]
        assert root.parent_id == caller[1]
        roots.append(root)
    assert [r.attrs["coxswain.message.via"] for r in roots] == ["send", "run"]
    assert [r.attrs["coxswain.turn.outcome"] for r in roots] == ["hard_budget", "completed"]
    assert roots[0].span_id != roots[1].span_id


def test_a_fork_exports_only_its_own_turns_not_the_ones_it_copied(traced: Stack, api: Api,
                                                                   receiver: Receiver) -> None:
    sid = api.create("traced-fork-src")["id"]
    copied = []
    for word in ("one", "two"):
        r = api.send(sid, script({"text": word}))
        assert r.status_code == 202, r.text
        st = api.wait_type(sid, "turn.start", message_id=r.json()["message_id"])
        api.wait_type(sid, "turn.end", turn_id=st["turn_id"], timeout=30)
        api.wait_idle(sid)
        copied.append(st["turn_id"])
    f = api.http.post(f"/v1/sessions/{sid}/fork", json={"at_turn": 2})
    assert f.status_code == 201, f.text
    fid = f.json()["id"]
    r = api.send(fid, script({"text": "the fork's own"}))
    assert r.status_code == 202, r.text
    own = api.wait_type(fid, "turn.start", message_id=r.json()["message_id"])
    api.wait_type(fid, "turn.end", turn_id=own["turn_id"], timeout=30)
    spans = receiver.of_turn(own["turn_id"])  # exported after the copies were read
    assert by_op(spans, "invoke_agent")[0].attrs[gen_ai.GEN_AI_CONVERSATION_ID] == fid
    with receiver.lock:
        fork_turns = {s.attrs.get("coxswain.turn.id") for s in receiver.spans
                      if s.attrs.get(gen_ai.GEN_AI_CONVERSATION_ID) == fid
                      and s.attrs.get(gen_ai.GEN_AI_OPERATION_NAME) == "invoke_agent"}
        source_turns = {s.attrs.get("coxswain.turn.id") for s in receiver.spans
                        if s.attrs.get(gen_ai.GEN_AI_CONVERSATION_ID) == sid
                        and s.attrs.get(gen_ai.GEN_AI_OPERATION_NAME) == "invoke_agent"}
    assert fork_turns == {own["turn_id"]}, "the copied turns are the source's, exported once, under it"
    assert source_turns == set(copied)
