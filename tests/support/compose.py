"""The compose file on a real Docker engine: a project in a folder of its own, on the local images.

Which Compose: Docker's ``docker compose`` (v2) when the docker CLI has it, else the older
``docker-compose`` (v1, Debian's package, all the project's machines have). Both take the same
commands used here (``up -d``, ``--scale``, ``ps -q``, ``restart``, ``down -v``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from cox.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = ("TOKEN", "ADMIN_PASSWORD", "GATEWAY_PASSWORD", "TURN_RUNNER_PASSWORD", "GUARD_PASSWORD",
             "JUDGE_PASSWORD", "VERSIONS_PASSWORD")


@functools.cache
def compose_command() -> list[str]:
    """``docker compose`` (v2) if the CLI has it, else ``docker-compose`` (v1); [] when neither."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return []


@functools.cache
def local_images() -> dict[str, str]:
    """Build (or find, cached) the local images; the variables that point compose at them."""
    out = subprocess.run([str(ROOT / "deploy" / "images" / "build")], check=True, capture_output=True, text=True,
                         timeout=1800).stdout
    line = next(x for x in out.splitlines() if x.startswith("export "))
    return dict(kv.split("=", 1) for kv in line.removeprefix("export ").split())


def project_dir(parent: Path) -> Path:
    """A folder holding what compose reads (the compose file and deploy/), as a checkout has it."""
    d = parent / f"cox{os.getpid()}{time.monotonic_ns() % 10**6}"
    d.mkdir()
    shutil.copy(ROOT / "docker-compose.yml", d)
    shutil.copytree(ROOT / "deploy", d / "deploy", ignore=shutil.ignore_patterns("images"))
    return d


def leftovers(project: str) -> dict[str, list[str]]:
    """Containers, networks and volumes of a compose project still on the engine."""
    label = f"label=com.docker.compose.project={project}"
    found = {}
    for kind, cmd in (("containers", ["docker", "ps", "-aq"]), ("networks", ["docker", "network", "ls", "-q"]),
                      ("volumes", ["docker", "volume", "ls", "-q"])):
        found[kind] = subprocess.run([*cmd, "--filter", label], capture_output=True, text=True,
                                     check=True).stdout.split()
    return found


class Compose:
    """One compose project: its folder, its passwords, its port."""

    def __init__(self, parent: Path) -> None:
        self.dir = project_dir(parent)
        self.project = self.dir.name
        self.port = free_port()
        self.env = {**os.environ, **local_images(), "COX_PORT": str(self.port), "COMPOSE_PROJECT_NAME": self.project}
        for name in PASSWORDS:
            self.env[f"COX_{name}"] = "p" + os.urandom(16).hex()
        self.token = self.env["COX_TOKEN"]
        self.url = f"http://127.0.0.1:{self.port}"

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*compose_command(), *args], cwd=self.dir, env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            # what compose said, not only its exit status (a CI run failed `up -d` with nothing more)
            raise AssertionError(f"{' '.join(compose_command())} {' '.join(args)} exited {done.returncode} "
                                 f"(project {self.project}, port {self.port}):\n{done.stderr[-3000:]}\n"
                                 f"{done.stdout[-1000:]}")
        return done

    def up(self, *args: str) -> None:
        self.run("up", "-d", *args)
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                r = httpx.get(self.url + "/healthz", timeout=3)
                last = r.text
                if r.status_code == 200:
                    return dict(r.json())
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.5)
        logs = self.run("logs", "--tail", "30", check=False).stdout
        raise AssertionError(f"compose project {self.project} not healthy: {last}\n{logs}")

    def containers(self, service: str) -> list[str]:
        return self.run("ps", "-q", service).stdout.split()

    def running(self, service: str) -> list[str]:
        ids = self.containers(service)
        if not ids:
            return []
        out = subprocess.run(["docker", "inspect", "-f", "{{.Id}} {{.State.Running}}", *ids], capture_output=True,
                             text=True, check=True).stdout.split("\n")
        return [line.split()[0] for line in out if line.endswith(" true")]

    def logs_of(self, container: str) -> str:
        r = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
        return r.stdout + r.stderr

    def down(self) -> None:
        self.run("down", "-v", "--remove-orphans", timeout=180, check=False)
