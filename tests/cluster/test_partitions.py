"""Partitions, not only deaths: one Redis master, then one NATS node, is cut off the network for
longer than the lease while turns run, then healed; the same invariants as after a ``kill -9``.

What the cut really is (:mod:`cox.netcut`): every server of the stack runs on loopback, each in
a cgroup v2 directory of its own; the cut is an iptables chain, jumped to from ``OUTPUT -o lo``
and ``INPUT -i lo``, that drops every packet sent by a socket of the victim's cgroup (its
listening ports and the cluster-bus links / routes it opened itself, established connections
included) and every TCP packet to or from its client and cluster-bus/route ports. The process
keeps running with its connections open; nothing is reset; it hears and says nothing until the
chain is deleted (in a ``finally``). It is not a container network: one host, one kernel.

The stack: a Redis Cluster of 3 masters + 3 replicas (``cluster-node-timeout`` 2000 ms,
``wait_replicas = 1``) and a 3-node NATS cluster (stream replicas 3), two runners, a 4 s lease.
Ten clients keep their sessions busy with a queue behind each turn; every turn writes files in
its workspace. Afterwards: every send was answered 202 or 503 (503s retried with the same
``client_id``), never anything else; every message answered 202 ran exactly once, in the order
it was accepted, none lost or discarded; every session's log is contiguous (``replay``); and
each workspace holds exactly what the log's last successful writes say (no write landed from a
runner that had lost its lease).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cox import netcut
from cox.nats_cluster import NatsCluster
from cox.redis_cluster import RedisClusterServer
from coxswain import keys
from tests.cluster.test_nats_cluster import connected_node
from tests.faults.test_faults import disk_vs_log
from tests.faults.test_outage import Sender, check_all_ran, run_senders
from tests.support.stack import Api, Stack, script

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

LEASE_MS = 4000
CUT_S = 10.0
"""How long a node stays cut: longer than the lease (4 s) and than cluster-node-timeout (2 s)."""
SESSIONS = 10
CONFIG = """
[approval]
commands = "allow"
"""

why_not = netcut.available()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if why_not:
        pytest.skip(f"a partition cannot be made on this machine: {why_not}")
    s = Stack(tmp_path_factory.mktemp("partitions"), runners=2, lease_ms=LEASE_MS, config=CONFIG,
              redis_cluster=True, nats_cluster=True)
    groups = []
    for i, node in enumerate([*s.redis.nodes, *s.nats.nodes]):
        node.cgroup = netcut.make_cgroup(f"part-{i}")
        groups.append(node.cgroup)
    try:
        s.start()
        yield s
    finally:
        s.stop()
        for g in groups:
            netcut.remove_cgroup(g)
        assert not netcut.leftover_chains()


class Writer(Sender):
    """A sender whose every turn writes two files (one of its own, one overwritten by every
    turn of the session) between two pauses, so turns are mid-write when the cut comes."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.stamps: list[float] = []

    def message(self, i: int) -> str:
        self.stamps.append(time.monotonic())  # message i-1 was answered 202 just now
        d = f"d/{self.tag}"
        return script(
            {"tools": [{"name": "write_file", "args": {"path": f"{d}/m{i}.txt", "content": f"{self.tag}-{i}"}}],
             "delay_ms": 150},
            {"tools": [{"name": "write_file", "args": {"path": f"{d}/last.txt", "content": f"{self.tag}-{i}"}}],
             "delay_ms": 150},
            {"text": f"{self.tag}-{i} done"}, text=f"{self.tag}-{i}")


def check_disk(api: Api, senders: list[Sender]) -> None:
    for s in senders:
        ws = Path(api.session(s.sid)["workspace"])
        problems = disk_vs_log(api, s.sid, ws / "d")
        assert not problems, f"{s.sid}: {problems}"


def report(what: str, senders: list[Sender], outcomes: dict[str, int], seen: dict[str, Any], extra: str) -> None:
    accepted = sum(len(s.replies) for s in senders)
    unavailable = sum(s.unavailable for s in senders)
    lo, hi = seen["cut_at"], seen["cut_at"] + seen["held_s"]
    stamps = [x for s in senders for x in getattr(s, "stamps", [])]
    during = sum(lo <= x <= hi for x in stamps)
    gaps = [b - a for s in senders if isinstance(s, Writer) for a, b in zip(s.stamps, s.stamps[1:], strict=False)]
    print(f"[partition] {what}: {accepted} messages answered 202 ({during} while cut), {unavailable} sends "
          f"answered 503, longest wait of a client for a 202 {max(gaps):.1f}s, outcomes {outcomes}; {extra}")


@contextlib.contextmanager
def cut_for(cgroup: Path, ports: list[int], seconds: float) -> Iterator[dict[str, Any]]:
    seen: dict[str, Any] = {}
    with netcut.cut(cgroup, ports) as chain:
        seen["cut_at"] = time.monotonic()
        yield seen
        left = seconds - (time.monotonic() - seen["cut_at"])
        if left > 0:
            time.sleep(left)
        seen["dropped"] = netcut.dropped(chain)
        seen["held_s"] = time.monotonic() - seen["cut_at"]


def test_a_redis_master_cut_off_past_the_lease_loses_nothing_and_runs_nothing_twice(stack: Stack, api: Api) -> None:
    cluster: RedisClusterServer = stack.redis
    seen: dict[str, Any] = {}

    def outage(sids: list[str]) -> None:
        victim = cluster.master_of(keys.session(sids[0]))
        seen["on_victim"] = sum(cluster.master_of(keys.session(s)) is victim for s in sids)
        assert victim.cgroup is not None
        with cut_for(victim.cgroup, [victim.port, victim.bus_port], CUT_S) as c:
            # the others mark it failed and promote its replica while it is cut off
            others = [n for n in cluster.live() if n is not victim]
            deadline = time.monotonic() + CUT_S
            while time.monotonic() < deadline:
                if any(f"127.0.0.1:{victim.port}@" in line and "fail" in line.split()[2] and "fail?" not in line
                       for line in others[0].cli("cluster", "nodes").splitlines()):
                    seen["failed_after_s"] = time.monotonic() - c["cut_at"]
                    break
                time.sleep(0.1)
        seen.update(c)
        healed_at = time.monotonic()
        cluster.wait_ok(timeout=60)  # the old master rejoins as its promoted replica's replica
        seen["ok_after_heal_s"] = time.monotonic() - healed_at
        seen["victim_role"] = "master" if "role:master" in victim.cli("info", "replication") else "replica"

    senders = run_senders(stack, api, "rpart", outage, n=SESSIONS, sender=Writer)
    outcomes = check_all_ran(api, senders)
    check_disk(api, senders)
    assert seen["dropped"] > 0, "the cut dropped packets"
    assert "failed_after_s" in seen, "the cut master was marked failed while cut off"
    report("redis master cut", senders, outcomes, seen,
           f"{seen['on_victim']} of {SESSIONS} sessions on the cut master; cut {seen['held_s']:.1f}s, "
           f"{seen['dropped']} packets dropped; marked failed after {seen['failed_after_s']:.1f}s; cluster ok "
           f"{seen['ok_after_heal_s']:.1f}s after the heal; the old master is now a {seen['victim_role']}")


def test_a_nats_node_cut_off_past_the_lease_loses_nothing_and_runs_nothing_twice(stack: Stack, api: Api) -> None:
    cluster: NatsCluster = stack.nats
    seen: dict[str, Any] = {}

    def outage(sids: list[str]) -> None:
        i = connected_node(cluster, "gateway")
        node = cluster.nodes[i]
        seen["victim"] = i
        seen["runner_nodes"] = {r: connected_node(cluster, r) for r in stack.runner_names()}
        assert node.cgroup is not None
        with cut_for(node.cgroup, [node.port, node.cluster_ports[i], node.http_port], CUT_S) as c:
            pass
        seen.update(c)
        healed_at = time.monotonic()
        cluster.wait_healthy(timeout=60)
        seen["healthy_after_heal_s"] = time.monotonic() - healed_at

    senders = run_senders(stack, api, "npart", outage, n=SESSIONS, sender=Writer)
    outcomes = check_all_ran(api, senders)
    check_disk(api, senders)
    assert seen["dropped"] > 0, "the cut dropped packets"
    report("nats node cut", senders, outcomes, seen,
           f"node {seen['victim'] + 1} (the gateway's; runners on {seen['runner_nodes']}) cut {seen['held_s']:.1f}s, "
           f"{seen['dropped']} packets dropped; healthy {seen['healthy_after_heal_s']:.1f}s after the heal")
