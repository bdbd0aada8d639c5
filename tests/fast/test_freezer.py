"""The drills' pause (tests/support/freezer.py): it holds through a SIGCONT, where SIGSTOP did not.

A drill that paused a runner past its lease with SIGSTOP saw, several times in CI, the turn end
``completed``: the paused runner had run on. Any SIGCONT ends a SIGSTOP (the kernel sends one
itself to a process group that becomes orphaned with a stopped member); a frozen cgroup wakes for
its thaw alone. The process's children stay outside the freeze, as a stalled runner's command runs on.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import freezer

COUNT = """
import os, subprocess, sys, time
path = sys.argv[1]
if len(sys.argv) > 2:  # a child of its own, counting in another file, outside any freeze of this one
    subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1] + ".child"])
n = 0
while True:
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    time.sleep(0.01)
"""


def read(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def moves(path: Path, timeout: float = 5.0) -> bool:
    """Whether the count in ``path`` goes up within ``timeout``."""
    first = read(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if read(path) > first:
            return True
        time.sleep(0.02)
    return False


def held(path: Path, for_s: float = 0.4) -> bool:
    first = read(path)
    time.sleep(for_s)
    return read(path) == first


@pytest.fixture
def counting(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "n"
    proc = subprocess.Popen([sys.executable, "-c", COUNT, str(path), COUNT])
    try:
        assert moves(path, 20) and moves(Path(str(path) + ".child"), 20)
        yield proc, path
    finally:
        proc.kill()
        proc.wait(10)
        subprocess.run(["pkill", "-f", str(path) + ".child"], check=False)


def test_sigstop_is_ended_by_any_sigcont(counting) -> None:  # type: ignore[no-untyped-def]
    """Why the drills no longer pause with SIGSTOP alone."""
    proc, path = counting
    proc.send_signal(signal.SIGSTOP)
    time.sleep(0.1)
    assert held(path)
    proc.send_signal(signal.SIGCONT)
    assert moves(path)


def test_a_frozen_process_stays_paused_through_sigcont_its_child_runs_on_and_the_thaw_ends_it(counting) -> None:  # type: ignore[no-untyped-def]
    kind = freezer.available()
    if not kind:
        pytest.skip("freezing a process takes root (a cgroup of its own); the drills pause with SIGSTOP here")
    proc, path = counting
    home = Path(f"/proc/{proc.pid}/cgroup").read_text()
    frozen = freezer.Frozen(proc.pid, kind)
    frozen.freeze()
    try:
        assert frozen.frozen() and held(path)
        proc.send_signal(signal.SIGCONT)
        assert held(path), "a SIGCONT woke a frozen process"
        assert moves(Path(str(path) + ".child")), "the frozen process's child is not frozen with it"
    finally:
        frozen.thaw()
    assert moves(path)
    assert not frozen.dir.exists()
    assert Path(f"/proc/{proc.pid}/cgroup").read_text() == home, "back in the cgroups it was in"
