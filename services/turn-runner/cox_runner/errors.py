"""Runner-internal errors.

    LeaseLost      the session's lease is no longer ours: stop at once, write nothing more
    └── StoreDown  Redis did not answer the holder's call, nor any of its retries (store.py):
                   the runner writes nothing more and lets the lease lapse (takeover ends the turn)
    StopRequested  Stop or steer asked the running turn to end (carries the reason)
    SandboxUnavailable (a CoxError, 503) the command sandbox cannot start: the command is
                   refused, never run bare
"""

from __future__ import annotations

from coxswain.errors import CoxError


class LeaseLost(Exception):
    """A fenced write was refused or renewal failed past the deadline."""


class StoreDown(LeaseLost):
    """Redis failed under a call of the turn's holder (connection lost, timeout)."""


class StopRequested(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SandboxUnavailable(CoxError):
    """bwrap is missing or may not make its namespaces here (fail closed)."""

    code = "sandbox_unavailable"
    status = 503
