"""The test stacks' services as forks of one process that has them all imported.

A stack is six service processes; each used to be ``python -m cox_<service>``, a fresh
interpreter importing ~1.5 s of modules before it did anything, and the suite starts ~70 stacks
on a 2-core machine. The product's own fork server (:mod:`cox.forkserver`, which ``cox up``
uses) starts them here too: one per pytest process, which also has the MCP SDK imported (the
runner imports it at start when servers are configured, ~1 s of CPU). Nothing of the product is
replaced: each fork runs the module's ``__main__`` as ``python -m`` does, with its own
environment, folder and log. The entry points themselves (``python -m`` in the images, ``cox
up`` with ``COX_UP_FORK=0``) are started for real by the tests of ``cox up`` and the container tier.

``COX_TEST_FORK=0`` turns it off (every service a fresh interpreter).
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path

from cox.forkserver import PRELOAD as SERVICES
from cox.forkserver import Forked, ForkServer

__all__ = ["Forked", "enabled", "preload", "spawn"]


def preload() -> tuple[str, ...]:
    """What every fork finds imported: the services and the MCP SDK. Read when the first stack
    starts, not when this module is imported: the runner's MCP module imports pydantic-ai (~1.2 s
    of CPU), which a pytest process that never starts a stack must not pay."""
    from cox_runner.workspace.mcp_servers import SDK_MODULES

    return (*SERVICES, *SDK_MODULES)


def enabled() -> bool:
    return os.environ.get("COX_TEST_FORK", "1") != "0"


_server: ForkServer | None = None
_lock = threading.Lock()


def spawn(module: str, env: dict[str, str], log: Path, cwd: str | None = None) -> Forked:
    """Start ``python -m module`` as a fork of this pytest process's server."""
    global _server
    with _lock:
        if _server is None:
            _server = ForkServer(preload())
            atexit.register(_server.close)  # the server ends; the kernel SIGTERMs what still runs
        server = _server
    return server.spawn(module, env, log, cwd)
