"""Redis and NATS die (kill -9) and come back on the same port with the same data while people
send: the API answers 503 meanwhile, and every message answered 202 still runs, in order.

Senders behave like real clients: one request at a time per session, each message with a
``client_id``, retried with the same id after a 503 until it is answered 202.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.logcheck import check_accepted, log_of, replay
from tests.support.runners import holder, wait_log
from tests.support.stack import Api, Stack, script, stack_fixture

LEASE_MS = 2000
CONFIG = """
[approval]
commands = "allow"
"""


stack = stack_fixture("outage", runners=2, lease_ms=LEASE_MS, config=CONFIG)


class Sender(threading.Thread):
    """Queues messages to one session until told to stop; keeps every 202 and counts 503s."""

    def __init__(self, stack: Stack, sid: str, tag: str, refused_ok: bool = False) -> None:
        super().__init__(daemon=True)
        self.stack, self.sid, self.tag = stack, sid, tag
        self.refused_ok = refused_ok
        """The gateway itself dies: a refused or dropped connection is what a client meets; it
        retries with the same client_id (the dropped request may have been accepted)."""
        self.refused = 0
        self.replies: list[dict[str, Any]] = []
        self.unavailable = 0
        self.other: list[str] = []
        self.done = threading.Event()
        self.sent = threading.Event()

    def message(self, i: int) -> str:
        """The text of this sender's ``i``-th message (a turn of about 250 ms)."""
        return script({"text": f"{self.tag}-{i} done", "delay_ms": 250}, text=f"{self.tag}-{i}")

    def run(self) -> None:
        with self.stack.client(timeout=60) as api:
            i = 0
            while not self.done.is_set():
                text = self.message(i)
                while True:
                    try:
                        r = api.send(self.sid, text, mode="queue", client_id=f"{self.tag}-{i}")
                    except httpx.TransportError as exc:
                        if not self.refused_ok:
                            self.other.append(repr(exc))
                            return
                        self.refused += 1
                        time.sleep(0.1)
                        continue
                    except Exception as exc:  # noqa: BLE001 - a transport error is recorded, then fails the test
                        self.other.append(repr(exc))
                        time.sleep(0.2)
                        continue
                    if r.status_code == 202:
                        self.replies.append({**r.json(), "mode": "queue"})
                        self.sent.set()
                        break
                    if r.status_code == 503 and r.json().get("error") == "unavailable":
                        self.unavailable += 1
                        time.sleep(0.1)  # a client's back-off before retrying the same client_id
                        continue
                    self.other.append(f"{r.status_code} {r.text}")
                    time.sleep(0.1)
                i += 1
                # keep a backlog of a few messages, so turns start (from the queue) during an outage
                time.sleep(0.3 if (self.replies[-1].get("position") or 0) >= 5 else 0.03)


def run_senders(stack: Stack, api: Api, tag: str, outage: Any, n: int = 3, refused_ok: bool = False,
                sender: type[Sender] = Sender) -> list[Sender]:
    sids = [api.create(f"{tag}-{i}")["id"] for i in range(n)]
    senders = [sender(stack, sid, f"{tag}{i}", refused_ok) for i, sid in enumerate(sids)]
    for s in senders:
        s.start()
    for s in senders:
        assert s.sent.wait(30)
    # every session has a turn running and a message queued behind it
    deadline = time.monotonic() + 30
    while not all(any(x["disposition"] == "queued" for x in s.replies) and api.session(s.sid)["busy"]
                  for s in senders):
        assert time.monotonic() < deadline, "every session has a turn running and a queue behind it"
        time.sleep(0.05)
    outage(sids)
    counts = [len(s.replies) for s in senders]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(len(s.replies) < c + 3 for s, c in zip(senders, counts, strict=True)):
        time.sleep(0.1)  # after the outage every sender gets more messages through
    for s in senders:
        s.done.set()
    for s in senders:
        s.join(60)
        assert not s.is_alive()
    return senders


def check_all_ran(api: Api, senders: list[Sender]) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    for s in senders:
        api.wait_idle(s.sid, timeout=90)
        r = replay(log_of(api, s.sid))
        check_accepted(r, s.replies)
        assert r.starts == [x["message_id"] for x in s.replies], "every message answered 202 ran, in order"
        assert not r.discarded
        for o in r.ends.values():
            outcomes[o] = outcomes.get(o, 0) + 1
        assert not s.other, s.other
    return outcomes


def test_redis_killed_and_restarted_during_sends(stack: Stack, api: Api) -> None:
    seen: dict[str, Any] = {}

    def outage(sids: list[str]) -> None:
        stack.redis.kill()
        try:
            for path in (f"/v1/sessions/{sids[0]}", f"/v1/sessions/{sids[0]}/events?format=json"):
                r = api.http.get(path)
                assert r.status_code == 503 and r.json()["error"] == "unavailable", (path, r.text)
            r = api.send(sids[0], "while redis is down", mode="queue")
            assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
            r = api.http.post(f"/v1/sessions/{sids[0]}/stop")
            assert r.status_code == 503, r.text
            seen["down"] = True
            time.sleep(1.0)  # the outage lasts a while: senders meet it too
        finally:
            stack.redis.start()

    senders = run_senders(stack, api, "redis", outage)
    assert seen.get("down")
    assert sum(s.unavailable for s in senders) > 0
    outcomes = check_all_ran(api, senders)
    print(f"redis outage: {sum(len(s.replies) for s in senders)} messages answered 202, "
          f"{sum(s.unavailable for s in senders)} sends answered 503, outcomes {outcomes}")
    assert set(outcomes) <= {"completed", "crashed"}, outcomes


def test_nats_killed_and_restarted_during_sends(stack: Stack, api: Api) -> None:
    seen: dict[str, Any] = {}
    # The probe's own session: a send made just as NATS dies may still be accepted (on a loaded
    # machine the killed server can take a moment to go), and it must not join a sender's log,
    # whose every message is checked against that sender's replies.
    probe = api.create("nats-probe")["id"]

    def outage(sids: list[str]) -> None:
        stack.nats.kill()
        try:
            deadline = time.monotonic() + 10
            while True:  # the gateway notices the lost connection at once or within a moment
                r = api.send(probe, "while nats is down", mode="queue")
                if r.status_code == 503 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
            r = api.http.get(f"/v1/sessions/{sids[0]}/events", params={"format": "json"})
            assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
            # the session store is up: reading a session still works
            assert api.http.get(f"/v1/sessions/{sids[0]}").status_code == 200
            seen["down"] = True
            time.sleep(1.0)
        finally:
            stack.nats.start()

    senders = run_senders(stack, api, "nats", outage)
    assert seen.get("down")
    assert sum(s.unavailable for s in senders) > 0
    outcomes = check_all_ran(api, senders)
    print(f"nats outage: {sum(len(s.replies) for s in senders)} messages answered 202, "
          f"{sum(s.unavailable for s in senders)} sends answered 503, outcomes {outcomes}")
    assert set(outcomes) <= {"completed", "crashed"}, outcomes


def test_the_gateway_killed_and_restarted_during_sends(stack: Stack, api: Api) -> None:
    def outage(sids: list[str]) -> None:
        stack.kill("gateway")
        time.sleep(0.5)
        stack.spawn("gateway", "cox_gateway")
        stack.wait_healthy(60)

    senders = run_senders(stack, api, "gw", outage, refused_ok=True)
    assert sum(s.refused for s in senders) > 0, "the senders met the gateway down"
    outcomes = check_all_ran(api, senders)
    assert set(outcomes) == {"completed"}, outcomes


def test_a_runner_that_cannot_renew_stops_itself_before_its_lease_lapses(stack: Stack, api: Api) -> None:
    """Redis goes away mid-command: the holder's deadline passes without a renewal and it kills
    its command (which would have written a file); Redis back, the turn ends crashed."""
    s = api.create("self-fence")
    sid = s["id"]
    first = api.send(sid, script({"tools": [{"name": "run_command", "args": {"command": "sleep 3; touch late.txt"}}]},
                                 {"text": "done"}))
    assert first.status_code == 202, first.text
    nxt = api.send(sid, "after", mode="queue")
    assert nxt.status_code == 202
    start = api.wait_type(sid, "turn.start", message_id=first.json()["message_id"])
    api.wait_type(sid, "policy.decision", actor="setting", timeout=30)
    victim, _ = holder(stack, start["turn_id"])
    t0 = time.monotonic()
    stack.redis.kill()
    try:
        wait_log(stack, victim, ("lease.deadline_passed",), timeout=8, sid=sid)
        assert time.monotonic() - t0 < 3.0, "it stopped itself before the command would have written"
        time.sleep(max(0.0, 3.8 - (time.monotonic() - t0)))  # past the moment the command would write
        assert not (Path(s["workspace"]) / "late.txt").exists(), "the command outlived its runner's lease"
    finally:
        stack.redis.start()
    end = api.wait_type(sid, "turn.end", turn_id=start["turn_id"], timeout=30)
    assert end["outcome"] == "crashed"
    api.wait_type(sid, "turn.start", message_id=nxt.json()["message_id"], timeout=30)
    api.wait_idle(sid, timeout=30)
    replay(log_of(api, sid))
