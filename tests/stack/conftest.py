"""The stack tier's shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_providers import FakeModels


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModels]:
    """The fake model servers (OpenAI and Anthropic shaped), one per test module."""
    with FakeModels() as f:
        yield f
