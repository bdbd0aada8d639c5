"""NATS and Redis in containers (testcontainers), chosen by one switch: ``COX_TEST_DOCKER=1``.

Same interface as :class:`cox.servers.NatsServer`/``RedisServer`` (``start``, ``stop``,
``kill``, ``url``, ``admin_url``, the same users and rights): a stopped or killed container starts
again on the same host port with its data, as the outage tests need. Readiness is the same log line, counted, so a restart waits
for a *new* ready line rather than finding the old one.

``COX_TEST_DOCKER=1``: every stack's NATS and Redis are containers, from the images
``./dev images`` builds (``coxswain/nats:local``, ``coxswain/redis:local``; ``COX_NATS_IMAGE`` and
``COX_REDIS_IMAGE`` name others, e.g. the official ``nats:2.11``/``redis:7`` where a registry is
reachable); an engine that does not answer, or a missing image, fails the run rather than
quietly testing something else. Unset or ``0``: local binaries.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from cox.creds import Credentials, nats_admin_url, redis_admin_url, write_private
from cox.servers import free_port, nats_config, redis_user_args

# Ryuk, testcontainers' reaper, is an image from Docker Hub, which no machine here can pull; each
# container is removed by the stack that started it (close()).
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
NATS_IMAGE = os.environ.get("COX_NATS_IMAGE", "coxswain/nats:local")
REDIS_IMAGE = os.environ.get("COX_REDIS_IMAGE", "coxswain/redis:local")


def engine_problem() -> str:
    """Why containers cannot run here ("" when an engine answers and both images are on it)."""
    try:
        import docker
        import testcontainers  # noqa: F401
    except ImportError as exc:
        return f"the docker/testcontainers packages are missing ({exc})"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - whatever the SDK raises, it is the reason
        return f"no Docker engine answers ({exc})"
    for image in (NATS_IMAGE, REDIS_IMAGE):
        try:
            client.images.get(image)
        except Exception:  # noqa: BLE001
            return f"image {image} is not on the engine (./dev images builds it)"
    return ""


@functools.cache
def docker_available() -> bool:
    """Whether stacks use containers: ``COX_TEST_DOCKER=1`` (then they must be able to)."""
    if os.environ.get("COX_TEST_DOCKER", "0") != "1":
        return False
    problem = engine_problem()
    if problem:
        raise RuntimeError(f"COX_TEST_DOCKER=1 but {problem}")
    return True


class _Container:
    image = ""
    internal_port = 0
    ready_line = ""

    def __init__(self, workdir: Path | None = None, port: int | None = None,
                 credentials: Credentials | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.credentials = credentials or Credentials.generate()
        self._tc: Any = None

    @property
    def command(self) -> list[str]:
        raise NotImplementedError

    def _configure(self, tc: Any) -> Any:
        """Anything the container needs besides its command (a mounted config file)."""
        return tc

    @property
    def url(self) -> str:
        raise NotImplementedError

    def _ready_count(self) -> int:
        out, err = self._tc.get_logs()
        return int((out + err).decode(errors="replace").count(self.ready_line))

    def _wait_ready(self, before: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready_count() > before:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.image} did not become ready on port {self.port}")

    def start(self) -> _Container:
        if self._tc is None:
            from testcontainers.core.container import DockerContainer

            self._tc = self._configure(DockerContainer(self.image).with_command(self.command)
                                       .with_bind_ports(self.internal_port, self.port))
            self._tc.start()
            self._wait_ready(0)
        else:
            before = self._ready_count()
            self._tc.get_wrapped_container().start()
            self._wait_ready(before)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._tc is not None:
            self._tc.get_wrapped_container().stop(timeout=int(timeout))

    def kill(self) -> None:
        if self._tc is not None:
            self._tc.get_wrapped_container().kill()

    def close(self) -> None:
        if self._tc is not None:
            self._tc.stop()
            self._tc = None


class NatsContainer(_Container):
    image = NATS_IMAGE
    internal_port = 4222
    ready_line = "Server is ready"

    @property
    def command(self) -> list[str]:
        return ["-c", "/etc/nats/nats.conf"]

    def _configure(self, tc: Any) -> Any:
        # The same users and rights as cox.servers.NatsServer, in a 0600 file mounted read-only.
        conf = Path(self.workdir or tempfile.mkdtemp(prefix="cox-nats-")) / "nats.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        write_private(conf, nats_config("0.0.0.0:4222", "cox", "/data", self.credentials))
        # As root, as the official image runs: the image's nats user could not read a 0600 file of ours.
        return tc.with_volume_mapping(str(conf), "/etc/nats/nats.conf", "ro").with_kwargs(user="0")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return nats_admin_url(self.url, self.credentials)


class RedisContainer(_Container):
    image = REDIS_IMAGE
    internal_port = 6379
    ready_line = "Ready to accept connections"

    @property
    def command(self) -> list[str]:
        # The users as arguments (only the passwords' SHA-256): the image's redis user could not
        # read a 0600 ACL file of ours.
        return ["redis-server", "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                *redis_user_args(self.credentials)]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def admin_url(self) -> str:
        return redis_admin_url(self.url, self.credentials)
