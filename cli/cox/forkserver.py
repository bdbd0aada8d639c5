"""A fork server: the services' modules imported once, each service a fork of that process.

A service started as ``python -m cox_gateway`` is a fresh interpreter that imports ~1.5 s of
modules (pydantic-ai, FastAPI, redis-py, nats-py, our own models) before it does anything; ``cox
up`` starts six of them (more with ``--runners``), on a small machine one after another. Here
one process imports every service once (:data:`PRELOAD`), single-threaded, and each service is a
``fork`` of it that then runs exactly what ``python -m`` runs (the module's ``__main__`` through
:mod:`runpy`) with its own environment, working folder, log on stdout/stderr and ``/dev/null``
on stdin, every other descriptor closed, its title set to what ``ps`` would have shown
(``python -m cox_gateway``), and the kernel told to SIGTERM it when the fork server dies (which
dies with whoever started it). Nothing of the service is replaced: the same ``main`` reads the
same settings from the same variables. The pages the imports made stay shared between the
services until one writes them.

The client talks to the server over a Unix socket in a folder of its own (0700): one
connection per service, kept open. The server answers the pid and a pidfd of the child
(``SCM_RIGHTS``), and writes the exit status on that connection when it reaps it. A service's
environment is in its ``os.environ`` only, not in ``/proc/<pid>/environ`` (which shows the fork
server's, without any password): another process of the same user cannot read it there.

``cox up`` uses it unless ``COX_UP_FORK=0``; the test stacks use it too (``tests/support/zygote.py``).
"""

from __future__ import annotations

import array
import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PRELOAD = ("cox_gateway.service", "cox_runner.service", "cox_runner.loop", "cox_guard.service",
           "cox_judge.service", "cox_versions.service")
"""What every fork finds imported (the rest of a service imports on its own, as it would). The
runner's turn machinery too (``cox_runner.drive.TURNS``): a fresh runner imports it at its first
turn, to stay small while it has run none; forks share the fork server's pages of it instead."""


def enabled(var: str) -> bool:
    """Off when the variable says ``0`` (each service a fresh interpreter, as before)."""
    return os.environ.get(var, "1") != "0"


# ---------------------------------------------------------------------------------- client side
class Forked:
    """A service forked by the server, seen as :class:`subprocess.Popen` sees its child:
    ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``
    (``-N`` for a signal). Signals go through the pidfd, so never to a recycled pid."""

    def __init__(self, pid: int, pidfd: int, conn: socket.socket, args: list[str], buf: bytes = b"") -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.conn = conn
        self.args = args
        self.returncode: int | None = None
        self._buf = buf
        """What the server said after the pid so far: its exit status, once a whole line."""

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = -1

    def poll(self) -> int | None:
        while self.returncode is None:
            if b"\n" in self._buf:
                self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["exit"])
                self._close()
                break
            try:
                chunk = self.conn.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                # The server is gone without a word: the child had its SIGTERM (its parent died)
                # and is gone or going; nobody can read its status now.
                if select.select([self.pidfd], [], [], 0)[0]:
                    self.returncode = -signal.SIGTERM
                    self._close()
                break
            self._buf += chunk
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            select.select([self.conn.fileno(), self.pidfd], [], [], min(0.05, left) if left is not None else 0.05)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """A fork server of this process (``python -m cox.forkserver``), started on first use or by
    :meth:`start`; restarted if it died. Thread-safe."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD) -> None:
        self.preload = preload
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.path = Path()
        self.folder: Path | None = None
        self._ready = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the server (its imports go on in the background); :meth:`ready` waits for them.

        Call it from the thread that outlives the services: the kernel's "parent died" signal
        (``PR_SET_PDEATHSIG``) follows the thread that forked, not the process."""
        with self.lock:
            if self.alive():
                return
            from coxswain.proc import dies_with_me, foreign_env

            if self.folder is None:
                self.folder = Path(tempfile.mkdtemp(prefix="cox-forkserver-"))  # 0700
            self.path = self.folder / f"sock-{time.monotonic_ns()}"
            # No password or server address of ours reaches it: each fork gets its own environment.
            env = {**foreign_env(), "PYTHONUNBUFFERED": "1"}
            self.proc = subprocess.Popen([sys.executable, "-m", "cox.forkserver", str(self.path), *self.preload],
                                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         preexec_fn=dies_with_me())
            self._ready = False

    def ready(self) -> Path:
        """The socket, once the server has imported everything and listens (it must have been started)."""
        with self.lock:
            if self.proc is None or self.proc.stdout is None:
                raise RuntimeError("the fork server was not started")
            if not self._ready:
                line = self.proc.stdout.readline()  # "ready\n" once every module is imported
                if line.strip() != b"ready":
                    self.proc.kill()
                    self.proc.wait(10)
                    raise RuntimeError(f"the fork server did not start: {line!r} (exit {self.proc.returncode})")
                self.proc.stdout.close()
                self._ready = True
            return self.path

    def close(self) -> None:
        """The server ends, and the kernel sends each service still running a SIGTERM."""
        from coxswain.proc import terminate_tree

        with self.lock:
            if self.proc is not None:
                terminate_tree(self.proc)
            if self.folder is not None:
                import shutil

                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder = None

    def spawn(self, module: str, env: dict[str, str], log: Path, cwd: str | None = None, name: str = "") -> Forked:
        """``python -m module`` as a fork of the server, its output appended to ``log`` (0600);
        ``ps`` shows it as ``python -m module [name]``."""
        if not self.alive():
            self.start()
        path = self.ready()
        request = {"module": module, "env": env, "log": str(log), "cwd": cwd or os.getcwd(), "name": name}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(path))
            conn.sendall(json.dumps(request).encode() + b"\n")
            data, fds, _, _ = socket.recv_fds(conn, 4096, 1)
            if not fds:
                raise RuntimeError(f"the fork server did not start {module}: {data[:200]!r}")
        except BaseException:
            conn.close()
            raise
        first, _, rest = data.partition(b"\n")  # rest: its exit, in the same read (a child that ended at once)
        return Forked(int(json.loads(first)["pid"]), fds[0], conn, [sys.executable, "-m", module], rest)


# ---------------------------------------------------------------------------------- server side
def _set_title(title: str) -> None:
    with contextlib.suppress(Exception):
        import setproctitle

        setproctitle.setproctitle(title)


def _child(req: dict[str, Any]) -> None:
    """In the fork: become ``python -m <module>`` and never return."""
    code = 1
    try:
        from coxswain.proc import die_with_parent

        die_with_parent(req["server_pid"])  # the fork server's death ends it, as it ended a Popen child
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen's close_fds
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        _set_title(f"{sys.executable} -m {req['module']}" + (f" [{req['name']}]" if req.get("name") else ""))
        import runpy

        sys.argv = [req["module"]]
        try:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - printed as the interpreter would, then exit 1
            import traceback

            traceback.print_exc()
            code = 1
        # What the interpreter does at exit: wait for threads, run atexit, flush.
        with contextlib.suppress(Exception):
            threading._shutdown()  # type: ignore[attr-defined]
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    finally:
        os._exit(code)


def serve(path: Path, preload: list[str]) -> None:
    import importlib

    _set_title(f"{sys.executable} -m cox.forkserver")
    for module in preload:
        importlib.import_module(module)
    # What the imports made, out of the collector's reach before any fork: a fork's collections
    # would otherwise visit (and so write, copying) every page of it (Instagram's gc.freeze).
    gc.collect()
    gc.freeze()
    if threading.active_count() != 1:  # a fork must not inherit a lock held by another thread
        print(f"threads after import: {threading.enumerate()}", flush=True)
        sys.exit(1)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the client's connection)
    old = os.umask(0o077)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.umask(old)
    server.listen(64)
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([server.fileno(), *children], [], [])
        for r in readable:
            if r == server.fileno():
                _fork(server, children)
                continue
            pid, conn = children.pop(r)
            _, status = os.waitpid(pid, 0)
            os.close(r)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()


def _fork(server: socket.socket, children: dict[int, tuple[int, socket.socket]]) -> None:
    conn, _ = server.accept()
    try:
        req = json.loads(conn.makefile("rb").readline())
        req["server_pid"] = os.getpid()
        pid = os.fork()
    except BaseException as exc:  # noqa: BLE001 - the client hears why, the server goes on
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"error": str(exc)[:500]}).encode() + b"\n")
        conn.close()
        return
    if pid == 0:
        server.close()
        conn.close()
        _child(req)
    pidfd = os.pidfd_open(pid)  # before any reap: it is this child's, whatever happens to the pid
    children[pidfd] = (pid, conn)
    socket.send_fds(conn, [json.dumps({"pid": pid}).encode() + b"\n"], array.array("i", [pidfd]))


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2:])
