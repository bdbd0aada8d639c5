"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Protocol

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> None:
    """``preexec_fn``: ask the kernel to SIGTERM this child when its parent dies (Linux).

    Used for the servers and services ``cox up`` starts and for the commands a runner runs, so
    even a SIGKILL of the parent leaves no orphan behind. ``parent`` (the pid that forked, as
    :func:`dies_with_me` passes it): a parent that died between the fork and the ``prctl`` sends
    no signal, so the child sees another parent and ends itself at once.
    """
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        os._exit(128 + signal.SIGTERM)


def dies_with_me() -> Callable[[], None]:
    """The ``preexec_fn`` for a child of this process: :func:`die_with_parent` with this pid."""
    return functools.partial(die_with_parent, os.getpid())


OURS = ("COX_", "NATS_", "REDIS_")
"""The prefixes of coxswain's settings and server addresses and users in an environment."""


def foreign_env() -> dict[str, str]:
    """This process's environment without coxswain's own variables (:data:`OURS`): what a child
    that is given its own settings, servers and credentials starts from."""
    return {k: v for k, v in os.environ.items() if not k.startswith(OURS)}


class Child(Protocol):
    """What :func:`terminate_tree` needs of a child: a :class:`subprocess.Popen`, or a fork of
    ``cox up``'s fork server (``cox.forkserver.Forked``)."""

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int, /) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def terminate_tree(proc: Child, timeout: float = 10.0) -> None:
    """SIGTERM a child, SIGKILL after ``timeout``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        proc.wait(5)
