"""The hand-off's chained floor (bench/floor/probe.py ``handoff_chain``) against real servers: it
runs the chain it names and leaves nothing behind on the servers the stack uses."""

from __future__ import annotations

from pathlib import Path

import nats
import redis

from bench import floors
from bench.stack import Servers


async def _streams(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        return [s.config.name or "" for s in await nc.jetstream().streams_info()]
    finally:
        await nc.close()


async def test_the_handoff_chain_floor_times_each_chain_and_cleans_up(tmp_path: Path) -> None:
    servers = Servers(tmp_path).start()
    try:
        sp = servers.procs()
        res = floors._probe("handoff_chain", 40, 5, {"nats-server": sp["nats-server"], "redis-server": sp["redis-server"]},
                            nats=servers.nats.admin_url, redis=servers.redis.admin_url)
        ms = res["ms"]
        assert ms["n"] == 40
        # a chain is two scripts and two publishes: never shorter than one of its round trips
        assert 0 < ms["min"] <= ms["p50"] <= ms["p99"] <= ms["max"]
        assert set(res["server_cpu_us_per_op"]) == {"nats-server", "redis-server"}
        assert res["server_cpu_us_per_op"]["nats-server"] > 0 and res["server_cpu_us_per_op"]["redis-server"] > 0
        r = redis.Redis.from_url(servers.redis.admin_url)
        try:
            assert r.exists("bench:floor:chain") == 0
        finally:
            r.close()
        assert "BENCHFLOORCHAIN" not in await _streams(servers.nats.admin_url)
    finally:
        servers.stop()
