"""A run survives kill -9 of its runner (docs/api.md, "Runs"; docs/design.md, "Runs"): the dead
turn ends ``crashed`` in the takeover's ``cox_turn_end``, which queues the run's one ``continue``
in the same call, so the run goes on in the next turn with nothing lost and nothing doubled, and
the dead runner's run slot lapses by itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from coxswain import keys
from tests.support.checks import calls_closed, of_type, seqs_rise
from tests.support.runners import holder, respawn, running
from tests.support.stack import CLUSTER_KINDS, Api, Stack, script, tool

LEASE_MS = 4000  # as test_takeover's drill stacks: a fresh stack's first turn must not lapse a 2 s lease


@pytest.fixture(scope="module", params=CLUSTER_KINDS)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cluster = request.param == "cluster"
    s = Stack(tmp_path_factory.mktemp("run-takeover-" + request.param), runners=2, lease_ms=LEASE_MS,
              redis_cluster=cluster, nats_cluster=cluster, config="[runs]\nmax_active = 1\n")
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _kill_holder(stack: Stack, api: Api, sid: str, turn_n: int, marker: str) -> str:
    """Kill -9 the runner running the run's ``turn_n``-th turn once its command runs."""
    deadline = time.monotonic() + 60
    while True:
        starts = of_type(api.all_events(sid), "turn.start")
        if len(starts) >= turn_n:
            break
        assert time.monotonic() < deadline, f"turn {turn_n} did not start"
        time.sleep(0.1)
    victim, _ = holder(stack, starts[turn_n - 1]["turn_id"], timeout=30)
    running(stack, marker, [victim], timeout=15)
    stack.kill(victim)
    return victim


def test_a_run_whose_runner_is_killed_twice_goes_on_with_one_continue_each_time(stack: Stack, api: Api) -> None:
    text = script({"tools": [tool("run_command", command="sleep 31.1")]},
                  {"tools": [tool("run_command", command="sleep 31.2")]},
                  {"text": "Done."})
    r = api.http.post("/v1/runs", json={"workspace": "run-kill", "text": text, "confirm": "yolo",
                                        "unattended": True, "max_turns": 3})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    first = _kill_holder(stack, api, sid, 1, "31.1")
    try:
        second = _kill_holder(stack, api, sid, 2, "31.2")
        respawn(stack, first)
        try:
            end = api.wait_type(sid, "run.end", timeout=LEASE_MS / 1000 * 2 + 60)
            api.wait_idle(sid, timeout=30)
        finally:
            respawn(stack, second)
    finally:
        if stack.procs[first].poll() is not None:
            respawn(stack, first)
    evs = api.all_events(sid)
    calls_closed(evs)
    seqs_rise(evs)
    assert (end["outcome"], end["turns"]) == ("completed", 3)
    assert [e["outcome"] for e in of_type(evs, "turn.end")] == ["crashed", "crashed", "completed"]
    cont = [e for e in of_type(evs, "user.msg") if e["via"] == "run"]
    assert [c["text"] for c in cont] == ["continue", "continue"], "one continue per unfinished turn"
    assert len({c["message_id"] for c in cont}) == 2
    starts = of_type(evs, "turn.start")
    assert [s["message_id"] for s in starts[1:]] == [c["message_id"] for c in cont]
    assert len(of_type(evs, "run.start")) == 1 and len(of_type(evs, "run.end")) == 1
    assert api.session(sid)["run"] == {"state": "ended", "confirm": "yolo", "unattended": True, "max_turns": 3,
                                       "turns": 3, "outcome": "completed"}
    # the dead runners' slots lapsed by themselves (max_active 1: the turns after them got one)
    client = stack.redis_client()
    try:
        deadline = time.monotonic() + LEASE_MS / 1000 + 5
        while client.zcard("cox:{runs}:slots") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.zcard("cox:{runs}:slots") == 0
    finally:
        client.close()


def check_in_background(stack: Stack, sid: str, command: str) -> tuple[threading.Thread, dict[str, Any]]:
    """``POST .../check`` of ``command`` in a thread (started): the thread, and the dict that gets
    the answer's status, body, when it came (``at``) and how long it took."""
    answer: dict[str, Any] = {}

    def post() -> None:
        t0 = time.monotonic()
        with stack.client() as own:  # a client of its own: httpx's is not for two threads
            r = own.http.post(f"/v1/sessions/{sid}/check", json={"command": command, "timeout_s": 60}, timeout=120)
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {"text": r.text}
        answer.update(status=r.status_code, body=body, at=time.monotonic(), took=time.monotonic() - t0)

    poster = threading.Thread(target=post, daemon=True)
    poster.start()
    return poster, answer


def test_a_check_whose_runner_is_killed_answers_503_at_once_and_runs_again_elsewhere(
        stack: Stack, api: Api) -> None:
    """A check runs under the session's lease on whichever runner took the request. Killed there,
    the request had no one left to answer it and waited for its 600 s bound (CI: a sweep's
    check hung past the test's 240 s after its runner was killed). The gateway watches the lease
    the check holds: gone, it answers 503 and the check can be sent again."""
    sid = api.create("check-kill")["id"]
    marker = f"sleep 29.{int(time.monotonic() * 1000) % 1000:03d}"
    poster, answer = check_in_background(stack, sid, marker)
    victim, _ = running(stack, marker, timeout=30)  # the runner running the check's command
    killed_at = time.monotonic()
    stack.kill(victim)
    try:
        poster.join(60)
        assert answer, "the check was not answered within 60 s of its runner's death"
        assert answer["status"] == 503 and answer["body"]["error"] == "unavailable", answer
        assert answer["at"] - killed_at < LEASE_MS / 1000 * 3 + 5, answer
        r = api.http.post(f"/v1/sessions/{sid}/check", json={"command": "echo again"}, timeout=60)
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    finally:
        respawn(stack, victim)


def test_a_check_whose_runner_died_is_answered_503_only_once_sending_it_again_can_run(
        stack: Stack, api: Api) -> None:
    """The 503 says "send it again": it must not come while the dead check still holds the session
    busy (its lease lapsed, nobody has taken it over yet), or the check sent again is 409 ``busy``
    "a turn is running" with no turn anywhere (CI, a loaded machine: the cluster drill). Here the
    other runner is paused past the lapse, so no takeover can come; resumed, it takes the session
    over, and the 503 follows."""
    sid = api.create("check-kill-paused")["id"]
    marker = f"sleep 28.{int(time.monotonic() * 1000) % 1000:03d}"
    poster, answer = check_in_background(stack, sid, marker)
    victim, _ = running(stack, marker, timeout=30)
    survivor = next(n for n in stack.runner_names() if n != victim)
    stack.pause(survivor)
    stack.kill(victim)
    redis = stack.redis_client()
    try:
        lease = keys.session(sid) + keys.LEASE
        deadline = time.monotonic() + LEASE_MS / 1000 * 2 + 5
        while redis.exists(lease):
            assert time.monotonic() < deadline, "the dead runner's lease did not lapse"
            time.sleep(0.05)
        assert redis.hget(keys.session(sid), "busy") == "1", "nobody can have taken it over yet"
        time.sleep(LEASE_MS / 2000 + 2.0)  # past the gateway's next look at the lease, and its 1 s grace
        assert not answer, f"answered while the session was still held by the dead check: {answer}"
        resumed_at = time.monotonic()
        stack.resume(survivor)
        poster.join(60)
        assert answer.get("status") == 503 and answer["body"]["error"] == "unavailable", answer
        assert answer["at"] - resumed_at < LEASE_MS / 1000 + 5, answer
        r = api.http.post(f"/v1/sessions/{sid}/check", json={"command": "echo again"}, timeout=60)
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    finally:
        stack.resume(survivor)
        redis.close()
        respawn(stack, victim)
