"""The suite's rules: tiers by folder, ``--long``, and the skip policy. Fixtures live in
``tests/support/``; nothing here fakes NATS or Redis.

Tiers (a folder each, and a marker of the same name given to every test in it):

``fast``        no server at all (seconds)
``redis``       a real Redis and the Lua library, no services
``stack``       whole stacks: every service as a process on real NATS and Redis
``console``     the browser console (Debian's chromium through Playwright) on a whole stack
``faults``      servers killed, paused and restarted under load (serial lane)
``cluster``     a Redis Cluster and a 3-node NATS cluster on loopback (serial lane)
``containers``  compose and testcontainers on a real Docker engine

A test marked ``serial`` runs alone in CI's serial lane (it bounds a time or loads the machine).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import Api, Stack, stack_fixture

TESTS = Path(__file__).resolve().parent
TIERS = ("fast", "redis", "stack", "console", "faults", "cluster", "containers")
SKIPS = TESTS / "skips.toml"
SLOWEST_FIRST = ("console/test_console_trust.py", "stack/test_state_machine.py", "stack/test_mcp.py",
                 "stack/test_attachments.py", "stack/test_server_auth.py", "stack/test_sandbox_root.py",
                 "console/test_console_review.py", "stack/test_egress.py", "stack/test_loop.py",
                 "stack/test_compaction.py", "stack/test_acp.py", "stack/test_webhooks.py",
                 "stack/test_cox_sweep.py", "stack/test_openapi.py", "stack/test_chat.py")
"""The parallel lane's longest files (CI's ``.venv/parallel-lane.xml``: 46-294 s of worker time
each on a 2-core host), collected first: ``--dist loadfile --no-loadscope-reorder`` hands files
out in collection order, and a long file handed out last keeps one worker busy while the others
wait. (Without ``--no-loadscope-reorder`` xdist hands them out by their count of tests instead,
and this order is not used.) The rest keep their order."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="also run the tests marked long (the heaviest repetitions of the fault drills)")
    parser.addoption("--strict-skips", action="store_true", default=False,
                     help="a skip whose reason is not allowed in tests/skips.toml fails (CI sets it)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its folder's tier marker; tests marked ``long`` are deselected (not
    skipped) unless ``--long`` is given."""
    for item in items:
        parts = Path(str(item.fspath)).resolve().relative_to(TESTS).parts
        if len(parts) > 1 and parts[0] in TIERS:
            item.add_marker(parts[0])
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda i: rank.get(Path(str(i.fspath)).resolve().relative_to(TESTS).as_posix(), len(rank)))
    if config.getoption("--long"):
        return
    kept = [i for i in items if i.get_closest_marker("long") is None]
    dropped = [i for i in items if i.get_closest_marker("long") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """CI's parallel lane (``COX_TEST_BULK=1``) gives its stacks a 60 s lease (see
    ``default_lease_ms``): a test there that killed a runner would wait a minute for its takeover
    or time out. Such a test is marked ``faults`` and deselected from that lane; one that was not
    is refused here, by name, before anything runs."""
    if not os.environ.get("COX_TEST_BULK"):
        return
    drills = [i.nodeid for i in session.items if i.get_closest_marker("faults") or i.get_closest_marker("cluster")]
    if drills:
        raise pytest.UsageError("COX_TEST_BULK (the parallel lane's 60 s lease) with fault or cluster drills "
                                f"selected (deselect them: -m 'not faults and not cluster'): {drills[:5]}")


def allowed_skips() -> list[tuple[re.Pattern[str], str]]:
    """The reasons a skip may have in CI (``tests/skips.toml``): each a pattern and why a test
    with that reason cannot run on the CI machine."""
    data = tomllib.loads(SKIPS.read_text())
    return [(re.compile(a["reason"]), a["why"]) for a in data.get("allow", [])]


def skip_reason(report: pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under ``--strict-skips`` a skip is a failure unless its reason is allowed: a tier that
    vanishes because a tool is missing must not leave CI green."""
    outcome: Any = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not item.config.getoption("--strict-skips"):
        return
    reason = skip_reason(report)
    if any(p.search(reason) for p, _ in allowed_skips()):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped, and the reason is not allowed in tests/skips.toml (--strict-skips): {reason}\n"
                       "Install what the test needs (./dev does as root), or allow the reason there with why.")


# A shared two-runner stack for tests that only talk HTTP and use their own sessions: one per
# test process (each xdist worker its own), so the modules that use it do not each start one.
stack = stack_fixture("stack", runners=2, scope="session")


@pytest.fixture
def api(stack: Stack) -> Iterator[Api]:
    with stack.client() as client:
        yield client
