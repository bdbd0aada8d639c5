"""``docker compose up -d --scale turn-runner=N+1``: how long adding a runner takes until it serves.

A compose project of its own on the local images (``deploy/images/build``, cached by content; a
cold build is not counted), with its own passwords, port and volumes, removed after with ``down
-v``. It starts with one runner; then for N = 1, 2, ...: the time from ``up -d --no-recreate
--scale turn-runner=N+1`` to the new container's ``service.started`` log line (connected, its
library checked, its endpoints answering, claiming work), and apart the time until the command
returned (compose's own work: the container created and started). A turn is run before and after,
so the runners are checked serving, not only started.

Where no Docker engine answers, the phase says so and measures nothing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from cox.servers import free_port

from .stats import summary

ROOT = Path(__file__).resolve().parents[1]
PASSWORDS = ("TOKEN", "ADMIN_PASSWORD", "GATEWAY_PASSWORD", "TURN_RUNNER_PASSWORD", "GUARD_PASSWORD",
             "JUDGE_PASSWORD", "VERSIONS_PASSWORD")
SERVING_TIMEOUT_S = 180.0


def compose_command() -> list[str]:
    """``docker compose`` (v2) if the CLI has it, else ``docker-compose`` (v1); [] when neither."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else []


def engine_answers() -> bool:
    return bool(shutil.which("docker")) and subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def local_images() -> dict[str, str]:
    """The variables that point compose at the local images (built, or found in the cache)."""
    out = subprocess.run([str(ROOT / "deploy" / "images" / "build")], check=True, capture_output=True, text=True,
                         timeout=1800).stdout
    line = next(x for x in out.splitlines() if x.startswith("export "))
    return dict(kv.split("=", 1) for kv in line.removeprefix("export ").split())


class Project:
    def __init__(self, tmp: Path, images: dict[str, str]) -> None:
        self.dir = tmp / f"coxbench{os.getpid()}"
        self.dir.mkdir(parents=True)
        shutil.copy(ROOT / "docker-compose.yml", self.dir)
        shutil.copytree(ROOT / "deploy", self.dir / "deploy", ignore=shutil.ignore_patterns("images"))
        self.name = self.dir.name
        self.port = free_port()
        self.env = {**os.environ, **images, "COX_PORT": str(self.port), "COMPOSE_PROJECT_NAME": self.name}
        for name in PASSWORDS:
            self.env[f"COX_{name}"] = "p" + os.urandom(16).hex()
        self.url = f"http://127.0.0.1:{self.port}"
        self.compose = compose_command()

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([*self.compose, *args], cwd=self.dir, env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode:
            raise RuntimeError(f"{' '.join(self.compose)} {' '.join(args)} failed ({r.returncode}): "
                               f"{(r.stderr or r.stdout)[-2000:]}")
        return r

    def runners(self) -> set[str]:
        out = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter", f"label=com.docker.compose.project={self.name}",
                              "--filter", "label=com.docker.compose.service=turn-runner"],
                             capture_output=True, text=True, check=True).stdout
        return set(out.split())

    @staticmethod
    def serving(container: str) -> bool:
        r = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
        return '"service.started"' in r.stdout + r.stderr


def _wait(pred: Callable[[], bool], what: str, timeout: float = SERVING_TIMEOUT_S, pause: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(pause)


def _turn(p: Project) -> float:
    """One turn (echo) through the stack; its seconds from the POST to turn.end."""
    with httpx.Client(base_url=p.url, headers={"Authorization": f"Bearer {p.env['COX_TOKEN']}"}, timeout=30) as c:
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


def _healthy(p: Project) -> bool:
    try:
        return httpx.get(f"{p.url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def scale(tmp: Path, adds: int, log: Callable[[str], None]) -> dict[str, Any]:
    if not engine_answers() or not compose_command():
        return {"skipped": "no Docker engine answers (docker info) or no compose command"}
    t0 = time.monotonic()
    images = local_images()
    log(f"  compose: images ready in {time.monotonic() - t0:.1f} s")
    p = Project(tmp, images)
    try:
        t0 = time.monotonic()
        p.run("up", "-d", "--scale", "turn-runner=1", timeout=600)
        _wait(lambda: _healthy(p), "the compose stack's /healthz")
        first = p.runners()
        _wait(lambda: all(p.serving(c) for c in first), "the first runner serving")
        up_s = time.monotonic() - t0
        first_turn_s = _turn(p)
        log(f"  compose: up (1 runner) in {up_s:.1f} s, a turn in {first_turn_s:.2f} s")
        command_s: list[float] = []
        serving_s: list[float] = []
        for n in range(1, adds + 1):
            before = p.runners()
            t0 = time.monotonic()
            p.run("up", "-d", "--no-recreate", "--scale", f"turn-runner={n + 1}")
            command_s.append(time.monotonic() - t0)
            new = p.runners() - before
            if len(new) != 1:
                raise RuntimeError(f"scaling to {n + 1} runners started {len(new)} new runner containers")
            container = new.pop()
            _wait(lambda: p.serving(container), f"runner {n + 1} serving")  # noqa: B023 - waited for here
            serving_s.append(time.monotonic() - t0)
            log(f"  compose: runner {n + 1} serving {serving_s[-1]:.2f} s after the command "
                f"(the command returned after {command_s[-1]:.2f} s)")
        after_turn_s = _turn(p)
        return {"adds": adds, "up_s": round(up_s, 2), "serving_s": summary(serving_s),
                "command_s": summary(command_s), "turn_s": {"before": round(first_turn_s, 3),
                                                            "after": round(after_turn_s, 3)},
                "compose": " ".join(p.compose)}
    finally:
        try:
            p.run("down", "-v", "--remove-orphans", timeout=300)
        except Exception as exc:  # noqa: BLE001 - reported; the run's result stands
            log(f"  compose: down -v failed: {exc}")


async def measure(tmp: Path, adds: int, log: Callable[[str], None]) -> dict[str, Any]:
    return await asyncio.to_thread(scale, tmp, adds, log)
