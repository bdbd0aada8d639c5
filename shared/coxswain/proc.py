"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import contextlib
import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: ask the kernel to SIGTERM this child when its parent dies (Linux).

    Used for the servers and services ``cox up`` starts and for the commands a runner runs, so
    even a SIGKILL of the parent leaves no orphan behind.
    """
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
