"""Webhooks (``[[notify.webhooks]]``) against a real stack and real HTTP receivers in the test.

Three webhooks: ``approvals`` (``approval.pending``) posts to a receiver that answers 500 to the
first two attempts of each delivery and 200 after; ``turns`` (``turn.end``, its secret from the
environment) and ``limits`` (``limit.warning``) to ones that always answer 200; ``gate``
(``turn.end``) to one that answers 503 until a test opens it; ``stuck`` (both) to a socket that
takes connections and never answers, so every attempt times out and each event is given up
after ``max_attempts``. The deliveries are read from the event log by the gateway; turns never
wait.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coxswain import keys, notify
from tests.support.checks import finished, of_type
from tests.support.stack import Api, Stack, running, script

APPROVALS_SECRET = "whsec-approvals-7c1d0e"
TURNS_SECRET = "whsec-turns-from-env-41b9"
STUCK_SECRET = "whsec-stuck-0a93"
OTHER_SECRET = "whsec-other-55e0"
TIMEOUT_S = 1.5
MAX_ATTEMPTS = 6


@dataclass
class Hit:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def event(self) -> dict[str, Any]:
        return dict(json.loads(self.body))

    @property
    def delivery(self) -> str:
        return self.headers[notify.DELIVERY_HEADER]


class Receiver:
    """An HTTP server on a free loopback port that records every POST; ``/flaky`` answers 500 to
    the first two attempts of each delivery id, ``/gate`` 503 until ``gate_open``, everything
    else 200."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gate_open = False
        self.hits: list[Hit] = []
        self.tries: dict[str, int] = {}
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if len(body) < length:
                    # The sender died mid-request (a test kills the gateway): no delivery was
                    # made, and its retry comes from the next gateway. (Recorded, its empty body
                    # failed the JSON parse of every later look at the hits.)
                    return
                headers = {k: v for k, v in self.headers.items()}
                with receiver.lock:
                    status = 200
                    if self.path == "/flaky":
                        did = headers.get(notify.DELIVERY_HEADER, "")
                        receiver.tries[did] = receiver.tries.get(did, 0) + 1
                        status = 500 if receiver.tries[did] <= 2 else 200
                    elif self.path == "/gate" and not receiver.gate_open:
                        status = 503
                    receiver.hits.append(Hit(self.path, headers, body, status))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of(self, path: str, sid: str | None = None) -> list[Hit]:
        with self.lock:
            return [h for h in self.hits if h.path == path and (sid is None or h.event.get("sid") == sid)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def stuck_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver, stuck_port: int) -> Iterator[Stack]:
    base = f"http://127.0.0.1:{receiver.port}"
    config = f"""
[limits]
tool_calls = 5

[notify]
max_attempts = {MAX_ATTEMPTS}
backoff_s = 0.2
backoff_max_s = 1.0
timeout_s = {TIMEOUT_S}

[[notify.webhooks]]
name = "approvals"
url = "{base}/flaky"
events = ["approval.pending"]
secret = "{APPROVALS_SECRET}"

[[notify.webhooks]]
name = "turns"
url = "{base}/ok"
events = ["turn.end"]
secret_env = "TEST_HOOK_SECRET"

[[notify.webhooks]]
name = "limits"
url = "{base}/limits"
events = ["limit.warning"]
secret = "{OTHER_SECRET}"

[[notify.webhooks]]
name = "gate"
url = "{base}/gate"
events = ["turn.end"]
secret = "{OTHER_SECRET}"

[[notify.webhooks]]
name = "stuck"
url = "http://127.0.0.1:{stuck_port}/hook"
events = ["turn.end", "approval.pending"]
secret = "{STUCK_SECRET}"
"""
    with running(tmp_path_factory.mktemp("webhooks"), runners=1, config=config,
                 env={"TEST_HOOK_SECRET": TURNS_SECRET}) as stack:
        # the consumers exist once the runner made the stream: wait for every webhook to run
        wait_until(lambda: all(w["state"] == "running" for w in webhooks_health(stack).values()), 30)
        yield stack


@pytest.fixture
def api(hooked: Stack) -> Iterator[Api]:
    with hooked.client() as client:
        yield client


def wait_until(pred: Any, timeout: float, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not met within {timeout}s")


def webhooks_health(stack: Stack) -> dict[str, dict[str, Any]]:
    body = httpx.get(stack.url + "/healthz", timeout=5).json()
    return {w["name"]: w for w in body["notify"]["webhooks"]}


def metric(stack: Stack, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there is none)."""
    return metric_at(stack.url, name, **labels)


def metric_at(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def signed(hit: Hit, secret: str) -> bool:
    return notify.verify(secret, hit.headers[notify.TIMESTAMP_HEADER], hit.body, hit.headers[notify.SIGNATURE_HEADER])


def gated(path: str) -> str:
    """A turn whose ``touch`` the rules judge refuses, so the person is asked."""
    return script({"text": "Touching.", "tools": [{"name": "run_command", "args": {"command": f"touch {path}"}}]},
                  {"text": "done"})


# ---------------------------------------------------------------------------------------------


def test_an_approval_refused_twice_is_delivered_on_the_third_attempt_once(hooked: Stack, receiver: Receiver,
                                                                           api: Api) -> None:
    sid = api.create("hook-approval")["id"]
    assert api.send(sid, gated("a.txt")).status_code == 202
    pending = api.wait_type(sid, "approval.pending")
    wait_until(lambda: any(h.status == 200 for h in receiver.of("/flaky", sid)), 30, "a delivered approval")

    hits = receiver.of("/flaky", sid)
    assert [h.status for h in hits] == [500, 500, 200], "two refusals, then the attempt that got through"
    assert {h.delivery for h in hits} == {f"{hits[0].delivery.split('-')[0]}-approvals"}, "one delivery id"
    for h in hits:
        assert signed(h, APPROVALS_SECRET), "every attempt is signed (its own timestamp)"
        assert not signed(h, TURNS_SECRET)
        assert h.headers[notify.EVENT_HEADER] == "approval.pending"
        assert h.headers["Content-Type"] == "application/json"
        assert h.event == pending, "the body is the event as the log holds it, sid included"

    r = api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "deny"})
    assert r.status_code == 200, r.text
    finished(api, sid)
    # Nothing after the success: no retry (a nak'd one comes back within backoff_max_s = 1 s).
    wait_until(lambda: receiver.of("/ok", sid), 20, "the turn's end delivered")
    time.sleep(2.0)
    assert [h.status for h in receiver.of("/flaky", sid)] == [500, 500, 200]

    assert metric(hooked, "cox_webhook_attempts_total", webhook="approvals", event="approval.pending",
                  outcome="refused") >= 2
    assert metric(hooked, "cox_webhook_attempts_total", webhook="approvals", event="approval.pending",
                  outcome="ok") >= 1
    assert metric(hooked, "cox_webhook_delivered_total", webhook="approvals", event="approval.pending") >= 1


def test_turn_end_is_delivered_and_unsubscribed_events_are_not_sent(hooked: Stack, receiver: Receiver,
                                                                    api: Api) -> None:
    sid = api.create("hook-turns")["id"]
    for i in range(2):
        assert api.send(sid, script({"text": f"turn {i}"}), mode="queue").status_code == 202
    wait_until(lambda: len(receiver.of("/ok", sid)) >= 2, 30, "two turn ends delivered")
    evs = api.all_events(sid)
    ends = of_type(evs, "turn.end")
    assert len(ends) == 2
    hits = receiver.of("/ok", sid)
    assert sorted(h.event["seq"] for h in hits) == [e["seq"] for e in ends], "each turn end once"
    for h in hits:
        assert signed(h, TURNS_SECRET), "the secret read from the gateway's environment"
        assert h.headers[notify.EVENT_HEADER] == "turn.end" and h.status == 200
    assert len({h.delivery for h in hits}) == 2
    # the session's other events (user.msg, assistant.msg, turn.start ...) went to no webhook
    assert {e["type"] for e in evs} - {"turn.end"}, "the session had other events"
    assert receiver.of("/flaky", sid) == [], "approvals subscribes to approval.pending only"
    with receiver.lock:
        types = {(h.path, h.headers[notify.EVENT_HEADER]) for h in receiver.hits}
    assert types <= {("/flaky", "approval.pending"), ("/ok", "turn.end"), ("/limits", "limit.warning"),
                     ("/gate", "turn.end")}
    assert metric(hooked, "cox_webhook_delivered_total", webhook="turns", event="turn.end") >= 2


def test_a_turn_end_published_with_the_next_queued_turns_start_is_delivered(hooked: Stack, receiver: Receiver,
                                                                            api: Api) -> None:
    """A queued message starts its turn in the same atomic call that ends the turn before it, and
    that turn's end, the message and the new turn's start go out as one message of the stream:
    the webhook's event is then not the message's last, and is delivered all the same."""
    sid = api.create("hook-handoff")["id"]
    assert api.send(sid, script({"text": "first", "delay_ms": 400}), mode="queue").json()["disposition"] == "started"
    assert api.send(sid, script({"text": "second"}), mode="queue").json()["disposition"] == "queued"
    wait_until(lambda: len(receiver.of("/ok", sid)) >= 2, 30, "both turn ends delivered")
    evs = api.all_events(sid)
    ends = of_type(evs, "turn.end")
    starts = of_type(evs, "turn.start")
    assert len(ends) == 2 and starts[1]["seq"] > ends[0]["seq"]
    hits = receiver.of("/ok", sid)
    assert sorted(h.event["seq"] for h in hits) == [e["seq"] for e in ends]
    assert all(h.event["type"] == "turn.end" and signed(h, TURNS_SECRET) for h in hits)


def test_a_receiver_that_never_answers_does_not_slow_turns(hooked: Stack, api: Api) -> None:
    # Start from a quiet consumer: the earlier tests' events to "stuck" have been given up.
    wait_until(lambda: webhooks_health(hooked)["stuck"].get("ack_pending") == 0
               and webhooks_health(hooked)["stuck"]["in_flight"] == 0, 60, "stuck idle")
    failed0 = metric(hooked, "cox_webhook_failed_total", webhook="stuck", event="turn.end")
    errors0 = metric(hooked, "cox_webhook_attempts_total", webhook="stuck", event="turn.end", outcome="error")

    sid = api.create("hook-stuck")["id"]
    start = time.monotonic()
    for i in range(3):
        assert api.send(sid, script({"text": f"quick {i}"}), mode="queue").status_code == 202
    wait_until(lambda: len(of_type(api.all_events(sid), "turn.end")) == 3, 30, "three turns ended")
    took = time.monotonic() - start
    # One event takes the stuck webhook at least MAX_ATTEMPTS time-outs to give up; three turns,
    # each publishing a turn.end it must deliver, ended before the first was given up.
    assert metric(hooked, "cox_webhook_failed_total", webhook="stuck", event="turn.end") == failed0, (
        f"turns took {took:.1f}s: they waited for deliveries")
    assert took < MAX_ATTEMPTS * TIMEOUT_S

    wait_until(lambda: metric(hooked, "cox_webhook_failed_total", webhook="stuck", event="turn.end") == failed0 + 3,
               60, "the stuck webhook gave the three turn ends up")
    errors = metric(hooked, "cox_webhook_attempts_total", webhook="stuck", event="turn.end", outcome="error")
    assert errors - errors0 == 3 * MAX_ATTEMPTS, "every attempt counted, up to max_attempts each"
    # The counter moves as the last attempt is given up; the consumer's state follows it (a loaded
    # CI machine once read "retrying" in between).
    wait_until(lambda: (h := webhooks_health(hooked)["stuck"])["state"] == "running" and h["ack_pending"] == 0, 30,
               "given up: terminated, not pending")


def test_secrets_and_urls_stay_out_of_logs_health_and_metrics(hooked: Stack, receiver: Receiver) -> None:
    health = httpx.get(hooked.url + "/healthz", timeout=5).text
    metrics_text = httpx.get(hooked.url + "/metrics", timeout=5).text
    logs = "\n".join(hooked.log(n) for n in hooked.procs)
    gateway = [json.loads(line) for line in hooked.log("gateway").splitlines() if line.startswith("{")]
    logged = {line["event"] for line in gateway}
    assert {"notify.consuming", "notify.retry", "notify.gave_up"} <= logged, "the deliveries were logged"
    assert "Traceback" not in hooked.log("gateway")
    gave_up = next(line for line in gateway if line["event"] == "notify.gave_up" and line["webhook"] == "stuck")
    assert gave_up["attempt"] == MAX_ATTEMPTS and gave_up["last"] in ("TimeoutError", "ReadTimeout")
    for secret in (APPROVALS_SECRET, TURNS_SECRET, STUCK_SECRET, OTHER_SECRET):
        for where, text in (("health", health), ("metrics", metrics_text), ("logs", logs)):
            assert secret not in text, f"a webhook secret in {where}"
    for where, text in (("health", health), ("metrics", metrics_text), ("logs", logs)):
        assert f":{receiver.port}/flaky" not in text, f"a webhook URL in {where}"
    names = {w["name"]: w for w in json.loads(health)["notify"]["webhooks"]}
    assert set(names) == {"approvals", "turns", "limits", "gate", "stuck"}
    assert names["stuck"]["events"] == ["approval.pending", "turn.end"]


def test_a_limit_warning_is_delivered(hooked: Stack, receiver: Receiver, api: Api) -> None:
    sid = api.create("hook-limits")["id"]
    looks = [{"name": "find_files", "args": {"pattern": p}} for p in ("*", "*.txt", "*.md", "*.py")]
    assert api.send(sid, script({"tools": looks}, {"text": "looked"})).status_code == 202
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed", end
    warning = of_type(evs, "limit.warning")
    assert warning and warning[0]["limit"] == "tool_calls", "4 of 5 tool calls passes warn_at 0.8"
    wait_until(lambda: receiver.of("/limits", sid), 30, "the warning delivered")
    hits = receiver.of("/limits", sid)
    assert [h.event for h in hits] == warning
    assert signed(hits[0], OTHER_SECRET) and hits[0].headers[notify.EVENT_HEADER] == "limit.warning"


def test_two_gateways_share_each_webhook_and_deliver_every_event_once(hooked: Stack, receiver: Receiver,
                                                                     api: Api) -> None:
    from cox.servers import free_port

    port = free_port()
    env = dict(hooked.env)
    hooked.env["COX_PORT"] = str(port)
    try:
        hooked.spawn("gateway-2", "cox_gateway")
    finally:
        hooked.env = env
    second = f"http://127.0.0.1:{port}"

    def both() -> list[str]:
        return [hooked.url, second]

    def ready() -> bool:
        try:
            body = httpx.get(second + "/healthz", timeout=3).json()
        except (httpx.HTTPError, ValueError):
            return False
        hooks = body["notify"]["webhooks"]
        # ...and the earlier tests' turn ends all delivered: one still in flight when the counters
        # are first read would be counted among this test's (a CI run counted 7 for 6).
        turns = next(w for w in hooks if w["name"] == "turns")
        return (all(w["state"] == "running" for w in hooks)
                and turns.get("pending") == 0 and turns.get("ack_pending") == 0)

    try:
        wait_until(ready, 60, "a second gateway running its webhooks")
        before = sum(metric_at(u, "cox_webhook_delivered_total", webhook="turns") for u in both())
        sid = api.create("hook-two-gateways")["id"]
        for i in range(6):
            assert api.send(sid, script({"text": f"shared {i}"}), mode="queue").status_code == 202
        wait_until(lambda: len(of_type(api.all_events(sid), "turn.end")) == 6, 60, "six turns ended")
        wait_until(lambda: len(receiver.of("/ok", sid)) >= 6, 30, "six turn ends delivered")
        time.sleep(1.0)
        seqs = sorted(h.event["seq"] for h in receiver.of("/ok", sid))
        assert seqs == [e["seq"] for e in of_type(api.all_events(sid), "turn.end")], "each once, by one gateway"
        after = sum(metric_at(u, "cox_webhook_delivered_total", webhook="turns") for u in both())
        assert after - before == 6, "the gateways' counters add up to the deliveries"
    finally:
        hooked.kill("gateway-2")
        del hooked.procs["gateway-2"]  # gone on purpose: the stack's health checks must not count it


def test_deliveries_outlive_the_gateway_that_was_making_them(hooked: Stack, receiver: Receiver, api: Api) -> None:
    """The gateway dies while a delivery waits for its retry and while a turn ends: a new gateway
    delivers both, from where the durable consumer was (the second was recorded while no
    gateway ran)."""
    sid = api.create("hook-restart")["id"]
    assert api.send(sid, script({"text": "first"})).status_code == 202
    sleeper = script({"tools": [{"name": "run_command", "args": {"command": "sleep 5"}}]}, {"text": "second"})
    assert api.send(sid, sleeper, mode="queue").status_code == 202
    wait_until(lambda: receiver.of("/gate", sid), 30, "the first turn's end refused at the gate")
    killed = time.time()
    hooked.kill("gateway")
    store = hooked.redis_client()

    def idle() -> bool:
        return bool(store.hget(keys.session(sid), "busy") != "1")

    wait_until(idle, 30, "the second turn ended")  # busy holds from the first turn to the last queued
    receiver.gate_open = True
    restarted = time.time()
    # ... with another time-out: each existing consumer is updated (its ack wait), keeping its place
    hooked.env["COX_NOTIFY__TIMEOUT_S"] = str(TIMEOUT_S + 0.5)
    hooked.spawn("gateway", "cox_gateway")
    hooked.wait_healthy(60)

    wait_until(lambda: sum(h.status == 200 for h in receiver.of("/gate", sid)) >= 2, 60, "both turn ends delivered")
    ends = of_type(api.all_events(sid), "turn.end")
    assert len(ends) == 2
    assert killed * 1000 < ends[1]["ts"] < restarted * 1000, "the second turn ended while no gateway ran"
    by_seq: dict[int, list[Hit]] = {}
    for h in receiver.of("/gate", sid):
        by_seq.setdefault(h.event["seq"], []).append(h)
    assert sorted(by_seq) == [e["seq"] for e in ends]
    first, second = by_seq[ends[0]["seq"]], by_seq[ends[1]["seq"]]
    assert [h.status for h in first][-1] == 200 and all(h.status == 503 for h in first[:-1]) and len(first) >= 2
    assert len({h.delivery for h in first}) == 1, "the retry after the restart kept its delivery id"
    assert [h.status for h in second] == [200]
    for h in first + second:
        assert signed(h, OTHER_SECRET)
    time.sleep(1.5)
    assert sum(h.status == 200 for h in receiver.of("/gate", sid)) == 2, "each delivered once"
    updated = [json.loads(line) for line in hooked.log("gateway").splitlines()
               if line.startswith("{") and '"notify.consumer_updated"' in line]
    assert {u["webhook"] for u in updated} == {"approvals", "turns", "limits", "gate", "stuck"}
    assert all(u["changed"] == ["ack_wait"] for u in updated)


def test_a_gateway_without_its_webhook_secret_refuses_to_start(tmp_path: Path) -> None:
    config = """
[[notify.webhooks]]
name = "nokey"
url = "http://127.0.0.1:9/hook"
events = ["turn.end"]
secret_env = "TEST_HOOK_SECRET_UNSET"
"""
    stack = Stack(tmp_path, runners=0, config=config)
    try:
        with pytest.raises(RuntimeError, match="gateway exited") as err:
            stack.start(timeout=60)
    finally:
        stack.stop()
    assert "TEST_HOOK_SECRET_UNSET is unset or empty" in str(err.value)
    assert "notify.secret_missing" in stack.log("gateway")
