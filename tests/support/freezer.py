"""Pause a process as a VM stall or ``docker pause`` does: the kernel's cgroup freezer.

A drill that pauses a runner past its lease needs the pause to hold until the drill ends it.
SIGSTOP does not promise that: any SIGCONT resumes the process, and the kernel itself sends one
(after a SIGHUP, which a runner takes as "reload its limits") to every process of a group that
becomes orphaned while one of them is stopped. A frozen cgroup wakes for nothing but its thaw.

The process alone moves into a cgroup of its own, in the v1 ``freezer`` hierarchy where there is
one (a hybrid host) and else in the unified one (``cgroup.freeze``, a pure v2 host); its children
stay where they are and run on (a paused runner's command goes on and ends, as it would in a VM
whose runner process stalled). It needs root, as making any cgroup does: elsewhere
:func:`available` says why not and the caller falls back to SIGSTOP.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V1 = ROOT / "freezer"


def available() -> str:
    """``"v1"``, ``"v2"``, or ``""`` when this process cannot freeze one of its children."""
    if os.geteuid() != 0:
        return ""
    if (V1 / "cgroup.procs").exists() and os.access(V1, os.W_OK):
        return "v1"
    if (ROOT / "cgroup.controllers").exists() and os.access(ROOT, os.W_OK):
        return "v2"
    return ""


def _own(pid: int, hierarchy: str) -> str:
    """The cgroup ``pid`` is in, in the v1 hierarchy named ``hierarchy`` ("freezer") or the
    unified one ("")."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (hierarchy and hierarchy in names.split(",")) or (not hierarchy and names == ""):
            return path
    raise RuntimeError(f"process {pid} is in no {hierarchy or 'unified'} cgroup")


class Frozen:
    """One process frozen in a cgroup of its own until :meth:`thaw`."""

    def __init__(self, pid: int, kind: str) -> None:
        self.pid = pid
        self.kind = kind
        base = V1 if kind == "v1" else ROOT
        self.home = base / _own(pid, "freezer" if kind == "v1" else "").lstrip("/")
        self.dir = base / f"cox-test-pause-{pid}-{time.monotonic_ns()}"

    def freeze(self, timeout: float = 5.0) -> None:
        self.dir.mkdir()
        try:
            (self.dir / "cgroup.procs").write_text(str(self.pid))
            if self.kind == "v1":
                (self.dir / "freezer.state").write_text("FROZEN")
            else:
                (self.dir / "cgroup.freeze").write_text("1")
            deadline = time.monotonic() + timeout
            while not self.frozen():
                if time.monotonic() > deadline:
                    raise AssertionError(f"process {self.pid} did not freeze within {timeout} s")
                time.sleep(0.005)
        except BaseException:
            self.thaw()
            raise

    def frozen(self) -> bool:
        with contextlib.suppress(OSError):
            if self.kind == "v1":
                return (self.dir / "freezer.state").read_text().strip() == "FROZEN"
            return "frozen 1" in (self.dir / "cgroup.events").read_text().splitlines()
        return False

    def thaw(self) -> None:
        """Thaw it and put it back where it was; the cgroup goes (a process that has died
        meanwhile leaves nothing behind either)."""
        with contextlib.suppress(OSError):
            if self.kind == "v1":
                (self.dir / "freezer.state").write_text("THAWED")
            else:
                (self.dir / "cgroup.freeze").write_text("0")
        with contextlib.suppress(OSError):
            (self.home / "cgroup.procs").write_text(str(self.pid))
        deadline = time.monotonic() + 5
        while self.dir.exists():
            try:
                self.dir.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
