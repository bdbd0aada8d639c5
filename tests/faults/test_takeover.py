"""Takeover and fencing with real processes: kill -9 a runner mid-turn, pause one past its
lease (frozen, or SIGSTOP where the tests cannot make cgroups: ``Stack.pause``), Stop a session whose runner is dead; and the takeover time at the test and the default
lease TTL (printed; run with ``-s`` to see it)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import psutil
import pytest

from coxswain import subjects
from coxswain.models import KeepRequest
from tests.support.library import Library
from tests.support.logcheck import log_of, replay
from tests.support.runners import holder, records, respawn, running, wait_log
from tests.support.stack import CLUSTER_KINDS, Api, Stack, script

# 4 s, not 2: in CI's drill lane a fresh stack's first turn lapsed a 2 s lease before its first
# command (both runners held 2.4-3.3 s at once beside the other lanes, loop.stalled) and the test
# waited for a decision that a takeover had crashed. Every bound below scales with it.
LEASE_MS = 4000
DEFAULT_LEASE_MS = 5000
MEASURED: dict[int, list[float]] = {}


@pytest.fixture(scope="module", params=CLUSTER_KINDS)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cluster = request.param == "cluster"
    s = Stack(tmp_path_factory.mktemp("takeover-" + request.param), runners=2, lease_ms=LEASE_MS,
              redis_cluster=cluster, nats_cluster=cluster)
    s.start()
    try:
        yield s
    finally:
        s.stop()
        for lease, samples in sorted(MEASURED.items()):
            print(f"takeover at lease {lease} ms: kill -9 -> crashed turn.end "
                  f"{', '.join(f'{x:.0f}' for x in samples)} ms")


def ok(r: Any, status: int = 202) -> dict[str, Any]:
    assert r.status_code == status, r.text
    return dict(r.json())


def quick(label: str, write: bool = False) -> str:
    steps: list[dict[str, Any]] = []
    if write:
        steps.append({"tools": [{"name": "write_file", "args": {"path": f"{label}.txt", "content": label}}]})
    steps.append({"text": f"{label} done"})
    return script(*steps, text=label)


def the_other(stack: Stack, name: str) -> str:
    return next(n for n in stack.runner_names() if n != name)


def turn_in_command(stack: Stack, api: Api, sid: str, command: str = "sleep 30") -> tuple[dict[str, Any], str]:
    """Start a turn that runs ``command``; once it runs: (the reply with its turn_id, its runner)."""
    first = ok(api.send(sid, script({"text": "Working.", "tools": [{"name": "run_command",
                                                                     "args": {"command": command}}]})))
    start = api.wait_type(sid, "turn.start", message_id=first["message_id"])
    api.wait_type(sid, "policy.decision", actor="judge", timeout=30)
    name, _ = holder(stack, start["turn_id"])
    return {**first, "turn_id": start["turn_id"]}, name


def test_kill_9_mid_turn_the_queue_runs_in_order_and_the_dead_turn_ends_crashed(stack: Stack, api: Api) -> None:
    sid = api.create("kill9")["id"]
    first, victim = turn_in_command(stack, api, sid, command="sleep 31.7")
    queued = [ok(api.send(sid, quick(f"q{i}", write=(i == 1)), mode="queue")) for i in range(3)]
    _, command = running(stack, "31.7", [victim])
    killed_at = time.time()
    stack.kill(victim)
    try:
        # The dead runner's command does not run on as an orphan (it dies with its runner).
        deadline = time.monotonic() + 10
        while command.is_running() and command.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not command.is_running() or command.status() == psutil.STATUS_ZOMBIE
        end = api.wait_type(sid, "turn.end", turn_id=first["turn_id"], timeout=LEASE_MS / 1000 + 15)
        took = end["ts"] - killed_at * 1000
        MEASURED.setdefault(LEASE_MS, []).append(took)
        assert end["outcome"] == "crashed", end
        assert took < LEASE_MS + 3000, f"takeover took {took:.0f} ms"
        api.wait_type(sid, "turn.start", message_id=queued[-1]["message_id"], timeout=30)
        api.wait_idle(sid, timeout=30)
        evs = log_of(api, sid)
        r = replay(evs)
        assert r.starts == [first["message_id"], *(q["message_id"] for q in queued)]
        assert [r.outcome_of(m) for m in r.starts] == ["crashed", "completed", "completed", "completed"]
        # the dead turn's open command got a result saying so: no dangling call in the transcript
        res = [e for e in evs if e["type"] == "tool.result" and e["turn_id"] == first["turn_id"]]
        assert len(res) == 1 and not res[0]["ok"] and "crashed" in res[0]["output"]
        survivor = the_other(stack, victim)
        for q in queued:
            assert holder(stack, r.turn_of[q["message_id"]])[0] == survivor
        assert (Path(api.session(sid)["workspace"]) / "q1.txt").read_text() == "q1"
    finally:
        respawn(stack, victim)


READS = 400


def among_reads(stack: Stack, api: Api, label: str, queued: str) -> tuple[str, dict[str, Any], str, dict[str, Any]]:
    """A session whose turn is one response of :data:`READS` slow reads (a search through 600
    files each: tens of ms), recorded as a group while the next read runs, five of them done,
    and ``queued`` (a script) queued behind it: (sid, the turn's turn.start, the runner holding
    it, the queued send's reply)."""
    s = api.create(label)
    sid, ws = s["id"], Path(s["workspace"])
    for i in range(600):
        (ws / f"f{i:03d}.txt").write_text(f"line {i}\n" * 200)
    calls = [{"name": "search_text", "args": {"pattern": f"absent-{k}"}} for k in range(READS)]
    first = ok(api.send(sid, script({"text": "Searching.", "tools": calls}, {"text": "searched"})))
    start = api.wait_type(sid, "turn.start", message_id=first["message_id"])
    deadline = time.monotonic() + 30
    while sum(1 for e in log_of(api, sid) if e["type"] == "tool.result" and e.get("turn_id") == start["turn_id"]) < 5:
        assert time.monotonic() < deadline, "fewer than 5 results"
        time.sleep(0.05)
    victim, _ = holder(stack, start["turn_id"])
    return sid, start, victim, ok(api.send(sid, queued, mode="queue"))


def taken_over(api: Api, sid: str, start: dict[str, Any], after: dict[str, Any]) -> None:
    """The takeover ended ``start``'s turn ``crashed`` and ran the queued message ``after``."""
    end = api.wait_type(sid, "turn.end", turn_id=start["turn_id"], timeout=LEASE_MS / 1000 + 15)
    assert end["outcome"] == "crashed", end
    api.wait_type(sid, "turn.start", message_id=after["message_id"], timeout=30)
    api.wait_idle(sid, timeout=30)


def test_kill_9_during_a_group_of_reads_leaves_a_log_the_takeover_goes_on_from(stack: Stack, api: Api) -> None:
    """Reads whose records are on their way when the runner dies: whatever reached Redis is in
    the log in order, every call the response opened is closed once (a result, or a skip by the
    takeover), and the queued message runs next on the other runner."""
    sid, start, victim, after = among_reads(stack, api, "kill9-reads", quick("after-reads", write=True))
    stack.kill(victim)
    try:
        taken_over(api, sid, start, after)
        evs = log_of(api, sid)
        r = replay(evs)  # seqs by one, every opened call closed before its turn's end, no stale writer
        assert [r.outcome_of(m) for m in r.starts] == ["crashed", "completed"]
        mine = [e for e in evs if e.get("turn_id") == start["turn_id"] and e["type"] in ("tool.result", "tool.skipped")]
        ids = [e["call_id"] for e in mine]
        assert len(ids) == len(set(ids)) == READS, "each call closed exactly once"
        done = [e for e in mine if e["type"] == "tool.result" and e["ok"]]
        assert 5 <= len(done) < READS, "the runner died among the reads"
        assert (Path(api.session(sid)["workspace"]) / "after-reads.txt").read_text() == "after-reads"
    finally:
        respawn(stack, victim)


def test_a_runner_paused_during_a_group_of_reads_records_nothing_after_the_takeover(stack: Stack, api: Api) -> None:
    """Pause the holder among its reads (a record on its way), until the other runner has taken
    over and run the queued message; resumed, the record the fence refuses stops it: nothing
    of the stale turn lands, however many reads it had left."""
    sid, start, victim, after = among_reads(stack, api, "sigstop-reads", quick("after-pause"))
    since = len(stack.log(victim))
    stack.pause(victim)
    try:
        taken_over(api, sid, start, after)
        seq_before = log_of(api, sid)[-1]["seq"]
    finally:
        stack.resume(victim)
    wait_log(stack, victim, ("lease.deadline_passed", "drive.lease_lost", "lease.lost"), timeout=20, sid=sid)
    time.sleep(1.0)  # the reads it had left would have gone on recording by now
    api.wait_idle(sid)
    evs = log_of(api, sid)
    assert evs[-1]["seq"] == seq_before, f"events after the stale runner woke: {evs[seq_before:]}"
    r = replay(evs)
    assert [r.outcome_of(m) for m in r.starts] == ["crashed", "completed"]
    assert {x.get("event") for x in records(stack, victim, since) if x.get("sid") == sid}, "the runner woke"


def test_a_runner_paused_past_its_lease_writes_nothing_after_the_takeover(stack: Stack, api: Api) -> None:
    """Pause the holder until another runner has taken over, then resume it: its deadline
    has passed, it stops its drive on waking, and nothing it held lands."""
    paused_past_lease(stack, api, LEASE_MS, woke=("lease.deadline_passed",))


def paused_past_lease(stack: Stack, api: Api, lease_ms: int, woke: tuple[str, ...],
                      never: tuple[str, ...] = ()) -> None:
    sid = api.create(f"sigstop-{lease_ms}")["id"]
    text = script({"text": "Working.", "tools": [{"name": "run_command", "args": {"command": "sleep 2.5"}}]},
                  {"tools": [{"name": "write_file", "args": {"path": "stale.txt", "content": "late"}}]},
                  {"text": "done"})
    first = ok(api.send(sid, text))
    start = api.wait_type(sid, "turn.start", message_id=first["message_id"])
    api.wait_type(sid, "policy.decision", actor="judge", timeout=30)
    after = ok(api.send(sid, quick("after", write=True), mode="queue"))
    # Paused the moment its command is seen, and only then is the log read for the token: reading
    # both runners' logs first (holder()) took long enough on a loaded CI host that the 2.5 s
    # command, and the rest of the turn, ended before the pause (the turn ended "completed").
    victim, command = running(stack, "sleep 2.5")
    stopped = stack.pause(victim)
    try:
        assert command.is_running() and command.status() != psutil.STATUS_ZOMBIE, \
            "the runner was paused after its command had ended: the drill set itself up too slowly"
        began, rec = holder(stack, start["turn_id"])
        assert began == victim, (began, victim)
        stale_token = str(rec["token"])
        since = len(stack.log(victim))
        end = api.wait_type(sid, "turn.end", turn_id=start["turn_id"], timeout=lease_ms / 1000 + 15)
        # Seen in CI several times while the pause was a SIGSTOP: 'completed', which only the
        # holder's own loop writes, so the paused runner ran on (any SIGCONT ends a SIGSTOP).
        # The pause is a freeze now where the tests run as root (Stack.pause). Should it recur, the
        # runner's state and what it logged meanwhile come first in the message.
        said = [r.get("event") for r in records(stack, victim, since)]
        assert end["outcome"] == "crashed", (f"the turn ended {end['outcome']!r} with runner {victim} paused "
                                             f"({stopped:.3f} s to pause), now {stack.state(victim)}; it logged "
                                             f"meanwhile: {said[-40:]}", end)
        api.wait_type(sid, "turn.start", message_id=after["message_id"], timeout=30)
        api.wait_idle(sid, timeout=30)
        # the paused runner's command finishes while it sleeps: on waking it has a result to write
        deadline = time.monotonic() + 30
        while command.is_running() and command.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the paused runner's command ends"
            time.sleep(0.05)
        seq_before = log_of(api, sid)[-1]["seq"]
    finally:
        stack.resume(victim)
    # On waking it finds its deadline passed (self-fence) or Redis refuses its token.
    wait_log(stack, victim, woke, timeout=20, sid=sid)
    seen = {r.get("event") for r in records(stack, victim, since) if r.get("sid") == sid}
    assert not seen & set(never), seen

    # Redis itself refuses the stale token, whatever the runner would try.
    r = stack.redis_client()
    try:
        body = json.dumps({"type": "agent.message", "sid": sid, "turn_id": start["turn_id"], "text": "late"})
        lib = Library(r)
        for fn, head in (
                ("cox_emit", lib(lib.fns.emit(sid=sid, token=stale_token, owner="test", ops=[], events=[body]))),
                ("cox_turn_end", lib(lib.fns.turn_end(sid=sid, token=stale_token, owner="test", end_body="",
                                                      next_turn_id="t_x", lease_ms=1000, plan="", handoff="",
                                                      hold_next="", agents_md=""))),
                ("cox_renew", json.loads(lib.queued(lib.fns.renew, sid=sid, token=stale_token, lease_ms=1000)[0])),
                ("cox_fence", lib(lib.fns.fence(sid=sid, token=stale_token, call_id="", intent="")))):
            assert dict(head).get("error") == "fenced", (fn, head)
    finally:
        r.close()
    # ... and so does versions for a write's keep.
    assert asyncio.run(_keep_with(stack, sid, api.session(sid)["workspace"], int(stale_token))) == "fenced"

    api.wait_idle(sid)
    evs = log_of(api, sid)
    assert evs[-1]["seq"] == seq_before, f"events after the stale runner woke: {evs[seq_before:]}"
    rep = replay(evs)  # no event of the crashed turn after its turn.end
    assert rep.starts == [first["message_id"], after["message_id"]]
    ws = Path(api.session(sid)["workspace"])
    assert not (ws / "stale.txt").exists(), "the stale runner wrote a file"
    assert (ws / "after.txt").read_text() == "after"
    # the woken runner still serves: new turns run to their end
    for i in range(2):
        more = ok(api.send(sid, f"one more {i}"))
        st = api.wait_type(sid, "turn.start", message_id=more["message_id"])
        assert api.wait_type(sid, "turn.end", turn_id=st["turn_id"], timeout=30)["outcome"] == "completed"


async def _keep_with(stack: Stack, sid: str, workspace: str, token: int) -> str:
    nc = await nats.connect(stack.nats.admin_url)
    try:
        req = KeepRequest(sid=sid, workspace=workspace, path="stale.txt", token=token)
        msg = await nc.request(subjects.rpc(subjects.VERSIONS, "keep"), req.model_dump_json().encode(), timeout=10)
        return str(json.loads(msg.data).get("error"))
    finally:
        await nc.close()


def test_stop_on_a_session_whose_runner_died_ends_it_crashed_and_starts_nothing(stack: Stack, api: Api) -> None:
    sid = api.create("orphan")["id"]
    first = ok(api.send(sid, script({"tools": [
        {"name": "write_file", "args": {"path": "Makefile", "content": "all:\n"}},
        {"name": "run_command", "args": {"command": "echo later"}}]})))
    start = api.wait_type(sid, "turn.start", message_id=first["message_id"])
    pending = api.wait_type(sid, "approval.pending", timeout=30)
    victim, _ = holder(stack, start["turn_id"])
    queued = [ok(api.send(sid, quick(f"w{i}"), mode="queue"))["message_id"] for i in range(2)]
    stack.kill(victim)
    try:
        t0 = time.monotonic()
        res = ok(api.http.post(f"/v1/sessions/{sid}/stop"), 200)
        waited = time.monotonic() - t0
        assert res["turn_id"] == start["turn_id"] and res["discarded"] == queued
        view = api.session(sid)
        assert view["busy"] is False, f"Stop answered after {waited:.1f}s with the session still busy"
        assert view["approvals"] == [], "the dead turn's approval is closed"
        answer = api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "allow"})
        assert answer.status_code == 409 and answer.json()["error"] == "resolved"
        evs = log_of(api, sid)
        r = replay(evs)
        assert r.starts == [first["message_id"]], "no discarded message started"
        assert r.outcome_of(first["message_id"]) == "crashed"
        assert r.discarded == [queued]
        closed = {e["call_id"] for e in evs if e["type"] in ("tool.result", "tool.skipped")}
        opened = {c["call_id"] for e in evs if e["type"] == "assistant.msg" for c in e.get("tool_calls") or []}
        assert opened and opened == closed
        assert not (Path(view["workspace"]) / "Makefile").exists()
    finally:
        respawn(stack, victim)


def test_at_the_default_lease_takeover_time_and_the_redis_fence_alone(stack: Stack, api: Api) -> None:
    """Both runners restarted with the default lease TTL and self-fencing off: kill -9 the holder
    twice (the takeover time), then pause one past its lease: Redis alone refuses it on waking."""
    for name in stack.runner_names():
        respawn(stack, name, env={"COX_RUNNER__LEASE_MS": str(DEFAULT_LEASE_MS), "COX_RUNNER__SELF_FENCE": "false"})
    try:
        for i in range(2):
            sid = api.create(f"default-lease-{i}")["id"]
            first, victim = turn_in_command(stack, api, sid)
            nxt = ok(api.send(sid, quick("next"), mode="queue"))
            killed_at = time.time()
            stack.kill(victim)
            end = api.wait_type(sid, "turn.end", turn_id=first["turn_id"], timeout=DEFAULT_LEASE_MS / 1000 + 15)
            took = end["ts"] - killed_at * 1000
            MEASURED.setdefault(DEFAULT_LEASE_MS, []).append(took)
            assert end["outcome"] == "crashed"
            assert took < DEFAULT_LEASE_MS + 3000, f"takeover took {took:.0f} ms"
            api.wait_type(sid, "turn.start", message_id=nxt["message_id"], timeout=30)
            api.wait_idle(sid, timeout=30)
            replay(log_of(api, sid))
            respawn(stack, victim)
        paused_past_lease(stack, api, DEFAULT_LEASE_MS, woke=("lease.lost", "drive.lease_lost"),
                          never=("lease.deadline_passed",))
    finally:
        for name in stack.runner_names():
            respawn(stack, name, env={"COX_RUNNER__LEASE_MS": str(LEASE_MS), "COX_RUNNER__SELF_FENCE": "true"})


def test_a_runner_stopped_with_sigterm_hands_its_queue_to_another(stack: Stack, api: Api) -> None:
    """A graceful restart: the running turn ends ``canceled`` (its open call closed) and the
    queue goes on, in order, on the other runner."""
    sid = api.create("sigterm")["id"]
    first, victim = turn_in_command(stack, api, sid)
    queued = [ok(api.send(sid, quick(f"h{i}"), mode="queue")) for i in range(3)]
    stack.signal(victim, signal.SIGTERM)
    try:
        stack.procs[victim].wait(30)
        assert stack.procs[victim].returncode == 0, stack.log(victim)[-3000:]
        api.wait_type(sid, "turn.start", message_id=queued[-1]["message_id"], timeout=30)
        api.wait_idle(sid, timeout=30)
        evs = log_of(api, sid)
        r = replay(evs)
        assert r.starts == [first["message_id"], *(q["message_id"] for q in queued)]
        assert [r.outcome_of(m) for m in r.starts] == ["canceled", "completed", "completed", "completed"]
        survivor = the_other(stack, victim)
        for q in queued:
            assert holder(stack, r.turn_of[q["message_id"]])[0] == survivor
    finally:
        respawn(stack, victim)


def test_a_send_whose_home_is_frozen_runs_elsewhere_once_and_the_thawed_home_does_not_run_it_again(
        stack: Stack, api: Api) -> None:
    """A home that does not answer (frozen here; a home killed a moment ago, whose NATS route
    still claims its subject, swallows a request the same way) does not hold the send for its
    30 s time-out: after ``bus.HOME_PATIENCE_S`` the gateway asks any runner too, under the
    request's one transition id. The thawed home then reads the same request: its call answers
    the other runner's reply and starts nothing, so the message runs once."""
    sid = api.create("frozen-home")["id"]
    sent = ok(api.send(sid, quick("first")))
    start = api.wait_type(sid, "turn.start", message_id=sent["message_id"])
    api.wait_idle(sid)
    home = holder(stack, start["turn_id"])[0]
    survivor = the_other(stack, home)
    stack.pause(home)
    try:
        t0 = time.monotonic()
        late = ok(api.send(sid, quick("while frozen")))
        took = time.monotonic() - t0
        # the request's time-out is 30 s; the queue group asked again each 1.25 s after the first
        # 2.5 s may pick the frozen home itself (1 in 2 a time): 20 s is 14 picks of it in a row
        assert took < 20, f"the send waited {took:.1f}s for its frozen home"
        start = api.wait_type(sid, "turn.start", message_id=late["message_id"], timeout=30)
        api.wait_idle(sid, timeout=30)
        assert holder(stack, start["turn_id"])[0] == survivor
    finally:
        stack.resume(home)
    # The thawed home reads what waited for it (the send's request among it) before it could
    # read a request sent after this point; wait for it to answer one, then send again.
    wait_log(stack, home, ("redis.tx_replayed",), timeout=30, fn="cox_send", sid=sid)
    again = ok(api.send(sid, quick("again")))
    api.wait_type(sid, "turn.start", message_id=again["message_id"])
    api.wait_idle(sid)
    r = replay(log_of(api, sid))
    assert r.starts == [sent["message_id"], late["message_id"], again["message_id"]], r.starts
    assert [r.outcome_of(m) for m in r.starts] == ["completed"] * 3


def test_a_sessions_turns_run_on_its_home_and_a_send_after_its_home_died_starts_elsewhere_at_once(
        stack: Stack, api: Api) -> None:
    """The gateway sends a session's sends to the runner its last turn ran on (``rpc.Op.home``):
    each idle turn starts there, from the transcript it kept. Killed, the next send starts on the
    other runner without waiting out a time-out, and the session's turns stay there."""
    sid = api.create("home")["id"]
    homes = []
    for i in range(5):
        sent = ok(api.send(sid, quick(f"home{i}")))
        start = api.wait_type(sid, "turn.start", message_id=sent["message_id"])
        api.wait_idle(sid)
        homes.append(holder(stack, start["turn_id"])[0])
    assert len(set(homes)) == 1, f"every idle turn on the session's home runner: {homes}"
    victim = homes[0]
    stack.kill(victim)
    try:
        t0 = time.monotonic()
        sent = ok(api.send(sid, quick("after")))
        took = time.monotonic() - t0
        assert took < 10, f"the send waited {took:.1f}s for the dead home"  # the request's time-out is 30 s
        start = api.wait_type(sid, "turn.start", message_id=sent["message_id"], timeout=30)
        api.wait_idle(sid, timeout=30)
        survivor = the_other(stack, victim)
        assert holder(stack, start["turn_id"])[0] == survivor
        sent = ok(api.send(sid, quick("again")))
        start = api.wait_type(sid, "turn.start", message_id=sent["message_id"])
        api.wait_idle(sid)
        assert holder(stack, start["turn_id"])[0] == survivor, "the survivor is the session's home now"
        r = replay(log_of(api, sid))
        assert [r.outcome_of(m) for m in r.starts] == ["completed"] * 7
    finally:
        respawn(stack, victim)
