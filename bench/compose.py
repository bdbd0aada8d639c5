"""``docker compose up -d --scale turn-runner=N+1``: how long adding a runner takes until it serves.

A compose project of its own on the local images (``deploy/images/build``, cached by content; a
cold build is not counted), with its own passwords, port and volumes, removed after with ``down
-v``: the container tier's own :class:`tests.support.compose.Compose`. It starts with one runner; then for N = 1, 2, ...: the time from ``up -d --no-recreate
--scale turn-runner=N+1`` to the new container's ``service.started`` log line (connected, its
library checked, its endpoints answering, claiming work), and apart the time until the command
returned (compose's own work: the container created and started). A turn is run before and after,
so the runners are checked serving, not only started.

Where no Docker engine answers, the phase says so and measures nothing.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.compose import Compose, compose_command

from .stats import summary

SERVING_TIMEOUT_S = 180.0


def engine_answers() -> bool:
    return bool(shutil.which("docker")) and subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def _compose(cx: Compose, *args: str, timeout: float = 300) -> None:
    r = cx.run(*args, timeout=timeout, check=False)
    if r.returncode:
        raise RuntimeError(f"{' '.join(compose_command())} {' '.join(args)} failed ({r.returncode}): "
                           f"{(r.stderr or r.stdout)[-2000:]}")


def _runners(cx: Compose) -> set[str]:
    return set(cx.running("turn-runner"))


def _serving(cx: Compose, container: str) -> bool:
    return '"service.started"' in cx.logs_of(container)


def _wait(pred: Callable[[], bool], what: str, timeout: float = SERVING_TIMEOUT_S, pause: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(pause)


def _turn(cx: Compose) -> float:
    """One turn (echo) through the stack; its seconds from the POST to turn.end."""
    with httpx.Client(base_url=cx.url, headers={"Authorization": f"Bearer {cx.token}"}, timeout=30) as c:
        sid = c.post("/v1/sessions", json={"workspace": "bench"}).raise_for_status().json()["id"]
        t0 = time.monotonic()
        c.post(f"/v1/sessions/{sid}/messages", json={"text": "hello"}).raise_for_status()
        deadline = t0 + 60
        after = 0
        while time.monotonic() < deadline:
            evs = c.get(f"/v1/sessions/{sid}/events", params={"format": "json", "after": after, "wait": 2}).json()
            for e in evs:
                after = e["seq"]
                if e["type"] == "turn.end":
                    if e["outcome"] != "completed":
                        raise RuntimeError(f"the check turn ended {e['outcome']}: {e}")
                    return time.monotonic() - t0
        raise RuntimeError("the check turn did not end within 60 s")


def scale(tmp: Path, adds: int, log: Callable[[str], None]) -> dict[str, Any]:
    if not engine_answers() or not compose_command():
        return {"skipped": "no Docker engine answers (docker info) or no compose command"}
    t0 = time.monotonic()
    cx = Compose(tmp)  # builds the local images, or finds them in the cache
    log(f"  compose: images ready in {time.monotonic() - t0:.1f} s")
    try:
        t0 = time.monotonic()
        _compose(cx, "up", "-d", "--scale", "turn-runner=1", timeout=600)
        cx.wait_healthy(SERVING_TIMEOUT_S)
        first = _runners(cx)
        _wait(lambda: all(_serving(cx, c) for c in first), "the first runner serving")
        up_s = time.monotonic() - t0
        first_turn_s = _turn(cx)
        log(f"  compose: up (1 runner) in {up_s:.1f} s, a turn in {first_turn_s:.2f} s")
        command_s: list[float] = []
        serving_s: list[float] = []
        for n in range(1, adds + 1):
            before = _runners(cx)
            t0 = time.monotonic()
            _compose(cx, "up", "-d", "--no-recreate", "--scale", f"turn-runner={n + 1}")
            command_s.append(time.monotonic() - t0)
            new = _runners(cx) - before
            if len(new) != 1:
                raise RuntimeError(f"scaling to {n + 1} runners started {len(new)} new runner containers")
            container = new.pop()
            _wait(lambda: _serving(cx, container), f"runner {n + 1} serving")  # noqa: B023 - waited for here
            serving_s.append(time.monotonic() - t0)
            log(f"  compose: runner {n + 1} serving {serving_s[-1]:.2f} s after the command "
                f"(the command returned after {command_s[-1]:.2f} s)")
        after_turn_s = _turn(cx)
        return {"adds": adds, "up_s": round(up_s, 2), "serving_s": summary(serving_s),
                "command_s": summary(command_s), "turn_s": {"before": round(first_turn_s, 3),
                                                            "after": round(after_turn_s, 3)},
                "compose": " ".join(compose_command())}
    finally:
        cx.down()


async def measure(tmp: Path, adds: int, log: Callable[[str], None]) -> dict[str, Any]:
    return await asyncio.to_thread(scale, tmp, adds, log)
