"""Shared fixtures: whole stacks on real servers. Nothing here fakes NATS or Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .stack import Api, Stack, stack_fixture

# A shared two-runner stack for tests that only talk HTTP and use their own sessions.
stack = stack_fixture("stack", runners=2)


@pytest.fixture
def api(stack: Stack) -> Iterator[Api]:
    with stack.client() as client:
        yield client
