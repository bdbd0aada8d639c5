"""coxswain.proc: a child never outlives the process that started it, even when that process
dies between the fork and the child's ``PR_SET_PDEATHSIG`` (the kernel then sends nothing)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from coxswain.proc import die_with_parent, dies_with_me


def test_a_child_of_this_process_runs() -> None:
    r = subprocess.run(["sh", "-c", "echo ran"], preexec_fn=dies_with_me(), capture_output=True, text=True,
                       timeout=30)
    assert (r.returncode, r.stdout) == (0, "ran\n")


def test_a_child_whose_parent_is_not_the_one_that_forked_it_ends_before_it_runs() -> None:
    """As after the parent's death before the prctl: the child was reparented, so its parent is
    not the pid it was given. It must end, not run its command unwatched."""
    not_the_parent = os.getppid()  # this process's parent, never its child's
    r = subprocess.run(["sh", "-c", "echo ran"], preexec_fn=functools.partial(die_with_parent, not_the_parent),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 128 + signal.SIGTERM and r.stdout == ""


RUNNER = """
import asyncio, sys, tempfile
from pathlib import Path
from cox_runner.workspace import tools
from cox_runner.workspace.sandbox import Sandbox
from coxswain.config import SandboxConfig

sb = Sandbox(SandboxConfig(mode="none"), ".coxswain")
asyncio.run(tools.run_command(Path(sys.argv[1]), "echo $$ > pid; exec sleep 60", 120.0, 1024, sb))
"""


def test_an_unconfined_command_dies_with_its_runner(tmp_path: Path) -> None:
    """``[sandbox] mode = "none"``: the command is still tied to the runner (setpriv's death
    signal, or the spawn's hook without setpriv): a runner killed -9 leaves no command running."""
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path)])
    pid_file = tmp_path / "pid"
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline and runner.poll() is None, "the command did not start"
            time.sleep(0.02)
        pid = int(pid_file.read_text())
        assert Path(f"/proc/{pid}").exists()
    finally:
        runner.kill()
        runner.wait(10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and "Z" not in state(pid):
        assert time.monotonic() < deadline, "the command outlived its runner"
        time.sleep(0.02)


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
