"""The system under test: its own NATS and Redis, and ``cox up`` with N runners in a subprocess.

The bench starts nats-server and redis-server itself (``cox.servers``, the same configuration
``cox up`` gives them: JetStream ``sync_interval: always``, AOF ``appendfsync always``) and hands
their URLs to ``cox up`` through ``NATS_URL``/``REDIS_URL``, so the floors run against the very
servers the services use, and the harness can read Redis (read-only) and the servers' CPU.
The servers admit only coxswain's users, as ``cox up``'s own do: ``cox up --credentials`` gives
each service its own, and the harness and the floors connect as ``admin`` (``admin_url``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from cox.creds import Credentials
from cox.nats_cluster import NatsCluster
from cox.redis_cluster import RedisClusterServer
from cox.servers import NatsServer, RedisServer, free_port
from coxswain.proc import dies_with_me, foreign_env

CONFIG = """\
# The bench stack: commands need no judge (tool calls here are list_dir), limits far above the
# counts the bench drives, Leads up to 64 pending.
[approval]
commands = "allow"

[limits]
tool_calls = 1000000
actions = 1000000
tokens = 1000000000

[lead]
max_pending = 64
"""

READY_TIMEOUT_S = 180.0


SERVER_KINDS = ("single", "cluster")
"""``single``: one nats-server and one redis-server. ``cluster``: a 3-node NATS cluster (event
stream with 3 replicas) and a Redis Cluster of 3 masters + 3 replicas (every acknowledged
transition waits for a replica: ``[redis] wait_replicas = 1``), as ``cox up --cluster`` runs."""


class Servers:
    """nats-server and redis-server for one stack (and the floors measured beside it)."""

    def __init__(self, tmp: Path, kind: str = "single") -> None:
        if kind not in SERVER_KINDS:
            raise ValueError(f"servers kind {kind!r} is none of {SERVER_KINDS}")
        self.kind = kind
        self.credentials = Credentials.generate()
        self.nats: NatsServer | NatsCluster = (
            NatsCluster(tmp / "nats-cluster", credentials=self.credentials) if kind == "cluster"
            else NatsServer(tmp / "nats", credentials=self.credentials))
        self.redis: RedisServer | RedisClusterServer = (
            RedisClusterServer(tmp / "redis-cluster", credentials=self.credentials) if kind == "cluster"
            else RedisServer(tmp / "redis", credentials=self.credentials))

    @property
    def redis_clustered(self) -> bool:
        return isinstance(self.redis, RedisClusterServer)

    @property
    def nats_clustered(self) -> bool:
        return isinstance(self.nats, NatsCluster)

    def config(self) -> str:
        """What the services' config file needs for these servers."""
        out = "\n[nats]\nstream_replicas = 3\n" if self.nats_clustered else ""
        if self.redis_clustered:
            out += "\n[redis]\ncluster = true\nwait_replicas = 1\n"
        return out

    def start(self) -> Servers:
        self.nats.start()
        self.redis.start()
        return self

    def stop(self) -> None:
        self.nats.stop()
        self.redis.stop()

    def procs(self) -> dict[str, psutil.Process]:
        out = {}
        nats = self.nats.nodes if isinstance(self.nats, NatsCluster) else [self.nats]
        for i, node in enumerate(nats):
            if node.proc is not None:
                out["nats-server" + (f"-{i + 1}" if len(nats) > 1 else "")] = psutil.Process(node.proc.pid)
        redis = self.redis.nodes if isinstance(self.redis, RedisClusterServer) else [self.redis]
        for i, rnode in enumerate(redis):
            if rnode.proc is not None:
                out["redis-server" + (f"-{i + 1}" if len(redis) > 1 else "")] = psutil.Process(rnode.proc.pid)
        return out


class Stack:
    """``cox up --runners N`` against ``servers``; the gateway on a free port."""

    def __init__(self, tmp: Path, servers: Servers, runners: int, config: str = CONFIG) -> None:
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.servers = servers
        self.runners = runners
        self.root = tmp / "workspaces"
        self.state = tmp / "state"
        self.config = tmp / "coxswain.toml"
        self.config.write_text(config + servers.config())
        self.port = free_port()
        self.token = secrets.token_urlsafe(16)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_line = ""
        self.ready_s = 0.0
        """``cox up`` started to its ``ready:`` line (servers already running), seconds."""

    def start(self) -> Stack:
        env = foreign_env()
        env.update(NATS_URL=self.servers.nats.url, REDIS_URL=self.servers.redis.url, PYTHONUNBUFFERED="1")
        creds = self.tmp / "credentials.json"
        self.servers.credentials.save(creds)
        cox = Path(sys.executable).parent / "cox"
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(cox), "up", "--runners", str(self.runners), "--port", str(self.port), "--root", str(self.root),
             "--state", str(self.state), "--config", str(self.config), f"--token={self.token}", "--no-demo",
             "--credentials", str(creds)],
            env=env, stdout=subprocess.PIPE, stderr=open(self.tmp / "cox-up.log", "ab"), stdin=subprocess.DEVNULL,
            cwd=self.tmp, start_new_session=True, preexec_fn=dies_with_me(),
        )
        ready = threading.Event()
        proc = self.proc

        def read() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                if line.startswith("ready:"):
                    self.ready_line = line.strip()
                    ready.set()

        threading.Thread(target=read, name="cox-up-stdout", daemon=True).start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.tmp / "cox-up.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"cox up did not become ready (runners={self.runners}):\n{tail}")
        self.ready_s = round(time.monotonic() - t0, 2)
        return self

    def procs(self) -> dict[str, psutil.Process]:
        """Every service process by instance name (gateway, guard, judge, versions, turn-runner-N),
        and ``forkserver``: cox up's services are forks of it (cox/forkserver.py), each titled
        ``python -m <module> [<instance>]``; with ``COX_UP_FORK=0`` its children, named by their
        environment."""
        assert self.proc is not None
        out: dict[str, psutil.Process] = {}
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                title = " ".join(a for a in child.cmdline() if a)  # a set title is padded with empties
                if "cox.forkserver" in title:
                    out["forkserver"] = child
                elif m := re.search(r"-m cox_\w+ \[([\w.-]+)\]$", title):
                    out[m.group(1)] = child
                elif inst := child.environ().get("COX_INSTANCE"):
                    out[inst] = child
        return dict(sorted(out.items()))

    def all_procs(self) -> dict[str, psutil.Process]:
        return {**self.procs(), **self.servers.procs()}

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


class CpuMeter:
    """CPU seconds (user + system) spent by a set of processes between ``start`` and ``stop``,
    and the times each was switched off a CPU (``switches``: voluntary, when it waited for I/O, a
    wake-up each; and involuntary, when it was preempted), the threads of each counted together."""

    def __init__(self, procs: dict[str, psutil.Process]) -> None:
        self.procs = procs
        self.before: dict[str, float] = {}
        self.spent: dict[str, float] = {}
        self.switches_before: dict[str, tuple[int, int]] = {}
        self.switches: dict[str, tuple[int, int]] = {}
        """(voluntary, involuntary) context switches of each process between start and stop, over
        the threads alive at stop (a thread's counts leave ``/proc`` with it; the services' threads
        live as long as they do)."""
        self.self_before = 0.0
        self.client_s = 0.0

    @staticmethod
    def _cpu(p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
            return float(t.user + t.system + t.children_user + t.children_system)
        except psutil.Error:
            return 0.0

    @staticmethod
    def _switches(p: psutil.Process) -> tuple[int, int]:
        """A process's context switches so far, over all its threads (psutil's ``num_ctx_switches``
        reads only the main thread's on Linux: the sum over ``/proc/PID/task/*/status``)."""
        vol = inv = 0
        try:
            for tid in os.listdir(f"/proc/{p.pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p.pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            vol += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches:"):
                            inv += int(line.split()[1])
        except OSError:
            pass
        return vol, inv

    def start(self) -> CpuMeter:
        self.before = {n: self._cpu(p) for n, p in self.procs.items()}
        self.switches_before = {n: self._switches(p) for n, p in self.procs.items()}
        self.self_before = time.process_time()
        return self

    def stop(self) -> CpuMeter:
        self.spent = {n: round(self._cpu(p) - self.before[n], 3) for n, p in self.procs.items()}
        self.client_s = round(time.process_time() - self.self_before, 3)
        for n, p in self.procs.items():
            vol, inv = self._switches(p)
            b = self.switches_before.get(n, (0, 0))
            self.switches[n] = (max(0, vol - b[0]), max(0, inv - b[1]))
        return self

    @property
    def total(self) -> float:
        return round(sum(self.spent.values()), 3)
