"""A whole coxswain system for a test: its own NATS and Redis, every service as a process.

Each :class:`Stack` gets its own servers (so stacks never answer each other's requests or
claim each other's sessions), its own workspace root and config. Tests reach it only through
HTTP, the way a client does, and may kill, pause or restart any process.

Docker: when a Docker engine answers (``testcontainers``), NATS and Redis run in containers
(``tests/support/containers.py``); otherwise, or with ``COX_TEST_DOCKER=0``, the local binaries.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeAlias

import httpx
import psutil

from cox.creds import Credentials
from cox.nats_cluster import NatsCluster
from cox.redis_cluster import RedisClusterServer
from cox.servers import NatsServer, RedisServer, free_port
from coxswain import events
from coxswain.proc import dies_with_me, foreign_env

from . import freezer, zygote
from .containers import NatsContainer, RedisContainer, docker_available

Proc: TypeAlias = "subprocess.Popen[bytes] | zygote.Forked"
"""A service process of a stack: a fresh interpreter, or a fork of the tests' fork server."""

TOKEN = "test-token-local"
OTHER_TOKEN = "test-token-other"
SERVICES = {"gateway": "cox_gateway", "guard": "cox_guard", "judge": "cox_judge", "versions": "cox_versions"}
SERVICE_OF = {**{module: name for name, module in SERVICES.items()}, "cox_runner": "turn-runner"}


class Stack:
    def __init__(self, tmp: Path, runners: int = 2, config: str = "", env: dict[str, str] | None = None,
                 lease_ms: int | None = None, runner_env: dict[str, str] | None = None, redis_cluster: bool = False,
                 nats_cluster: bool = False, tokens: dict[str, str] | None = None, auth: str = "") -> None:
        """``tokens``: more bearer tokens (token -> principal) beside ``TOKEN`` and ``OTHER_TOKEN``;
        ``auth``: more lines of the ``[auth]`` table (e.g. ``roles = {...}``)."""
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.runners = runners
        self.root = tmp / "workspaces"
        self.root.mkdir(exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lease_ms = lease_ms or default_lease_ms()
        self.config_text = config
        self.tokens = {OTHER_TOKEN: "other", **(tokens or {})}
        self.auth_text = auth
        self.extra_env = env or {}
        self.runner_env = runner_env or {}
        """Environment only the turn-runners get (e.g. a PATH without bwrap)."""
        docker = docker_available()
        # Both servers admit only the stack's users: each service its own, ``admin`` for tests
        # that talk to a server directly (``stack.nats.admin_url``, ``stack.redis.admin_url``).
        self.credentials = Credentials.generate()
        self.nats: Any = (NatsContainer if docker else NatsServer)(tmp / "nats", credentials=self.credentials)
        self.redis: Any = (RedisContainer if docker else RedisServer)(tmp / "redis", credentials=self.credentials)
        self.redis_cluster = redis_cluster
        if redis_cluster:
            # 3 masters + 3 replicas on loopback; every acknowledged transition waits for a replica
            self.redis = RedisClusterServer(tmp / "redis-cluster", credentials=self.credentials)
            self.extra_env = {"COX_REDIS__CLUSTER": "true", "COX_REDIS__WAIT_REPLICAS": "1", **self.extra_env}
        self.nats_cluster = nats_cluster
        if nats_cluster:
            # 3 local nodes (cox.nats_cluster); every service gets every node's URL and the event
            # stream is kept on all three
            self.nats = NatsCluster(tmp / "nats-cluster", credentials=self.credentials)
            self.extra_env = {"COX_NATS__STREAM_REPLICAS": "3", **self.extra_env}
        self.procs: dict[str, Proc] = {}
        self._frozen: dict[str, freezer.Frozen] = {}
        """The services :meth:`pause` froze, until :meth:`resume`."""
        self.logs = tmp / "logs"
        self.logs.mkdir(exist_ok=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 120.0) -> Stack:
        self.nats.start()
        self.redis.start()
        cfg = self.tmp / "coxswain.toml"
        listed = ", ".join(f'"{t}" = "{p}"' for t, p in self.tokens.items())
        cfg.write_text(self.config_text + f"\n[auth]\ntokens = {{ {listed} }}\n{self.auth_text}\n")
        self.env = {
            **foreign_env(),
            "COX_NATS_URL": self.nats.url, "COX_REDIS_URL": self.redis.url, "COX_TOKEN": TOKEN,
            "COX_ROOT": str(self.root), "COX_PORT": str(self.port), "COX_CONFIG": str(cfg),
            "COX_RUNNER__LEASE_MS": str(self.lease_ms), "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        for name, module in SERVICES.items():
            self.spawn(name, module)
        for i in range(1, self.runners + 1):
            self.spawn(f"turn-runner-{i}", "cox_runner")
        self.wait_healthy(timeout)
        self.wait_runners_started(time.monotonic() + timeout)
        return self

    def wait_runners_started(self, deadline: float) -> None:
        """Every runner spawned at start is serving: /healthz is 200 with one, and a test that
        counts on N runners (a takeover, a partition) must not run with fewer."""
        for name in [n for n in self.procs if n.startswith("turn-runner")]:
            while '"event": "service.started"' not in self.log(name):
                p = self.procs[name]
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} at start:\n{self.log(name)[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start in time:\n{self.log(name)[-3000:]}")
                time.sleep(0.1)

    def spawn(self, instance: str, module: str) -> Proc:
        path = self.logs / f"{instance}.log"
        env = {**self.env, **self.credentials.service_env(SERVICE_OF[module]),
               **(self.runner_env if module == "cox_runner" else {}), "COX_INSTANCE": instance}
        proc: Proc
        if zygote.enabled():
            # a fork of a process that has every service imported: see tests/support/zygote.py
            proc = zygote.spawn(module, env, path)
        else:
            with open(path, "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", module], env=env,
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        preexec_fn=dies_with_me())
        self.procs[instance] = proc
        return proc

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None and not name.startswith("turn-runner"):
                    raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log(name)[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(self.url + "/healthz", timeout=3)
                if r.status_code == 200:
                    return
                last = r.text
            time.sleep(0.1)
        raise RuntimeError(f"stack not healthy after {timeout}s: {last}\n{self.all_logs()[-4000:]}")

    def stop(self) -> None:
        for name in list(self._frozen):
            self.resume(name)
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)
                    p.terminate()
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.nats.close()
        self.redis.close()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ processes
    def runner_names(self) -> list[str]:
        return [n for n in self.procs if n.startswith("turn-runner")]

    def signal(self, instance: str, sig: int) -> None:
        self.procs[instance].send_signal(sig)

    def state(self, instance: str) -> str:
        """The process state of a service as the kernel has it (``stopped`` while SIGSTOPped,
        ``frozen`` while :meth:`pause` has it frozen)."""
        frozen = self._frozen.get(instance)
        if frozen is not None and frozen.frozen():
            return "frozen"
        try:
            return str(psutil.Process(self.procs[instance].pid).status())
        except psutil.Error as exc:
            return repr(exc)

    def pause(self, instance: str, timeout: float = 5.0) -> float:
        """Pause a service until :meth:`resume`, and wait until the kernel has it paused; the
        seconds that took. A drill that pauses a runner past its lease relies on the pause having
        taken, and holding: frozen in a cgroup of its own (:mod:`tests.support.freezer`), which
        nothing but the thaw wakes, where this process may make cgroups (root); else SIGSTOP,
        which any SIGCONT ends (sent again while the kernel does not have it stopped:
        :meth:`signal` drops a failure to send without a word)."""
        t0 = time.monotonic()
        if kind := freezer.available():
            frozen = freezer.Frozen(self.procs[instance].pid, kind)
            frozen.freeze(timeout)
            self._frozen[instance] = frozen
            return time.monotonic() - t0
        while True:
            self.signal(instance, signal.SIGSTOP)
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:
                if self.state(instance) == psutil.STATUS_STOPPED:
                    return time.monotonic() - t0
                time.sleep(0.005)
            assert time.monotonic() - t0 < timeout, f"{instance} is not stopped: {self.state(instance)}"

    def resume(self, instance: str) -> None:
        """End :meth:`pause` (a SIGCONT to a service that was not paused changes nothing)."""
        frozen = self._frozen.pop(instance, None)
        if frozen is not None:
            frozen.thaw()
        else:
            self.procs[instance].send_signal(signal.SIGCONT)

    def kill(self, instance: str) -> None:
        p = self.procs[instance]
        p.kill()
        frozen = self._frozen.pop(instance, None)
        if frozen is not None:
            frozen.thaw()  # killed first: it never runs again
        p.wait(10)

    def log(self, instance: str) -> str:
        path = self.logs / f"{instance}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def all_logs(self) -> str:
        return "\n".join(f"==== {n}\n{self.log(n)[-2000:]}" for n in self.procs)

    # ------------------------------------------------------------------ clients
    def redis_client(self) -> Any:
        """A synchronous admin client of the stack's Redis (a cluster client for a cluster)."""
        import redis
        import redis.cluster

        if self.redis_cluster:
            return redis.cluster.RedisCluster.from_url(self.redis.admin_url, decode_responses=True)
        return redis.Redis.from_url(self.redis.admin_url, decode_responses=True)

    def client(self, token: str = TOKEN, timeout: float = 30.0) -> Api:
        return Api(self.url, token, timeout)


class Api:
    """A thin HTTP client of the v1 API with the waits tests need (events, idleness)."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self, workspace: str = "ws", **kw: Any) -> dict[str, Any]:
        r = self.http.post("/v1/sessions", json={"workspace": workspace, **kw})
        assert r.status_code == 201, r.text
        return dict(r.json())

    def session(self, sid: str) -> dict[str, Any]:
        r = self.http.get(f"/v1/sessions/{sid}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def send(self, sid: str, text: str, mode: str | None = None, **kw: Any) -> httpx.Response:
        body: dict[str, Any] = {"text": text, **kw}
        if mode:
            body["mode"] = mode
        return self.http.post(f"/v1/sessions/{sid}/messages", json=body)

    def events(self, sid: str, after: int = 0, wait: float = 0.0) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/sessions/{sid}/events", params={"format": "json", "after": after, "wait": wait},
                          timeout=wait + 30)
        assert r.status_code == 200, r.text
        out = list(r.json())
        for e in out:
            check_event(e)
        return out

    def all_events(self, sid: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            batch = self.events(sid, after=out[-1]["seq"] if out else 0)
            if not batch:
                return out
            out.extend(batch)

    def wait_for(self, sid: str, pred: Callable[[dict[str, Any]], bool], timeout: float | None = None,
                 after: int = 0) -> dict[str, Any]:
        """The first event after ``after`` for which ``pred`` holds (fails after ``timeout``, default
        ``WAIT_S``)."""
        timeout = WAIT_S if timeout is None else timeout
        deadline = time.monotonic() + timeout
        seen = after
        while time.monotonic() < deadline:
            batch = self.events(sid, after=seen, wait=min(2.0, max(0.1, deadline - time.monotonic())))
            for ev in batch:
                seen = ev["seq"]
                if pred(ev):
                    return ev
        raise AssertionError(f"no matching event within {timeout}s (last seq {seen})")

    def wait_type(self, sid: str, type_: str, timeout: float | None = None, after: int = 0,
                  **match: Any) -> dict[str, Any]:
        return self.wait_for(sid, lambda e: e["type"] == type_ and all(e.get(k) == v for k, v in match.items()),
                             timeout, after)

    def wait_idle(self, sid: str, timeout: float | None = None) -> dict[str, Any]:
        timeout = WAIT_S if timeout is None else timeout
        deadline = time.monotonic() + timeout
        pause = 0.005  # most turns here end within milliseconds: look again soon, then less often
        while time.monotonic() < deadline:
            s = self.session(sid)
            if not s["busy"]:
                return s
            time.sleep(pause)
            pause = min(0.05, pause * 2)
        raise AssertionError(f"session {sid} still busy after {timeout}s")


def check_event(e: dict[str, Any]) -> None:
    """Every event any process recorded (the Lua library's included) is one of the union's types
    with exactly its fields: a field the contract does not know is a bug, not an extra."""
    parsed = events.EVENT.validate_python(e)
    unknown = set(e) - set(type(parsed).model_fields)
    assert not unknown, f"{e['type']} event has fields the contract does not declare: {sorted(unknown)}: {e}"


def tool(name: str, **args: Any) -> dict[str, Any]:
    """One tool call of a script step."""
    return {"name": name, "args": args}


def said(text: str, *steps: dict[str, Any]) -> str:
    """A message that says ``text``, then holds the script of ``steps``."""
    return script(*steps, text=text)


def script(*steps: dict[str, Any], text: str = "run the script") -> str:
    """A message holding a ``script`` block for the built-in script model."""
    return f"{text}\n```script\n{json.dumps(list(steps))}\n```"


@contextlib.contextmanager
def running(tmp: Path, **kw: Any) -> Iterator[Stack]:
    stack = Stack(tmp, **kw)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


WAIT_S = 60.0 if os.environ.get("COX_TEST_BULK") else 20.0
"""How long an event wait gives by default: 20 s, and 60 s in CI's parallel lane, whose stacks get a
quarter of the drills' CPU weight on two cores (see ``default_lease_ms``). A wait ends at its event,
so only a failure waits it out."""


def default_lease_ms() -> int:
    """A stack's lease unless a test names one: 2 s, short so that takeovers are quick.

    CI's parallel lane (``COX_TEST_BULK=1``, set by ./dev test): 60 s. Its stacks share two cores
    with the drill lanes, which get four times its CPU weight, and a renewal there waited seconds
    for the CPU: a lapsed lease ended turns ``crashed`` that nobody killed (at 2 s, at 5 s, and
    once at 10 s). No test there waits for a lease to lapse: a test that kills a runner is
    marked ``faults`` and runs in the faults lane, which the parallel lane deselects. Any other
    xdist run: 10 s. The drill lanes (``COX_TEST_DRILL=1``), two at a time beside the parallel
    lane: 4 s (a runner there was seen held 1.8-3.3 s at once), unless a drill names its own."""
    if os.environ.get("COX_TEST_BULK"):
        return 60_000
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return 10_000
    return 4000 if os.environ.get("COX_TEST_DRILL") else 2000


CLUSTER_LEASE_MS = 4000
"""The lease of a cluster-kind stack built by :func:`stack_fixture` when the module names none."""


def library_redis(folder: Path) -> Iterator[Any]:
    """A bare Redis server in ``folder`` with the runner's function library loaded: a client
    (admin, strings decoded) for tests of the library itself, no services around it."""
    import redis

    from cox_runner.redis.store import LIBRARY

    server = RedisServer(folder)
    server.start()
    client = redis.Redis.from_url(server.admin_url, decode_responses=True)
    try:
        client.function_load(LIBRARY, replace=True)
        yield client
    finally:
        client.close()
        server.close()


def stack_fixture(name: str, *, also_cluster: bool = False, scope: Literal["session", "module"] = "module", **kw: Any) -> Any:
    """A pytest fixture (module-scoped unless ``scope`` says otherwise) yielding a running
    :class:`Stack` built with ``kw``.

    ``also_cluster``: the module's tests run twice, on one Redis and one NATS server, and (marked
    ``cluster``) on a Redis Cluster of 3 masters and 3 replicas with a 3-node NATS cluster
    (:data:`CLUSTER_KINDS`)."""
    import pytest

    if not also_cluster:
        @pytest.fixture(scope=scope)
        def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
            with running(tmp_path_factory.mktemp(name), **kw) as s:
                yield s

        return one

    @pytest.fixture(scope=scope, params=CLUSTER_KINDS)
    def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
        cluster = request.param == "cluster"
        # Twelve server processes beside the services on the 2-core test machine: a renewal can
        # wait over a second for CPU, so the cluster kind gets a longer lease unless one is given.
        lease = {"lease_ms": kw.get("lease_ms", CLUSTER_LEASE_MS if cluster else default_lease_ms())}
        with running(tmp_path_factory.mktemp(name + ("-cluster" if cluster else "")), redis_cluster=cluster,
                     nats_cluster=cluster, **{**kw, **lease}) as s:
            yield s

    return stack


def _cluster_kinds() -> list[Any]:
    import pytest

    return ["single", pytest.param("cluster", marks=pytest.mark.cluster)]


CLUSTER_KINDS = _cluster_kinds()
"""The servers a parametrized stack runs on: one Redis and one NATS server, and (the ``cluster``
tier) a Redis Cluster of 3 masters + 3 replicas with a 3-node NATS cluster."""
