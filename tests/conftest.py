"""Shared fixtures: real servers and whole stacks. Nothing here fakes NATS or Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cox.servers import NatsServer, RedisServer

from .stack import Api, Stack, stack_fixture


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server  # type: ignore[misc]


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    with NatsServer(tmp_path_factory.mktemp("nats")) as server:
        yield server  # type: ignore[misc]


# A shared two-runner stack for tests that only talk HTTP and use their own sessions.
stack = stack_fixture("stack", runners=2)


@pytest.fixture
def api(stack: Stack) -> Iterator[Api]:
    with stack.client() as client:
        yield client


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path
