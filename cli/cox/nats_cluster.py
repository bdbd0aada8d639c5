"""A local NATS cluster with JetStream: three nats-server nodes on free loopback ports.

For the tests (``Stack(nats_cluster=True)``), the bench (``./dev bench --cluster``) and anyone who
wants to see coxswain on clustered NATS on one machine. Each node is a :class:`~cox.servers.NatsServer`
(the same binary, users and permissions from :mod:`coxswain.access`, ``sync_interval: always``)
with its own JetStream store directory and server name, plus a ``cluster`` block: every node
routes to the other two, and the route port admits only the cluster's own route user.

``url`` is every node's client URL, comma-separated, as ``COX_NATS_URL`` takes it; ``admin_url``
is one running node's URL with admin's password (for a client that talks to the cluster directly;
nats-py learns the other nodes from the server). Ready means every node logged "Server is ready"
and answers its monitoring ``/healthz`` with 200, which nats-server only does once JetStream has
a meta leader: before that a stream cannot be created.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from .creds import Credentials, nats_admin_url, private_dir, write_private
from .servers import NatsServer, free_port, nats_binary, nats_config

CLUSTER_NAME = "cox"
ROUTE_USER = "route"


class NatsNode(NatsServer):
    """One node: a NatsServer with a cluster block and a monitoring port."""

    def __init__(self, workdir: Path, index: int, cluster_ports: list[int], route_password: str,
                 credentials: Credentials, sync_always: bool = True) -> None:
        super().__init__(workdir, credentials=credentials, sync_always=sync_always)
        self.index = index
        self.cluster_ports = cluster_ports
        self.route_password = route_password
        self.http_port = free_port()

    @property
    def server_name(self) -> str:
        return f"cox_n{self.index + 1}"

    def command(self) -> list[str]:
        conf = self.workdir / "nats.conf"
        store = self.workdir / "jetstream"
        me = self.cluster_ports[self.index]
        routes = ", ".join(f'"nats-route://{ROUTE_USER}:{self.route_password}@127.0.0.1:{p}"'
                           for i, p in enumerate(self.cluster_ports) if i != self.index)
        text = nats_config(f"127.0.0.1:{self.port}", self.server_name, str(store), self.credentials,
                           self.sync_always)
        text += (
            f'http: "127.0.0.1:{self.http_port}"\n'
            f"cluster {{\n"
            f"  name: {CLUSTER_NAME}\n"
            f'  listen: "127.0.0.1:{me}"\n'
            f"  authorization {{ user: {ROUTE_USER}, password: \"{self.route_password}\" }}\n"
            f"  routes: [{routes}]\n"
            f"}}\n"
        )
        write_private(conf, text)
        return [nats_binary(), "-c", str(conf)]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        """``/healthz`` answers 200: the node is up and JetStream has a meta leader."""
        with contextlib.suppress(OSError, urllib.error.URLError):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        return False


class NatsCluster:
    """Three (or ``size``) clustered nats-server nodes with JetStream; ``kill(i)``/``restart(i)``
    one node the way a crash and an operator would."""

    name = "nats-cluster"

    def __init__(self, workdir: Path | None = None, size: int = 3, sync_always: bool = True,
                 credentials: Credentials | None = None) -> None:
        self.credentials = credentials or Credentials.generate()
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="cox-nats-cluster-"))
        private_dir(self.workdir)
        self.size = size
        cluster_ports = [free_port() for _ in range(size)]
        route_password = secrets.token_urlsafe(18)
        self.nodes = [NatsNode(self.workdir / f"n{i + 1}", i, cluster_ports, route_password, self.credentials,
                               sync_always) for i in range(size)]

    # ------------------------------------------------------------------ URLs
    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (``COX_NATS_URL``)."""
        return ",".join(self.urls)

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def admin_url(self) -> str:
        """Admin's URL of the first node that runs (nats-py discovers the others from it)."""
        node = next((n for n in self.nodes if n.running()), self.nodes[0])
        return nats_admin_url(node.url, self.credentials)

    @property
    def admin_urls(self) -> list[str]:
        return [nats_admin_url(u, self.credentials) for u in self.urls]

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0) -> Self:
        try:
            for n in self.nodes:
                n.start(timeout)
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float = 60.0, nodes: list[int] | None = None) -> None:
        deadline = time.monotonic() + timeout
        want = [self.nodes[i] for i in (nodes if nodes is not None else range(self.size))]
        while time.monotonic() < deadline:
            if all(n.healthy() for n in want):
                return
            time.sleep(0.1)
        logs = "\n".join(f"== {n.server_name}\n{n.log_path.read_text(errors='replace')[-1500:]}" for n in want
                         if n.log_path.exists())
        raise RuntimeError(f"NATS cluster not healthy after {timeout}s:\n{logs}")

    def kill(self, index: int) -> None:
        """SIGKILL one node (its store stays; ``restart`` brings it back with it)."""
        self.nodes[index].kill()

    def restart(self, index: int, timeout: float = 60.0) -> None:
        self.nodes[index].start(timeout)
        self.wait_healthy(timeout, [index])

    def node_of_port(self, port: int) -> int:
        return next(i for i, n in enumerate(self.nodes) if n.port == port)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
