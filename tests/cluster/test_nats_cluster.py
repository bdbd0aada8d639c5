"""coxswain on a 3-node NATS cluster: losing one node loses nothing and stops nothing for longer
than the reconnect.

A stack on :class:`cox.nats_cluster.NatsCluster` (every service gets all three URLs, the event
stream has three replicas); 30 clients keep their sessions busy with a queue behind each turn;
the node the gateway is connected to is killed with SIGKILL and stays dead. Sends meanwhile are
answered 202 or 503 (never anything else), every message answered 202 runs exactly once and in
order, every session's log has every seq without a gap (read through the gateway's event API),
and afterwards the stack serves new work on two nodes; the killed node rejoins and catches up.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import nats
import pytest
from nats.js import api as jsapi

from cox.nats_cluster import NatsCluster
from cox.servers import NatsServer
from coxswain import eventlog, subjects
from tests.faults.test_outage import check_all_ran, run_senders
from tests.support.logcheck import log_of, replay
from tests.support.stack import Api, Stack, script, stack_fixture

pytestmark = pytest.mark.cluster

SESSIONS = 30
CONFIG = """
[approval]
commands = "allow"
"""

stack = stack_fixture("nats-cluster", runners=2, lease_ms=2000, config=CONFIG, nats_cluster=True)


def connected_node(cluster: NatsCluster, client_name: str) -> int:
    """The index of the node a client (by its connection name) is connected to (``/connz``)."""
    for i, node in enumerate(cluster.nodes):
        if not node.running():
            continue
        with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/connz?limit=1024", timeout=5) as r:
            conns = json.load(r).get("connections") or []
        if any(c.get("name") == client_name for c in conns):
            return i
    raise AssertionError(f"{client_name} is connected to no node")


async def _stream_info(url: str) -> jsapi.StreamInfo:
    nc = await nats.connect(url)
    try:
        return await nc.jetstream().stream_info(subjects.EVENTS_STREAM)
    finally:
        await nc.close()


def test_the_event_stream_has_three_replicas_on_the_cluster(stack: Stack) -> None:
    info = asyncio.run(_stream_info(stack.nats.admin_url))
    assert info.config.num_replicas == 3
    assert info.cluster is not None and info.cluster.name == "cox"
    assert len(info.cluster.replicas or []) == 2, info.cluster  # the leader and two followers


def test_one_node_killed_mid_load_loses_nothing_and_stops_nothing(stack: Stack, api: Api) -> None:
    cluster: NatsCluster = stack.nats
    seen: dict[str, Any] = {}

    def outage(sids: list[str]) -> None:
        victim = connected_node(cluster, "gateway")
        seen["victim"] = victim
        seen["runner_nodes"] = {r: connected_node(cluster, r) for r in stack.runner_names()}
        seen["killed_at"] = time.monotonic()
        cluster.kill(victim)
        # the gateway reconnects to another node: a send is answered 202 again within seconds
        deadline = time.monotonic() + 20
        while True:
            r = api.send(sids[0], script({"text": "after the kill"}, text="probe"), mode="queue",
                         client_id="probe-after-kill")
            if r.status_code == 202 or time.monotonic() > deadline:
                break
            assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
            time.sleep(0.1)
        assert r.status_code == 202, r.text
        seen["recovered_s"] = time.monotonic() - seen["killed_at"]
        seen["probe"] = r.json()
        time.sleep(2.0)  # keep sending on two nodes for a while

    senders = run_senders(stack, api, "ncl", outage, n=SESSIONS)
    # the probe went to sids[0] between that sender's own messages: drop it from the FIFO check
    # of that sender (it has its own client_id) but require that it ran exactly once
    probe = seen["probe"]["message_id"]
    first = senders[0]
    api.wait_idle(first.sid, timeout=90)
    r0 = replay(log_of(api, first.sid))
    assert r0.starts.count(probe) == 1, "the message answered 202 right after the kill ran once"
    first.replies = sorted([*first.replies, {**seen["probe"], "mode": "queue"}],
                           key=lambda x: r0.accepted.index(x["message_id"]))
    outcomes = check_all_ran(api, senders)
    assert set(outcomes) <= {"completed", "crashed"}, outcomes
    accepted = sum(len(s.replies) for s in senders)
    unavailable = sum(s.unavailable for s in senders)
    print(f"nats node {seen['victim'] + 1} of 3 killed (the gateway's; runners on {seen['runner_nodes']}): "
          f"{accepted} messages answered 202, {unavailable} sends answered 503, gateway answered 202 again "
          f"after {seen['recovered_s']:.2f}s, outcomes {outcomes}")

    # the stack works on the two nodes left
    sid = api.create("after-the-kill")["id"]
    r = api.send(sid, script({"text": "still here"}, text="hello"))
    assert r.status_code == 202, r.text
    api.wait_idle(sid, timeout=30)
    after = replay(log_of(api, sid))
    assert after.starts == [r.json()["message_id"]] and list(after.ends.values()) == ["completed"]

    # the killed node rejoins and its copy of the stream catches up
    cluster.restart(seen["victim"])
    deadline = time.monotonic() + 30
    while True:
        info = asyncio.run(_stream_info(stack.nats.admin_url))
        peers = info.cluster.replicas if info.cluster else []
        if (peers and all(p.current and not p.offline for p in peers)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert peers and all(p.current and not p.offline for p in peers), info.cluster


def test_an_existing_stream_is_updated_to_the_replica_count(tmp_path: Any) -> None:
    async def go(url: str) -> tuple[int, int]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            one = await eventlog.ensure_stream(js, 1)
            three = await eventlog.ensure_stream(js, 3)
            return one.config.num_replicas or 1, three.config.num_replicas or 1
        finally:
            await nc.close()

    with NatsCluster(tmp_path / "c") as c:
        assert asyncio.run(go(c.admin_url)) == (1, 3)


def test_more_replicas_than_nodes_is_a_clear_error(tmp_path: Any) -> None:
    async def go(url: str) -> None:
        nc = await nats.connect(url)
        try:
            await eventlog.ensure_stream(nc.jetstream(), 3)
        finally:
            await nc.close()

    with NatsServer(tmp_path / "one") as one, pytest.raises(eventlog.StreamMisconfigured, match="3 replica"):
        asyncio.run(go(one.admin_url))
