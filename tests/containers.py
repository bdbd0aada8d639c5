"""NATS and Redis in containers (testcontainers), for machines where a Docker engine answers.

Same interface as :class:`cox.servers.NatsServer`/``RedisServer`` (``start``, ``stop``,
``kill``, ``url``, ``admin_url``, the same users and rights): a stopped or killed container starts
again on the same host port with its data, as the outage tests need. Readiness is the same log line, counted, so a restart waits
for a *new* ready line rather than finding the old one.

``COX_TEST_DOCKER=0`` forces local binaries; without a reachable engine they are used anyway, and
so they are when the images are not already on the engine: no registry is reachable from the
project's machines, so pulling them would only fail.
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


@functools.cache
def docker_available() -> bool:
    if os.environ.get("COX_TEST_DOCKER", "") == "0":
        return False
    try:
        import docker
        import testcontainers  # noqa: F401

        client = docker.from_env(timeout=2)
        client.ping()
        for image in (NatsContainer.image, RedisContainer.image):
            client.images.get(image)
        return True
    except Exception:  # noqa: BLE001 - no SDK, no engine, no permission: local binaries then
        return False


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
    image = "nats:2.11"
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
        return tc.with_volume_mapping(str(conf), "/etc/nats/nats.conf", "ro")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return nats_admin_url(self.url, self.credentials)


class RedisContainer(_Container):
    image = "redis:7"
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
