"""A fork server for the services of test stacks.

A stack is six service processes; each used to be ``python -m cox_<service>``, a fresh
interpreter importing ~1 s of modules (pydantic-ai, FastAPI, redis-py, nats-py and our own
models) before it did anything. The suite starts ~70 stacks on a 2-core machine, so imports were
a third of CI's CPU. Here one process per pytest process imports every service once
(:data:`PRELOAD`), single-threaded, and each service is a ``fork`` of it that then runs exactly
what ``python -m`` runs (the module's ``__main__`` through :mod:`runpy`), with its own
environment, working folder, log on stdout/stderr and ``/dev/null`` on stdin, every other
descriptor closed, and the kernel told to kill it when the fork server dies (which dies with
pytest). Nothing of the product is replaced: the same ``main`` reads the same settings from the
same variables; only the interpreter's start is shared. The entry points themselves (``python
-m``, ``cox up``, the images) are started for real by the tests of ``cox up`` and the container
tier.

``COX_TEST_FORK=0`` turns it off (every service a fresh interpreter, as before).

The server is the parent of the services, so it reaps them and writes each exit status where
the client said (:class:`Forked` reads it): :class:`Forked` answers ``poll``/``wait``/
``send_signal``/``kill`` as :class:`subprocess.Popen` does, including ``-N`` for a signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cox_runner.workspace.mcp_servers import SDK_MODULES

PRELOAD = ("cox_gateway.service", "cox_runner.service", "cox_guard.service", "cox_judge.service",
           "cox_versions.service", *SDK_MODULES)
"""What every fork finds imported (the rest of a service imports on its own, as it would). The MCP
SDK is one import the runner makes later (at start when servers are configured, ~1 s of CPU)."""


def enabled() -> bool:
    return os.environ.get("COX_TEST_FORK", "1") != "0"


# ---------------------------------------------------------------------------------- client side
class Forked:
    """A service forked by the server, seen as :class:`subprocess.Popen` sees its child."""

    def __init__(self, pid: int, exit_file: Path, args: list[str]) -> None:
        self.pid = pid
        self.exit_file = exit_file
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                self.returncode = int(self.exit_file.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        # Like Popen: nothing once it is known to have exited (its pid may be someone else's).
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Client:
    """This process's fork server, started on first use (``python -m tests.support.zygote``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.path = Path()
        self.count = 0

    def _ensure(self) -> Path:
        if self.proc is not None and self.proc.poll() is None:
            return self.path
        import tempfile

        from coxswain.proc import die_with_parent

        folder = Path(tempfile.mkdtemp(prefix="cox-zygote-"))
        self.path = folder / "sock"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COX_", "NATS_", "REDIS_"))}
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.zygote", str(self.path)], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     preexec_fn=die_with_parent)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()  # "ready\n" once every module is imported and it listens
        if ready.strip() != b"ready":
            self.proc.wait(10)
            raise RuntimeError(f"the fork server did not start: {ready!r} (exit {self.proc.returncode})")
        self.proc.stdout.close()
        import atexit

        atexit.register(self.close)
        return self.path

    def close(self) -> None:
        """At exit: the server ends, and the kernel ends each service still running with it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def spawn(self, module: str, env: dict[str, str], log: Path, cwd: str | None = None) -> Forked:
        with self.lock:
            path = self._ensure()
            self.count += 1
            exit_file = path.parent / f"{os.getpid()}-{self.count}.exit"
        request = {"module": module, "env": env, "log": str(log), "cwd": cwd or os.getcwd(),
                   "exit_file": str(exit_file)}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.sendall(json.dumps(request).encode() + b"\n")
            answer = s.makefile("rb").readline()
        pid = json.loads(answer)["pid"]
        return Forked(pid, exit_file, [sys.executable, "-m", module])


_client = Client()


def spawn(module: str, env: dict[str, str], log: Path, cwd: str | None = None) -> Forked:
    """Start ``python -m module`` as a fork of this process's server (see the module's doc)."""
    return _client.spawn(module, env, log, cwd)


# ---------------------------------------------------------------------------------- server side
def _child(req: dict[str, Any]) -> None:
    """In the fork: become ``python -m <module>`` and never return."""
    code = 1
    try:
        from coxswain.proc import die_with_parent

        die_with_parent()  # the fork server's death (pytest's) ends it, as it ended a Popen child
        fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen's close_fds
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
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


def serve(path: Path) -> None:
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    if threading.active_count() != 1:  # a fork must not inherit a lock held by another thread
        print(f"threads after import: {threading.enumerate()}", flush=True)
        sys.exit(1)
    exits: dict[int, str] = {}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(64)
        print("ready", flush=True)
        while True:
            readable, _, _ = select.select([server], [], [], 0.02)
            while exits:  # reap: write each status where its client looks
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                target = exits.pop(pid, None)
                if target is not None:
                    tmp = f"{target}.tmp"
                    Path(tmp).write_text(str(os.waitstatus_to_exitcode(status)))
                    os.replace(tmp, target)
            if not readable:
                continue
            conn, _ = server.accept()
            with conn:
                req = json.loads(conn.makefile("rb").readline())
                pid = os.fork()
                if pid == 0:
                    server.close()
                    conn.close()
                    _child(req)
                exits[pid] = req["exit_file"]
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
