"""A runner started into a running stack: from its start to "serving" (its ``service.started``
line: connected, its library checked, its endpoints and health answering, claiming work).

Two ways, alternated on the same stack: a fresh interpreter (``python -m cox_runner``, as the
images and ``COX_UP_FORK=0`` start it) and a fork of a fork server that has the runner imported
(``cox/forkserver.py``, as ``cox up`` starts it). Each gets the environment ``cox up`` gives a
runner (its own NATS and Redis user, the stack's config, root and token) and a name of its own;
it is stopped (SIGTERM) once serving, after its RSS is read (idle: it has run no turn, so it
holds no turn machinery: ``cox_runner.drive.TURNS``; a fork's RSS counts the pages it shares with
the fork server, which has that machinery imported).

What a fresh runner's first turn pays instead: the machinery's import, timed in a fresh
interpreter that has imported the service (``turns_import``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from cox.forkserver import Forked, ForkServer
from coxswain import config as cfgmod
from coxswain.proc import foreign_env

from .stack import Stack
from .stats import summary

TIMEOUT_S = 60.0
IDLE_S = 1.0
"""How long a runner serves before its RSS is read."""
TURNS_IMPORT = ("import json, time, cox_runner.service; from cox_runner import drive; t = time.perf_counter(); "
                "import cox_runner.loop; print(json.dumps([time.perf_counter() - t, drive.TURNS]))")


def _env(stack: Stack, instance: str) -> dict[str, str]:
    creds = stack.servers.credentials
    base = foreign_env()
    return {
        **base, "PYTHONUNBUFFERED": "1",
        "COX_NATS_URL": stack.servers.nats.url, "COX_REDIS_URL": stack.servers.redis.url,
        "COX_TOKEN": stack.token, "COX_ROOT": str(stack.root), "COX_PORT": str(stack.port),
        cfgmod.CONFIG_ENV: str(stack.config), "COX_INSTANCE": instance,
        **creds.nats_env("turn-runner"), **creds.redis_env("turn-runner"),
    }


async def _serving(proc: subprocess.Popen[bytes] | Forked, log: Path) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < TIMEOUT_S:
        if log.exists() and '"service.started"' in log.read_text(errors="replace"):
            return time.monotonic() - t0
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.005)
    raise RuntimeError(f"the runner did not start serving: {log.read_text(errors='replace')[-2000:]}")


def _launch(kind: str, forks: ForkServer, env: dict[str, str], log: Path, instance: str
            ) -> subprocess.Popen[bytes] | Forked:
    if kind == "fork":
        return forks.spawn("cox_runner", env, log, name=instance)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "cox_runner"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def runner_start(stack: Stack, tries: int) -> dict[str, Any]:
    forks = ForkServer(preload=("cox_runner.service", "cox_runner.loop"))  # as cox up's
    forks.start()
    await asyncio.to_thread(forks.ready)
    took: dict[str, list[float]] = {"fresh": [], "fork": []}
    rss: dict[str, list[float]] = {"fresh": [], "fork": []}
    try:
        for i in range(tries):
            for kind in took:
                instance = f"turn-runner-start-{kind}-{i}"
                log = stack.tmp / f"{instance}.log"
                env = _env(stack, instance)
                t0 = time.monotonic()
                proc = _launch(kind, forks, env, log, instance)
                try:
                    await _serving(proc, log)
                    took[kind].append(time.monotonic() - t0)
                    await asyncio.sleep(IDLE_S)
                    rss[kind].append(psutil.Process(proc.pid).memory_info().rss / 2**20)
                finally:
                    proc.terminate()
                    await asyncio.to_thread(proc.wait, 30)
    finally:
        await asyncio.to_thread(forks.close)
    return {"tries": tries, "fresh_s": summary(took["fresh"]), "fork_s": summary(took["fork"]),
            "fresh_rss_mb": summary(rss["fresh"]), "fork_rss_mb": summary(rss["fork"]),
            "turns_import_s": await turns_import(tries)}


async def turns_import(tries: int) -> dict[str, Any]:
    """The turn machinery's import after the service's, in a fresh interpreter: what a fresh
    runner's first drive waits for (off its event loop) before its first turn."""
    took = []
    for _ in range(tries):
        out = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", TURNS_IMPORT], env=foreign_env(),
                                      capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
        took.append(json.loads(out.stdout)[0])
    return summary(took)
