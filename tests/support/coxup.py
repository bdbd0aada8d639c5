"""A real ``cox up`` for the client tests: the command a person runs, in its own folder.

The console and the terminal chat are tested against exactly what ``./dev up`` starts (its own
NATS and Redis, every service as a supervised process), not a hand-assembled stack, so a test
can also kill the gateway and watch ``cox up`` restart it while a client is connected.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from cox.servers import free_port
from cox.up import READY_TIMEOUT_S
from coxswain.proc import terminate_tree

from .stack import Api, default_lease_ms

TOKEN = "client-test-token"
READY_BULK_S = 180.0
"""cox up --ready-timeout in CI's parallel lane (COX_TEST_BULK), whose first stacks start beside the drills."""


def bulk_lease(config: str) -> str:
    """``config`` with, in CI's parallel lane (``COX_TEST_BULK``), the 60 s lease its other stacks
    hold (:func:`.stack.default_lease_ms`) unless it names one. cox up gives its services their
    settings from the config file only (no ``COX_`` variable reaches them); at its own 5 s a
    runner starved for CPU there missed its renewals, and a console test's pending approval ended
    with its turn, taken over as crashed."""
    if not os.environ.get("COX_TEST_BULK"):
        return config
    parsed = tomllib.loads(config)
    if "lease_ms" in parsed.get("runner", {}):
        return config
    line = f"lease_ms = {default_lease_ms()}"
    if "runner" in parsed:
        return re.sub(r"^\[runner\][ \t]*$", lambda m: m.group(0) + "\n" + line, config, count=1, flags=re.M)
    return config + f"\n[runner]\n{line}\n"


class CoxUp:
    def __init__(self, tmp: Path, config: str = "", runners: int = 2) -> None:
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.root = tmp / "workspaces"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = TOKEN
        self.config = tmp / "coxswain.toml"
        self.config.write_text(bulk_lease(config))
        self.runners = runners
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._pumping: threading.Thread | None = None
        self.err_path = tmp / "cox-up.stderr"
        """cox up's own structured log lines (child.exited, server.restarted, ...)."""

    def start(self, timeout: float | None = None) -> CoxUp:
        # CI's parallel lane starts its first stacks beside the drills and the image build on two cores:
        # cox up's own 60 s for /healthz is not enough there (stop 39's CI), so it gets 180 s.
        ready_s = READY_BULK_S if os.environ.get("COX_TEST_BULK") else READY_TIMEOUT_S
        timeout = timeout if timeout is not None else ready_s + 30
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COX_", "NATS_URL", "REDIS_URL"))}
        with open(self.err_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cox", "up", "--port", str(self.port), f"--token={self.token}",
                 "--root", str(self.root), "--config", str(self.config), "--runners", str(self.runners),
                 "--no-demo", f"--ready-timeout={ready_s:g}"],
                cwd=self.tmp, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
            )
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(line.startswith("ready:") for line in self.lines):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        logs = "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                         for p in [self.err_path, *sorted((self.tmp / ".cox" / "logs").glob("*.log"))] if p.exists())
        self.stop()
        raise RuntimeError(f"cox up was not ready within {timeout}s: {self.lines}\n{logs}")

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.proc.stdout:  # closed at cox up's end of output, not by the garbage collector
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))

    def stop(self) -> None:
        if self.proc is not None:
            terminate_tree(self.proc, 60)
        if self._pumping is not None:
            self._pumping.join(10)

    def said(self) -> list[dict[str, Any]]:
        """cox up's log records so far."""
        out = []
        for line in self.err_path.read_text(errors="replace").splitlines() if self.err_path.exists() else []:
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def client(self) -> Api:
        return Api(self.url, self.token)

    def child(self, module: str) -> psutil.Process:
        assert self.proc is not None
        for p in psutil.Process(self.proc.pid).children(recursive=True):  # forks of its fork server
            with contextlib.suppress(psutil.Error):
                if module in " ".join(p.cmdline()):
                    return p
        raise LookupError(f"no {module} child")

    def kill_gateway(self) -> int:
        """SIGKILL the gateway; ``cox up`` restarts it. Returns the killed pid."""
        p = self.child("cox_gateway")
        p.kill()
        p.wait(10)
        pid: int = p.pid
        return pid

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=3).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"cox up not healthy again within {timeout}s")


@contextlib.contextmanager
def cox_up(tmp: Path, config: str = "", runners: int = 2) -> Iterator[CoxUp]:
    up = CoxUp(tmp, config, runners)
    up.start()
    try:
        yield up
    finally:
        up.stop()
