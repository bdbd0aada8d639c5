"""A local Redis Cluster on loopback ports: 3 masters and 3 replicas by default.

Each node is a ``redis-server --cluster-enabled yes`` with the append-only file fsynced on every
write (as :class:`cox.servers.RedisServer`) and coxswain's ACL users (:mod:`coxswain.access`) on
every node: a promoted replica must admit the same users as the master it replaces. Replicas log
in to their master as ``admin`` (``masteruser``/``masterauth``). The cluster is made with
``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`` and is ready when every
node says ``cluster_state:ok`` and knows every other node.

``node_timeout_ms`` is the cluster's failure detection: a master unreachable that long is failed
over to its replica (small in tests, so a ``kill -9`` is healed in a few seconds).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from coxswain import access

from .creds import Credentials, private_dir, redis_admin_url
from .servers import RedisServer, free_port


def _free_pair() -> tuple[int, int]:
    """A port and a cluster-bus port, both free."""
    return free_port(), free_port()


class RedisClusterNode(RedisServer):
    """One node of the cluster (a redis-server with cluster mode on)."""

    name = "redis-node"

    def __init__(self, workdir: Path, port: int, bus_port: int, credentials: Credentials,
                 node_timeout_ms: int) -> None:
        super().__init__(workdir, port, credentials)
        self.bus_port = bus_port
        self.node_timeout_ms = node_timeout_ms

    def command(self) -> list[str]:
        return [
            *super().command(), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(self.bus_port), "--cluster-node-timeout", str(self.node_timeout_ms),
            "--masteruser", access.ADMIN, "--masterauth", self.credentials.redis[access.ADMIN],
            # a replica that lost its master long ago may still be promoted: losing nothing
            # acknowledged is what WAIT is for; an unavailable slot range is worse
            "--cluster-replica-validity-factor", "0",
            # the other masters keep serving while one's slots wait for its replica's promotion
            # (the default refuses every command of the cluster meanwhile: CLUSTERDOWN)
            "--cluster-require-full-coverage", "no",
            # a replica's first full sync starts at once (the default waits 5 s for more replicas)
            "--repl-diskless-sync-delay", "0",
        ]

    def cli(self, *args: str, timeout: float = 10.0) -> str:
        """Run ``redis-cli`` against this node as admin; its output."""
        out = subprocess.run(
            [_cli_binary(), "-h", "127.0.0.1", "-p", str(self.port), "--user", access.ADMIN, "--pass",
             self.credentials.redis[access.ADMIN], "--no-auth-warning", *args],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
        return out.stdout + out.stderr


def _cli_binary() -> str:
    found = shutil.which("redis-cli")
    if not found:
        raise RuntimeError("redis-cli not found: install Debian's package (apt-get install -y redis-tools)")
    return found


class RedisClusterServer:
    """``masters`` masters with ``replicas`` replicas each, on free loopback ports.

    ``url`` names the first node (the cluster client learns the rest); ``admin_url`` carries
    admin's password. Services need ``[redis] cluster = true`` (``COX_REDIS__CLUSTER=1``)."""

    def __init__(self, workdir: Path | None = None, masters: int = 3, replicas: int = 1,
                 credentials: Credentials | None = None, node_timeout_ms: int = 2000) -> None:
        self.credentials = credentials or Credentials.generate()
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="cox-redis-cluster-"))
        private_dir(self.workdir)
        self.masters = masters
        self.replicas = replicas
        self.nodes: list[RedisClusterNode] = []
        for i in range(masters * (1 + replicas)):
            port, bus = _free_pair()
            self.nodes.append(RedisClusterNode(self.workdir / f"node-{i}", port, bus, self.credentials,
                                               node_timeout_ms))

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.live()[0].port}"

    @property
    def admin_url(self) -> str:
        return redis_admin_url(self.url, self.credentials)

    def live(self) -> list[RedisClusterNode]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def start(self, timeout: float = 60.0) -> Self:
        try:
            for i in range(len(self.nodes)):
                self._start_node(i)
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            out = self.nodes[0].cli("--cluster", "create", *addrs, "--cluster-replicas", str(self.replicas),
                                    "--cluster-yes", timeout=timeout)
            if "[OK] All 16384 slots covered" not in out:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{out[-3000:]}")
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, i: int, attempts: int = 3) -> None:
        """Start node ``i`` for the first time; on new ports if its own were taken meanwhile (a
        free port is only free when it is picked: another process's connection may take it)."""
        for attempt in range(1, attempts + 1):
            try:
                self.nodes[i].start()
                return
            except RuntimeError as exc:
                if attempt == attempts or "in use" not in str(exc):
                    raise
                old = self.nodes[i]
                (old.workdir / "nodes.conf").unlink(missing_ok=True)
                port, bus = _free_pair()
                self.nodes[i] = RedisClusterNode(old.workdir, port, bus, self.credentials, old.node_timeout_ms)
                self.nodes[i].cgroup = old.cgroup  # the node a partition test cuts by its cgroup

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node says ``cluster_state:ok`` and knows every live node, and every
        master has as many replicas as it should (a replication link is up)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            live = self.live()
            infos = [n.cli("cluster", "info") for n in live]
            if all("cluster_state:ok" in i and f"cluster_known_nodes:{len(self.nodes)}" in i for i in infos):
                if len(live) < len(self.nodes):
                    return  # a node is down on purpose: ok is all that can be asked
                roles = [n.cli("info", "replication") for n in live]
                masters = [r for r in roles if "role:master" in r]
                if len(masters) == self.masters and all(
                        "role:master" in r or "master_link_status:up" in r for r in roles):
                    return
            last = "\n".join(infos)
            time.sleep(0.1)
        raise RuntimeError(f"the Redis cluster is not ok after {timeout}s:\n{last[-2000:]}")

    def wait_failed_over(self, dead: RedisClusterNode, timeout: float = 60.0) -> None:
        """Until the live nodes have marked ``dead`` failed and promoted its replica (every slot
        served again: ``cluster_state:ok`` everywhere)."""
        deadline = time.monotonic() + timeout
        needle = f"127.0.0.1:{dead.port}@"
        last = ""
        while time.monotonic() < deadline:
            live = self.live()
            views = [n.cli("cluster", "nodes") for n in live]
            marked = all(any(needle in line and "fail" in line.split()[2] and "fail?" not in line.split()[2]
                             for line in v.splitlines()) for v in views)
            if marked and all("cluster_state:ok" in n.cli("cluster", "info") for n in live):
                return
            last = views[0] if views else ""
            time.sleep(0.1)
        raise RuntimeError(f"node {dead.port} was not failed over after {timeout}s:\n{last}")

    def master_of(self, key: str) -> RedisClusterNode:
        """The node that is master for ``key``'s slot now."""
        slot = int(self.live()[0].cli("cluster", "keyslot", key).strip())
        for n in self.live():
            if "role:master" not in n.cli("info", "replication"):
                continue
            for line in n.cli("cluster", "nodes").splitlines():
                f = line.split()
                if "myself" in f[2] and "master" in f[2]:
                    for r in f[8:]:
                        lo, _, hi = r.partition("-")
                        if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                            return n
        raise RuntimeError(f"no live master serves slot {slot}")

    def kill(self, node: RedisClusterNode) -> None:
        """SIGKILL one node (``kill -9``)."""
        node.kill()

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def close(self) -> None:
        for n in self.nodes:
            n.close()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
