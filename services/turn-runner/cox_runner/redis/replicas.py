"""``[redis] wait_replicas``: a write is acknowledged only once that many replicas hold it
(docs/design.md, "Acknowledged means replicated"). ``WAIT`` counts the replicas that hold this
connection's writes, so it is queued on the pipeline of the write it covers."""

from __future__ import annotations

from typing import Any

import redis.asyncio.cluster as aiocluster


class Replicas:
    def __init__(self, redis: Any, wait_replicas: int = 0, wait_ms: int = 1000) -> None:
        self.redis = redis
        self.wait_replicas = wait_replicas
        self.wait_ms = wait_ms
        self.cluster = isinstance(redis, aiocluster.RedisCluster)

    def queue_wait(self, pipe: Any, key: str) -> None:
        """Queue ``WAIT`` on ``pipe`` after the write it must cover. ``WAIT`` counts the replicas
        that hold this connection's writes, so it goes on the same pipeline (one connection), and
        in a cluster to the master of ``key``'s slot."""
        if self.cluster:
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_ms,
                                 target_nodes=self.redis.get_node_from_key(key))
        else:
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_ms)
