"""Fault drill: NATS (or a service) goes away under running turns and queued messages (``-m faults``).

A failed infrastructure call is never a tool outcome: a turn that cannot reach guard or versions
waits for them (bounded by ``[runner] infra_wait_s``), then ends ``unavailable``; queued
messages do not start while the services are unreachable, and run, in order, once they are
back; a request in flight when NATS dies is answered 503 at once, not after its timeout; Stop
ends a waiting turn at once. Real servers, real signals (kill -9, SIGSTOP), bounded in time.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.logcheck import check_accepted, log_of, replay
from tests.support.stack import Api, Stack, script, stack_fixture

pytestmark = pytest.mark.faults

WAIT_S = 4.0
"""The runners' bound on waiting for guard/versions within a turn (``[runner] infra_wait_s``)."""
INFRA_WORDS = ("not connected", "policy check failed", "did not answer", "no service answers", "unavailable",
               "message bus")

# 4 s, not 2: in CI's drill lanes (two beside each other on two cores) the short outage's NATS
# restart and every service's reconnect at once lapsed a 2 s lease twice: two turns nobody killed
# ended ``crashed`` (a takeover), though renewals go to Redis, which never went away. Nothing here
# times a takeover, so the lease only has to outlast the machine's load.
bus = stack_fixture("faults-bus", runners=2, lease_ms=4000,
                    env={"COX_RUNNER__INFRA_WAIT_S": str(WAIT_S)})


def why_crashed(stack: Stack) -> str:
    """What the services said about leases and loops, for a turn that ended ``crashed``."""
    words = ("loop.stalled", "lease.renew_failed", "lease.lost", "lease.claimed", "drive.lease_lost", "turn.crashed")
    return "\n".join(f"{name}: {line[:400]}" for name in stack.procs
                     for line in stack.log(name).splitlines() if any(w in line for w in words))


def measured(name: str, value: float) -> None:
    print(f"[faults] {name}: {value:.2f}")


def ok(r: httpx.Response, status: int = 202) -> dict[str, Any]:
    assert r.status_code == status, r.text
    return dict(r.json())


def writes(tag: str, n: int, delay_ms: int) -> str:
    steps = [{"tools": [{"name": "write_file", "args": {"path": f"{tag}/w{j}.txt", "content": f"{tag}-{j}"}}],
              "delay_ms": delay_ms} for j in range(n)]
    return script(*steps, {"text": f"{tag} done"}, text=f"{tag} writes")


def start_sessions(api: Api, tag: str, n: int, steps: int, queued: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """``n`` sessions, each with a running turn of ``steps`` writes and ``queued`` messages behind it."""
    out = []
    for i in range(n):
        sid = api.create(f"{tag}-{i}")["id"]
        replies = [{**ok(api.send(sid, writes(f"{tag}{i}-run", steps, 100))), "mode": "send"}]
        for k in range(queued):
            replies.append({**ok(api.send(sid, writes(f"{tag}{i}-q{k}", 3, 0), mode="queue")), "mode": "queue"})
        out.append((sid, replies))
    for sid, _ in out:
        api.wait_type(sid, "tool.result", timeout=30)  # each turn is writing
    return out


def waiting_for_guard(api: Api, sid: str, timeout: float = 30.0) -> None:
    """Wait (guard is down) until a call of the turn's latest response has neither a policy
    decision nor a result: it waits for guard (its ``tool.call`` comes with the decision)."""
    deadline = time.monotonic() + timeout
    while True:
        evs = api.all_events(sid)
        msgs = [e for e in evs if e["type"] == "assistant.msg"]
        done = {e["call_id"] for e in evs if e["type"] in ("policy.decision", "tool.result", "tool.skipped")}
        if msgs and any(c["call_id"] not in done for c in msgs[-1].get("tool_calls") or []):
            return
        assert time.monotonic() < deadline, f"{sid}: no call waiting for guard"
        time.sleep(0.1)


def infra_errors(evs: list[dict[str, Any]]) -> list[str]:
    return [e["output"] for e in evs if e["type"] == "tool.result" and not e["ok"]
            and any(w in e["output"] for w in INFRA_WORDS)]


def settle(api: Api, sessions: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, list[dict[str, Any]]]:
    logs = {}
    for sid, replies in sessions:
        api.wait_idle(sid, timeout=120)
        evs = log_of(api, sid)
        r = replay(evs)
        check_accepted(r, replies)
        assert r.starts == [x["message_id"] for x in replies], "every message ran, in order, none lost"
        assert not r.discarded
        logs[sid] = evs
    return logs


def starts_between(evs: list[dict[str, Any]], t0: float, t1: float) -> list[dict[str, Any]]:
    return [e for e in evs if e["type"] == "turn.start" and t0 * 1000 < e["ts"] < t1 * 1000]


def test_a_short_nats_outage_is_waited_out(bus: Stack) -> None:
    """NATS dies for 2 s (less than the bound): the turns wait and complete; nothing starts meanwhile."""
    bus.wait_healthy(60)  # after the last test's restart every service is connected again
    with bus.client(timeout=60) as api:
        sessions = start_sessions(api, "short", 4, 40, 2)
        t_kill = time.time()
        bus.nats.kill()
        try:
            time.sleep(2.0)
        finally:
            bus.nats.start()
        t_back = time.time()
        logs = settle(api, sessions)
        outcomes = [e["outcome"] for evs in logs.values() for e in evs if e["type"] == "turn.end"]
        errors = [o for evs in logs.values() for o in infra_errors(evs)]
        early = [e["message_id"] for evs in logs.values() for e in starts_between(evs, t_kill + 0.5, t_back)]
        resumed = [min(e["ts"] / 1000 for e in evs if e["type"] == "tool.result" and e["ts"] / 1000 > t_back)
                   - t_back for evs in logs.values()]
        print(f"[faults] short outage: outcomes {outcomes}, infra errors as tool results {len(errors)}, "
              f"turns started during the outage {len(early)}, the turns went on "
              f"{[round(x, 2) for x in resumed]} s after NATS was back")
        assert not errors, errors[:5]
        assert set(outcomes) == {"completed"}, f"{outcomes}\n{why_crashed(bus)}"
        assert not early, "a queued message started while NATS was down"


def test_a_long_nats_outage_ends_turns_unavailable_and_the_queue_waits(bus: Stack) -> None:
    """NATS dies for longer than the bound: the running turns end ``unavailable`` (saying which
    service), the queued messages wait and run after NATS is back, in order."""
    bus.wait_healthy(60)  # after the last test's restart every service is connected again
    with bus.client(timeout=60) as api:
        sessions = start_sessions(api, "long", 4, 40, 2)
        t_kill = time.time()
        bus.nats.kill()
        try:
            time.sleep(WAIT_S + 4.0)
        finally:
            bus.nats.start()
        t_back = time.time()
        logs = settle(api, sessions)
        errors = [o for evs in logs.values() for o in infra_errors(evs)]
        early = [e["message_id"] for evs in logs.values() for e in starts_between(evs, t_kill + 0.5, t_back)]
        first_ends = []
        for sid, replies in sessions:
            r = replay(logs[sid])
            end = next(e for e in logs[sid] if e["type"] == "turn.end"
                       and e["turn_id"] == r.turn_of[replies[0]["message_id"]])
            first_ends.append(end)
            for x in replies[1:]:
                assert r.outcome_of(x["message_id"]) == "completed", (x, r.ends)
        took = [e["ts"] / 1000 - t_kill for e in first_ends]
        # The bound runs from the start of the call that failed, which can precede the kill (a
        # guard request in flight, seen: a turn ended 7 ms short of WAIT_S after the kill). No
        # event of a turn is recorded while it waits in a call, so the call began at or after the
        # turn's last event before the kill: the bound is measured from there.
        waited = [e["ts"] / 1000 - max(x["ts"] / 1000 for x in logs[sid] if x["ts"] <= t_kill * 1000
                                       and x.get("turn_id") == e["turn_id"])
                  for (sid, _), e in zip(sessions, first_ends, strict=True)]
        print(f"[faults] long outage: running turns ended {[e['outcome'] for e in first_ends]} "
              f"{[round(t, 2) for t in took]} s after the kill; infra errors as tool results {len(errors)}; "
              f"turns started during the outage {len(early)}")
        assert not errors, errors[:5]
        for e in first_ends:
            assert e["outcome"] == "unavailable", e
            assert "guard" in e["detail"] or "versions" in e["detail"], e
        # ts is Redis's clock cut to the ms (floor) against this process's float clock.
        assert all(t < WAIT_S + 3.0 for t in took), took
        assert all(w >= WAIT_S - 0.002 for w in waited), (waited, took)
        assert not early, "a queued message started while NATS was down"


def test_a_request_in_flight_when_nats_dies_is_answered_503_at_once(bus: Stack) -> None:
    """The runners are paused, so a send is in flight (delivered, unanswered) when NATS dies."""
    bus.wait_healthy(60)  # after the last test's restart every service is connected again
    with bus.client(timeout=60) as api:
        sid = api.create("inflight")["id"]
        got: dict[str, Any] = {}

        def send() -> None:
            with bus.client(timeout=60) as c:
                got["r"] = c.send(sid, "in flight", client_id="inflight-1")
                got["t"] = time.monotonic()

        runners = bus.runner_names()
        for name in runners:
            bus.signal(name, signal.SIGSTOP)
        try:
            th = threading.Thread(target=send, daemon=True)
            th.start()
            time.sleep(0.5)
            assert "r" not in got, "the send is in flight"
            t0 = time.monotonic()
            bus.nats.kill()
            th.join(40)
            measured("nats_kill.inflight_503_s", got["t"] - t0)
        finally:
            for name in runners:
                bus.signal(name, signal.SIGCONT)
            bus.nats.start()
        r = got["r"]
        assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
        assert got["t"] - t0 < 2.0, f"answered {got['t'] - t0:.2f}s after NATS died"
        # 503 means "unknown": the same client_id is accepted or replayed, and runs once.
        deadline = time.monotonic() + 30
        while True:
            r = api.send(sid, "in flight", client_id="inflight-1")
            if r.status_code == 202 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        sent = ok(r)
        api.wait_idle(sid, timeout=30)
        rp = replay(log_of(api, sid))
        assert rp.starts == [sent["message_id"]]


def test_stop_ends_a_turn_waiting_for_guard_and_the_queue_waits_for_guard(bus: Stack) -> None:
    """guard is killed: the running turn waits for it; Stop ends that turn at once. In a second
    session the wait passes the bound: ``unavailable``, and its queued message does not start
    until guard is back."""
    bus.wait_healthy(60)  # after the last test's restart every service is connected again
    with bus.client(timeout=60) as api:
        (a, _), (b, b_replies) = start_sessions(api, "guard", 2, 40, 1)
        t_kill = time.time()
        bus.kill("guard")
        try:
            # session a: Stop while its turn waits for guard
            for sid in (a, b):  # both turns are at a write's policy check, waiting for guard
                waiting_for_guard(api, sid)
            t0 = time.monotonic()
            ok(api.http.post(f"/v1/sessions/{a}/stop"), 200)
            end = api.wait_type(a, "turn.end", timeout=10)
            measured("guard_down.stop_to_end_s", time.monotonic() - t0)
            assert end["outcome"] == "stopped", end
            # session b: the bound passes; Stop ended a's wait before it (order, not a stopwatch)
            end_b = api.wait_type(b, "turn.end", timeout=WAIT_S + 10)
            assert end["ts"] < end_b["ts"], (end, end_b)
            measured("guard_down.unavailable_after_s", end_b["ts"] / 1000 - t_kill)
            assert end_b["outcome"] == "unavailable" and "guard" in end_b["detail"], end_b
            time.sleep(2.0)
            assert api.session(b)["busy"], "the queued message waits, the session is not released"
            assert not starts_between(api.all_events(b), t_kill + 0.5, time.time()), "it started without guard"
        finally:
            bus.spawn("guard", "cox_guard")
        t_back = time.time()
        logs = settle(api, [(b, b_replies)])
        r = replay(logs[b])
        assert r.outcome_of(b_replies[1]["message_id"]) == "completed"
        assert not infra_errors(logs[b]) and not infra_errors(log_of(api, a))
        start = next(e for e in logs[b] if e["type"] == "turn.start" and e["message_id"] == b_replies[1]["message_id"])
        measured("guard_back.queued_started_after_s", start["ts"] / 1000 - t_back)


def test_a_repeated_keep_is_answered_with_the_version_already_kept(bus: Stack) -> None:
    """The turn repeats a versions keep whose answer the bus lost (``again``): one version per write."""
    import asyncio
    import json

    import nats
    import redis

    from coxswain import keys, subjects
    from coxswain.models import KeepRequest

    bus.wait_healthy(60)
    with bus.client(timeout=60) as api:
        s = api.create("again")
        sid = s["id"]
        (Path(s["workspace"]) / "a.txt").write_text("before\n")
        ok(api.send(sid, writes("again", 40, 100)))
        api.wait_type(sid, "tool.result", timeout=30)
        token = redis.Redis.from_url(bus.redis.admin_url, decode_responses=True).get(keys.session(sid) + keys.LEASE)
        assert token

        async def keep(call_id: str, again: bool) -> str:
            nc = await nats.connect(bus.nats.admin_url)
            try:
                body = KeepRequest(sid=sid, workspace=s["workspace"], path="a.txt", token=int(token),
                                   turn_id="t_x", call_id=call_id, again=again)
                msg = await nc.request(subjects.rpc(subjects.VERSIONS, "keep"), body.model_dump_json().encode(),
                                       timeout=10)
                reply = json.loads(msg.data)
                assert reply["ok"], reply
                return str(reply["result"]["version_id"])
            finally:
                await nc.close()

        first = asyncio.run(keep("c_again", False))
        assert asyncio.run(keep("c_again", True)) == first, "a repeat is answered with the version kept"
        assert asyncio.run(keep("c_other", True)) != first, "another call keeps its own version"
        ok(api.http.post(f"/v1/sessions/{sid}/stop"), 200)
        api.wait_idle(sid, timeout=30)
