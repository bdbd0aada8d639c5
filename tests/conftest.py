"""Shared fixtures: whole stacks on real servers. Nothing here fakes NATS or Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .stack import Api, Stack, stack_fixture


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="also run the tests marked long (the heaviest repetitions of the fault drills)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``long`` are deselected (not skipped) unless ``--long`` is given."""
    if config.getoption("--long"):
        return
    kept = [i for i in items if i.get_closest_marker("long") is None]
    dropped = [i for i in items if i.get_closest_marker("long") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# A shared two-runner stack for tests that only talk HTTP and use their own sessions.
stack = stack_fixture("stack", runners=2)


@pytest.fixture
def api(stack: Stack) -> Iterator[Api]:
    with stack.client() as client:
        yield client
