"""The library tier's fixtures: one real Redis per test module with the library loaded (no
runner), and the typed facade over it (:class:`tests.support.library.Library`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.support.library import Library
from tests.support.stack import library_redis


@pytest.fixture(scope="module")
def r(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    yield from library_redis(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]))


@pytest.fixture(scope="module")
def lib(r: redis.Redis) -> Library:
    return Library(r)
