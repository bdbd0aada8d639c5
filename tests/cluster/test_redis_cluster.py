"""A Redis master dies mid-run (``kill -9``) under 50 busy sessions with queues: its replica is
promoted, sends during the failover answer 202 or 503 (never 500), and every message answered
202 runs exactly once, in the order it was accepted; none is lost.

The stack runs on a local Redis Cluster of 3 masters + 3 replicas with ``[redis] wait_replicas
= 1``: a transition is acknowledged only once a replica holds it, so the promoted replica has
every one. A 503 is retried with the same ``client_id`` (idempotent), as a client would. The
promoted replica has no replica itself, so its slots answer 503 until the dead node is restarted
(it rejoins as a replica), as an operator would.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from coxswain import keys
from tests.support.logcheck import log_of, replay
from tests.support.stack import Api, Stack, script, stack_fixture

pytestmark = pytest.mark.cluster

SESSIONS = 50
MESSAGES = 5
RETRIES = 60

stack = stack_fixture("redis-failover", runners=2, lease_ms=2000, redis_cluster=True)


def turn(label: str) -> str:
    return script({"text": f"{label} working", "delay_ms": 250}, {"text": f"{label} done"}, text=label)


def send_until_answered(api: Api, sid: str, label: str, statuses: Counter[int]) -> dict[str, Any]:
    """Send (queue) with one client_id until it is answered 202; count every status seen."""
    cid = f"{sid}-{label}"
    for _ in range(RETRIES):
        try:
            r = api.send(sid, turn(label), mode="queue", client_id=cid)
        except Exception:  # noqa: BLE001 - a connection the gateway closed: retried like a 503
            statuses[0] += 1
            time.sleep(0.25)
            continue
        statuses[r.status_code] += 1
        if r.status_code == 202:
            return dict(r.json())
        assert r.status_code == 503, f"{label}: {r.status_code} {r.text}"
        time.sleep(0.25)
    raise AssertionError(f"{sid} {label}: no 202 after {RETRIES} tries")


def test_kill_9_a_redis_master_mid_run_loses_nothing_acknowledged(stack: Stack) -> None:
    with stack.client(timeout=60) as api:
        sids = [api.create(f"fo-{i}")["id"] for i in range(SESSIONS)]
    victim = stack.redis.master_of(keys.session(sids[0]))
    on_victim = [s for s in sids if stack.redis.master_of(keys.session(s)) is victim]
    accepted: dict[str, list[dict[str, Any]]] = {}
    statuses: Counter[int] = Counter()
    errors: list[BaseException] = []
    during: Counter[int] = Counter()
    killed = threading.Event()

    def worker(sid: str) -> None:
        try:
            with stack.client(timeout=60) as c:
                got: list[dict[str, Any]] = []
                after = 0
                # MESSAGES each, and on until two were sent after the kill: on a loaded machine the
                # wait for "every session running" could outlast a fixed count, and the failover
                # then met no send at all
                while len(got) < MESSAGES or (after < 2 and len(got) < MESSAGES * 6):
                    was_killed = killed.is_set()
                    seen: Counter[int] = Counter()
                    got.append(send_until_answered(c, sid, f"m{len(got)}", seen))
                    statuses.update(seen)
                    if was_killed:
                        during.update(seen)
                        after += 1
                    time.sleep(0.3)
                accepted[sid] = got
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(sid,)) for sid in sids]
    for t in threads:
        t.start()
    # mid-run: every session has been seen running a turn (a session whose queue drains between
    # two polls is never seen with one waiting, so "busy with a queue" could wait forever)
    deadline = time.monotonic() + 60
    running: set[str] = set()
    with stack.client(timeout=60) as api:
        while running != set(sids):
            assert time.monotonic() < deadline and not errors, errors or f"never seen running: {set(sids) - running}"
            for sid in set(sids) - running:
                if api.session(sid)["busy"]:
                    running.add(sid)
            time.sleep(0.05)
    killed_at, killed_wall = time.monotonic(), time.time()
    stack.redis.kill(victim)
    killed.set()
    stack.redis.wait_failed_over(victim, timeout=30)
    promoted = time.monotonic() - killed_at
    # The promoted replica has no replica of its own: with wait_replicas = 1 its slots answer 503
    # until one joins. The operator's move: restart the dead node; it comes back as a replica.
    time.sleep(1.0)
    victim.start()
    stack.redis.wait_ok(timeout=60)
    healed = time.monotonic() - killed_at
    for t in threads:
        t.join(180)
    assert not errors, repr(errors[0])
    assert set(statuses) <= {0, 202, 503}, statuses
    assert statuses[500] == 0
    with stack.client(timeout=60) as api:
        for sid in sids:
            api.wait_idle(sid, timeout=120)
        outcomes: Counter[str] = Counter()
        crashed_elsewhere = 0
        for sid in sids:
            r = replay(log_of(api, sid))
            crashed_elsewhere += sid not in on_victim and "crashed" in r.ends.values()
            want = [a["message_id"] for a in accepted[sid]]
            assert len(set(want)) == len(want) >= MESSAGES, (sid, want)
            assert r.starts == want, f"{sid}: ran {r.starts}, accepted {want}"
            outcomes.update(r.ends.values())
    print(f"failover: {len(on_victim)} of {SESSIONS} sessions on the killed master; replica promoted after "
          f"{promoted:.1f}s, a replica again after {healed:.1f}s; statuses {dict(statuses)}, during the failover {dict(during)}; outcomes {dict(outcomes)}, "
          f"sessions with a crashed turn on the other masters: {crashed_elsewhere}; killed at {killed_wall:.3f}")
    assert during, "sends went on during the failover"


def test_every_node_stops_on_sigterm_even_a_replica_writing_its_first_aof(tmp_path: Any) -> None:
    """A replica that has just synced rewrites its append-only file and refuses a SIGTERM
    meanwhile ("Writing initial AOF, can't exit"), forgetting it: stop() then waited out its
    whole bound and SIGKILLed the node (a 10 s teardown for every cluster stopped soon after it
    formed, and a node killed where it was asked to shut down). Every node must exit by its own
    shutdown (status 0): the replicas are stopped first, the moment the cluster is ok, in the
    rewrite's window."""
    from cox.redis_cluster import RedisClusterServer

    for i in range(3):  # the window is the few ms of the rewrite: three clusters, 9 replicas in all
        cluster = RedisClusterServer(tmp_path / f"c{i}").start()
        try:
            procs = [n.proc for n in cluster.nodes]
            for n in reversed(cluster.nodes):  # created as masters first: the replicas are the last
                n.stop()
            codes = [p.returncode for p in procs if p is not None]
            assert codes == [0] * len(cluster.nodes), f"exit statuses {codes} (-9: killed after a refused SIGTERM)"
        finally:
            cluster.close()
