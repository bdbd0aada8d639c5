"""Runner-internal errors.

    LeaseLost      the session's lease is no longer ours: stop at once, write nothing more
    StopRequested  Stop or steer asked the running turn to end (carries the reason)
"""

from __future__ import annotations


class LeaseLost(Exception):
    """A fenced write was refused or renewal failed past the deadline."""


class StopRequested(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
